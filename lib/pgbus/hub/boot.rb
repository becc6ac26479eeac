# frozen_string_literal: true

# The master's boot in one file: SharedHub (one native hub per process), Boot (arm, start before
# fork, teardown) and the Puma plugin's body (PumaPlugin: the one place that touches Puma).
require "tmpdir"

module Pgbus
  module Hub
    # The ONE native master hub of this process: every boot (ours, pgbus's
    # MasterHubBoot building its MasterHub) reaches it, so a master never binds two.
    module SharedHub
      @lock = Mutex.new

      class << self
        attr_reader :current

        # The running hub (started unless one runs). Raises what MasterHub#start raises.
        def start(**options)
          @lock.synchronize do
            return @current if @current&.running?

            owner = ::Process.pid
            at_exit { SharedHub.stop if ::Process.pid == owner } unless @at_exit # no teardown hook fired
            @at_exit = true
            @current = MasterHub.new(**options.except(:scope, :source)).start
          end
        end

        # Stops +hub+ (default: the current one) if it is still the current one.
        def stop(hub = @current)
          @lock.synchronize { @current.tap { @current = nil } if hub&.equal?(@current) }&.stop
        end
      end
    end

    # The master side in one place: `arm` (Puma's master, once it knows it runs workers) exports the
    # socket path; right before each fork (Ruby's Process._fork) the hub starts synchronously unless it
    # runs, so no worker forks before it listens; `teardown` disarms and stops it. A hub already answering
    # at the socket path (`pgbus-hub serve`, a sidecar) is used instead: this master starts none.
    module Boot
      @teardowns = []

      class << self
        attr_reader :logger

        # A master's (`pgbus-hub serve`'s: "serve"; a glob's: "*").
        def default_socket_path(pid = ::Process.pid) = File.join(Dir.tmpdir, Hub.socket_name(pid))
        def armed? = @armed_pid == ::Process.pid

        def arm(logger:)
          return if armed?

          @armed_pid = ::Process.pid
          @logger = logger
          @attached = nil
          # DEFAULT_SOCKET_ENV is defined by the extension (ext/pgbus_hub/src/defaults.rs: the core's hub::SOCKET_ENV).
          exported = ENV[DEFAULT_SOCKET_ENV].to_s
          @socket_path = ENV[DEFAULT_SOCKET_ENV] =
            Hub.configuration.socket_path || (exported.empty? ? default_socket_path : exported)
          ::Process.singleton_class.prepend(ForkHook) unless ::Process.singleton_class.include?(ForkHook)
        end

        # In the armed master before every fork; never raises into it. A
        # configuration not there yet (no preload_app!) is looked for again at the next fork.
        # Settings the app made after `arm` (its initializers run later) apply here: a socket_path
        # set since is the one exported, and the :process scope exports none.
        def before_fork
          adopt_socket_path
          return if @attached || SharedHub.current&.running?

          options = Hub.master_options
          return per_process if options && options[:scope].to_s != "master"
          return if attach
          return start(options) if options
          return if @missing_logged

          @missing_logged = true
          @logger&.warn("[pgbus-hub] no hub configuration as workers fork (no preload_app!? configure pgbus or " \
                        "Pgbus::Hub in puma.rb): workers use their own LISTEN connections until a later fork finds one")
        rescue Error, ArgumentError => e # refused (a Proc connection, a bad connection string): not again at every fork
          @armed_pid = nil
          @logger&.error("[pgbus-hub] no master hub: #{e.message} — workers use their own LISTEN connections")
        rescue StandardError => e # e.g. pgbus's configuration raising: logged, retried at the next fork
          @logger&.error("[pgbus-hub] no master hub yet (#{e.class}: #{e.message}) — workers use their own LISTEN connections")
        end

        # Disarms, stops the hub (socket unlinked), runs the registered
        # teardowns; off Puma 5.6's trap context (Mutex#lock raises there), bounded.
        def teardown(why)
          @armed_pid = nil
          Thread.new do
            @logger&.info("[pgbus-hub] #{why}: stopping the master hub") if SharedHub.current
            SharedHub.stop
            @teardowns.each(&:call)
          rescue StandardError => e
            @logger&.warn("[pgbus-hub] teardown raised #{e.class}: #{e.message}")
          end.join(15)
        end

        def on_teardown(&block) = @teardowns << block

        # A setting of the running master hub's changed: it applies when the hub next starts.
        def setting_changed(key)
          return unless ::Process.pid == @armed_pid && SharedHub.current&.running? && key != :logger

          @logger&.error("[pgbus-hub] Pgbus::Hub.configure: #{key} changed while the master hub runs at " \
                         "#{@socket_path}: ignored until it restarts (set it in puma.rb or an initializer " \
                         "preload_app! runs)")
        end

        private

        # Pgbus::Hub.configure's socket_path, when the app set one after `arm` and nothing runs yet.
        def adopt_socket_path
          wanted = Hub.configuration.socket_path
          return if wanted.nil? || wanted == @socket_path || @attached || SharedHub.current&.running?

          @logger&.info("[pgbus-hub] socket_path #{wanted} from Pgbus::Hub.configure (was #{@socket_path})")
          @socket_path = ENV[DEFAULT_SOCKET_ENV] = wanted
        end

        # The :process scope: no hub; nothing exported, so no worker looks for one.
        def per_process
          return unless ENV.delete(DEFAULT_SOCKET_ENV)

          @logger&.info("[pgbus-hub] listen scope :process: no master hub; each worker LISTENs on its own connection")
        end

        # True once a hub of someone else's answers at the socket path: it then
        # serves this master's workers for good (asked before each fork until
        # a hub, that one or this master's own, runs).
        def attach
          stats = Hub.stats(socket_path: @socket_path, timeout: 1.0) or return false
          @logger&.info("[pgbus-hub] a hub already serves #{@socket_path} (pid #{stats[:pid]}): workers use it; " \
                        "this master starts none")
          @attached = true
        rescue HubUnavailableError
          false
        end

        def start(options)
          SharedHub.start(socket_path: @socket_path, logger: @logger, **options)
          @logger&.info("[pgbus-hub] #{options[:source]} configuration: master hub started before fork (pid #{::Process.pid})")
        rescue ArgumentError
          raise # MasterHub.new refused the options: the same at every fork, so before_fork disarms
        rescue StandardError => e # e.g. the socket path taken: may clear, retried at the next fork
          @logger&.error("[pgbus-hub] master hub failed to start (#{e.class}: #{e.message}) — " \
                         "workers fall back to per-worker listeners")
        end
      end

      # Ruby's public fork hook (3.1+): Kernel#fork and Process.fork call it in the parent.
      module ForkHook
        def _fork
          Boot.before_fork if Boot.armed?
          super
        end
      end
    end

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

      # Puma 6.6 to 8.0.2 and its main branch (puma#3677; puma#3940's syswrite, on main after 8.0.2, does
      # not fix it on Ruby 3.3.8: measured, docs/deploys.md): a server stopping can wedge for good in
      # IO#close of its notify pipe, which Ruby (3.3, 3.4) never lets return once the TERM trap's write
      # to that pipe was interrupted by the close (docs/puma-stop-wedge.md).
      # A worker then serves its hijacked sockets until the master kills it at worker_shutdown_timeout
      # (30 s), and a hot restart serves no one meanwhile. As a server stops, a thread watches the
      # server's thread: one that sat SECONDS in IO#close is ended, and the worker exits as Puma means
      # it to (its shutdown hooks, at_exit). A close that returns is never touched.
      # SECONDS is short because every wedged stop costs it (plus up to POLL), and in a hot restart
      # every client waits for it: the stuck close is the server thread's last step (the pipes'
      # close after its graceful shutdown), and a pipe's close otherwise returns at once.
      # It runs on every Puma: none is known to be free of the wedge, and no version would tell one
      # (main reports 8.0.2); where a close returns, it never acts.
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
