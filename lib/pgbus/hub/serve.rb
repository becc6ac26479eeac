# frozen_string_literal: true

module Pgbus
  module Hub
    # `pgbus-hub serve`: the master hub as a foreground process of its own, for
    # a host whatever serves the app (Falcon, Unicorn, several Pumas, a job
    # process): every process that exports PGBUS_STREAMS_HUB_SOCKET=<its socket>
    # shares its one LISTEN connection. Puma's plugin attaches to it instead of
    # starting a hub of its own (Boot#before_fork).
    module Serve
      # Runs until SIGTERM/SIGINT; SIGHUP reopens the log (logrotate's copy-less rotation). The hub
      # writes its log itself (timestamped, to log_path or standard output). Returns the exit status.
      def self.run(socket_path:, log_path:)
        # A pipe, not a Queue: with the log written natively no other Ruby thread runs, and Queue#pop
        # in the only thread is a deadlock to Ruby. Each signal writes its name's first letter.
        signals, trapped = IO.pipe
        %w[TERM INT HUP].each { |signal| trap(signal) { trapped.write_nonblock(signal[0]) } }
        options = Hub.master_options.except(:scope, :source)
        hub = MasterHub.new(socket_path: socket_path, log_file: log_path || "-", **options).start
        $stdout.puts "pgbus-hub serve: listening on #{socket_path} (pid #{::Process.pid})",
                     "export #{DEFAULT_SOCKET_ENV}=#{socket_path}"
        $stdout.flush
        hub.reopen_log while signals.read(1) == "H"
        hub.stop
        0
      end
    end
  end
end
