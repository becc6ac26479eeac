# frozen_string_literal: true

module Pgbus
  module Hub
    # Puma's log (5.6: launcher.events; 6+: launcher.log_writer, with the app's log_formatter) as the logger
    # the hub's threads write to ("SEVERITY message", INFO and up): what they call (`add` with Logger's severities,
    # `info`...) without the stdlib Logger, not a default gem in Ruby 4.0 (a Bundler app without it still boots).
    PumaLog = Struct.new(:writer) do
      def self.logger(launcher) = new(launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events)

      LEVELS = %w[DEBUG INFO WARN ERROR FATAL].freeze

      def add(severity, message = nil, progname = nil)
        label = LEVELS.fetch(severity, "ANY")
        writer.log("#{label} #{message || progname}") unless label == "DEBUG"
        true
      end

      LEVELS.each_with_index { |label, severity| define_method(label.downcase) { |message| add(severity, message) } }
    end

    # The one place that touches Puma, through its public plugin API (5.6 to 8): the body of
    # `plugin :pgbus_hub` / `plugin :pgbus_streams`. In the master, once Puma knows it runs workers,
    # arm the boot (the hub then starts right before the first fork); stop it on stop and before a
    # hot restart's exec.
    module PumaPlugin
      def config(dsl)
        PumaPlugin.hook(dsl, :before_restart, :on_restart) { Boot.teardown("hot restart") }
      end

      def start(launcher)
        log = PumaLog.logger(launcher)
        if launcher.options[:workers].to_i.positive?
          Boot.arm(logger: log)
        else
          log.info("[pgbus-hub] single mode: no master hub; the process uses its own listener")
        end
        PumaPlugin.hook(launcher.events, :after_stopped, :on_stopped) { Boot.teardown("stop") }
        StuckClose.watch(launcher.events, log)
      end

      # Puma 7 renamed the hooks (the old names warn, 7.0.0 lacked them).
      def self.hook(target, modern, legacy, &block)
        target.public_send(target.respond_to?(modern) ? modern : legacy, &block)
      end

      # Puma up to 8.0.2 (puma#3677; fixed on its main branch by puma#3940, in no release yet): a server
      # stopping can wedge for good in IO#close of its notify pipe, which Ruby (3.3, 3.4) never lets
      # return once the TERM trap's write to that pipe was interrupted by the close (docs/puma-stop-wedge.md).
      # A worker then serves its hijacked sockets until the master kills it at worker_shutdown_timeout
      # (30 s), and a hot restart serves no one meanwhile. As a server stops, a thread watches the
      # server's thread: one that sat SECONDS in IO#close is ended, and the worker exits as Puma means
      # it to (its shutdown hooks, at_exit). A close that returns is never touched.
      # SECONDS is short because every wedged stop costs it (plus up to POLL), and in a hot restart
      # every client waits for it: the stuck close is the server thread's last step (the pipes'
      # close after its graceful shutdown), and a pipe's close otherwise returns at once.
      module StuckClose
        SECONDS = 0.5
        POLL = 0.1

        # Puma's generic Events#register (5.6 to 8): the server fires :state on its own thread.
        def self.watch(events, log)
          return unless events.respond_to?(:register)

          events.register(:state) do |state|
            next unless %i[stop restart].include?(state)

            server = Thread.current
            Thread.new { watch_thread(server, log) }.tap { |t| t.name = "pgbus-hub stop watch" }
          end
        end

        # Bounded by the server thread's life.
        def self.watch_thread(server, log)
          since = nil
          while server.alive?
            sleep POLL
            top = server.backtrace_locations(0, 1)&.first
            next since = nil unless top&.base_label == "close"

            since ||= ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
            next if ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - since < SECONDS

            log.warn("[pgbus-hub] Puma's server thread sat #{SECONDS} s in IO#close at #{top.path}:#{top.lineno} " \
                     "as it stopped (puma#3677): ended, so this process exits now rather than when Puma kills it")
            server.kill
            break
          end
        rescue StandardError => e
          log.warn("[pgbus-hub] stop watch raised #{e.class}: #{e.message}")
        end
      end

      # Code preloaded by a Puma cluster master (Puma's public cli_config;
      # with preload_app!, app code runs in the master only).
      def self.preloading_cluster_master?
        options = defined?(::Puma.cli_config) && ::Puma.cli_config&.options
        !!(options && options[:workers].to_i.positive? && options[:preload_app])
      rescue StandardError # Puma 7+: options before clamp
        false
      end
    end
  end
end
