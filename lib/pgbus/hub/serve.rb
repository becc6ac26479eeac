# frozen_string_literal: true

module Pgbus
  module Hub
    # `pgbus-hub serve`: the master hub as a foreground process of its own, for
    # a host whatever serves the app (Falcon, Unicorn, several Pumas, a job
    # process): every process that exports PGBUS_STREAMS_HUB_SOCKET=<its socket>
    # shares its one LISTEN connection. Puma's plugin attaches to it instead of
    # starting a hub of its own (Boot#before_fork).
    module Serve

      # "2026-12-04T23:59:01.123Z INFO [pgbus-hub] ..." lines on an IO that
      # SIGHUP reopens (logrotate's copy-less rotation).
      class LogFile
        def initialize(path)
          @path = path
          @io = path ? File.open(path, "a") : $stdout
          @io.sync = true
        end

        def log(line) = @io.puts("#{Time.now.utc.strftime('%Y-%m-%dT%H:%M:%S.%LZ')} #{line}")

        def reopen
          @io.reopen(@path, "a") if @path
          @io.sync = true
        end
      end

      # Runs until SIGTERM/SIGINT; returns the exit status (0 after a clean stop).
      def self.run(socket_path:, log_path:)
        log_file = LogFile.new(log_path)
        logger = PumaLog.new(log_file)
        signals = Queue.new
        %w[TERM INT HUP].each { |signal| trap(signal) { signals << signal } }
        options = Hub.master_options.except(:scope, :source)
        hub = MasterHub.new(socket_path: socket_path, logger: logger, **options).start
        logger.info("[pgbus-hub] serving #{socket_path} (pid #{::Process.pid})")
        $stdout.puts "pgbus-hub serve: listening on #{socket_path} (pid #{::Process.pid})"
        $stdout.puts "export #{DEFAULT_SOCKET_ENV}=#{socket_path}"
        $stdout.flush
        loop do
          case signals.pop
          when "HUP" then log_file.reopen.then { logger.info("[pgbus-hub] log reopened") }
          else break
          end
        end
        logger.info("[pgbus-hub] stopping: socket removed, workers fall back to their own connections")
        hub.stop
        0
      end
    end
  end
end
