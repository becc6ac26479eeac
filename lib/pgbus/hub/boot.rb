# frozen_string_literal: true

require "tmpdir"
require "logger"

module Pgbus
  module Hub
    # What a master hub needs, whoever configured it (pgbus or Pgbus::Hub.configure).
    Settings = Struct.new(:scope, :connection, :health_check_ms, :channel_prefix, :channel_suffix, :source,
                          keyword_init: true)

    # The ONE native master hub of this process. Every boot path (our Boot,
    # pgbus's #382 MasterHubBoot building the prepended MasterHub, the
    # preload-time auto boot) goes through here, so two boot objects in one
    # master can never bind two hubs.
    module SharedHub
      @lock = Mutex.new
      @hub = nil
      @at_exit = false

      class << self
        def current
          @hub
        end

        # Returns the running hub (starting it if none runs). Raises what
        # MasterHub#start raises.
        def start(socket_path:, settings:, logger: nil)
          @lock.synchronize do
            if @hub&.running?
              if @hub.socket_path != socket_path
                logger&.warn("[pgbus-hub] a master hub already serves #{@hub.socket_path}; not starting another at #{socket_path}")
              end
              return @hub
            end

            hub = MasterHub.new(connection: settings.connection, socket_path: socket_path,
                                health_check_ms: settings.health_check_ms,
                                channel_prefix: settings.channel_prefix, channel_suffix: settings.channel_suffix,
                                logger: logger)
            hub.start
            @hub = hub
            install_at_exit
            hub
          end
        end

        # Stops +hub+ (default: the current one) if it is still the current one.
        def stop(hub = nil)
          target = @lock.synchronize do
            next nil if @hub.nil? || (hub && !hub.equal?(@hub))

            current = @hub
            @hub = nil
            current
          end
          target&.stop
          target
        end

        private

        # A master that exits without a teardown hook firing (e.g. pgbus's own
        # plugin registered hooks this Puma never fires) still unlinks its socket.
        # MasterHub#stop is inert in forked children, which inherit this handler.
        def install_at_exit
          return if @at_exit

          @at_exit = true
          owner = ::Process.pid
          at_exit { SharedHub.stop if ::Process.pid == owner }
        end
      end
    end

    # Our MasterHubBoot (pgbus's semantics): export the socket path before fork,
    # poll until the configuration is ready, then start the native hub when the
    # scope is :master. Cluster-mode only — the caller (the Puma plugin) decides.
    class Boot
      ENV_KEY = DEFAULT_SOCKET_ENV

      class << self
        attr_accessor :current

        # pgbus's path: pgbus's own MasterHubBoot (if it also runs in this
        # master) exports the very same value, so ENV always names the one hub.
        def default_socket_path(pid = ::Process.pid)
          File.join(Dir.tmpdir, Hub.socket_name(pid))
        end

        def env_seconds(name, default)
          value = ENV.fetch(name, nil)
          return default if value.nil? || value.strip.empty?

          Float(value).then { |f| f.positive? ? f : default }
        rescue ArgumentError
          default
        end

        # The Settings of whichever configuration is in charge, or nil while
        # it is not ready (pgbus: streams_enabled and connection options a
        # String or Hash; standalone: Pgbus::Hub.configure ran with a connection).
        #
        # Off the main thread (the poller), pgbus's configuration is read only
        # once the app has run Pgbus.configure: reading it earlier, while the app
        # is still loading, can create it before (and instead of) the app's own.
        def resolve_settings
          return Pgbus::Hub.configuration.to_settings if Pgbus::Hub.respond_to?(:configured?) && Pgbus::Hub.configured?
          return nil unless defined?(PgbusIntegration) && PgbusIntegration.pgbus?
          return nil unless Thread.current.equal?(Thread.main) || PgbusIntegration.app_configured?

          PgbusIntegration.settings
        rescue Pgbus::Hub::Error
          raise # a configuration the hub refuses: not "not ready yet"
        rescue StandardError
          nil
        end
      end

      attr_reader :socket_path, :hub

      def initialize(socket_path: self.class.default_socket_path, settings: nil,
                     poll_interval: self.class.env_seconds("PGBUS_HUB_BOOT_POLL", 1.0),
                     deadline: self.class.env_seconds("PGBUS_HUB_BOOT_DEADLINE", 120.0), logger: nil)
        @socket_path = socket_path
        @owner_pid = ::Process.pid # a Boot inherited by a forked worker never starts a hub there
        @settings = settings || -> { self.class.resolve_settings }
        @poll_interval = poll_interval
        @deadline = deadline
        @logger = logger
        @lock = Mutex.new
        @boot_lock = Mutex.new # the poller and the before_fork hook may both find the configuration ready
        @cond = ConditionVariable.new
        @running = false
        @hub = nil
        @poller = nil
      end

      def start
        @lock.synchronize do
          return self if @running

          @running = true
        end
        ENV[ENV_KEY] = @socket_path
        self.class.current = self
        @poller = Thread.new do
          Thread.current.report_on_exception = false
          poll
        end
        @poller.name = "pgbus-hub boot"
        @poller.thread_variable_set(:fork_safe, true) # master-only; Puma 7+'s preload thread check
        self
      end

      def running?
        @running
      end

      # The master's before_fork hook: Puma runs it after preload_app! and
      # before the first fork, when the configuration is normally complete, so
      # the hub binds here and no worker ever starts before it. The poller
      # stays only for a configuration that arrives later.
      def boot_before_fork
        refusal = nil
        settings = ready_settings(refusal: ->(error) { refusal = error })
        return boot_hub(settings) if settings
        if refusal
          return @logger&.error("[pgbus-hub] no master hub: #{refusal.message} — workers use their own LISTEN connections")
        end

        warn_not_ready
      end

      # Right after the app's Pgbus.configure (main thread, still before fork).
      def boot_when_configured
        return unless ::Process.pid == @owner_pid

        settings = ready_settings
        boot_hub(settings) if settings
      end

      # Stops the poller and the hub. ENV stays exported (pgbus's semantics).
      def stop
        hub = @lock.synchronize do
          @running = false
          @cond.broadcast
          taken = @hub
          @hub = nil
          taken
        end
        @poller&.join(2) unless Thread.current.equal?(@poller)
        @poller = nil
        SharedHub.stop(hub) if hub
        self.class.current = nil if self.class.current.equal?(self)
        self
      end

      private

      def warn_not_ready
        @logger&.warn("[pgbus-hub] no hub configuration yet as workers fork (no preload_app!?): waiting up to " \
                      "#{format_seconds(@deadline)}s; until it starts, workers use their own LISTEN connections")
      end

      def poll
        started = monotonic
        loop do
          PgbusIntegration.install! if defined?(PgbusIntegration)
          settings = ready_settings
          return boot_hub(settings) if settings
          return unless wait_tick

          next unless monotonic - started >= @deadline

          @logger&.info("[pgbus-hub] configuration never became ready within #{format_seconds(@deadline)}s " \
                        "(no preload_app!?) — no master hub; workers use per-worker listeners")
          return
        end
      end

      # nil while the configuration is not ready. A refused one (Pgbus::Hub::Error)
      # is reported only when `refusal` is given: while the app is still loading,
      # pgbus may briefly hand out a fallback (a Proc) that is replaced later.
      def ready_settings(refusal: nil)
        @settings.call
      rescue Pgbus::Hub::Error => e
        refusal&.call(e)
        nil
      rescue StandardError
        nil
      end

      # false once stop ran
      def wait_tick
        @lock.synchronize do
          @cond.wait(@lock, @poll_interval) if @running
          @running
        end
      end

      def boot_hub(settings)
        @boot_lock.synchronize do
          return if @hub || settings.scope.to_s != "master"

          hub = SharedHub.start(socket_path: @socket_path, settings: settings, logger: @logger)
          late = @lock.synchronize do
            @hub = hub if @running
            !@running
          end
          if late
            SharedHub.stop(hub)
          else
            @logger&.info("[pgbus-hub] master hub listening at #{@socket_path} (native, #{settings.source}, pid #{::Process.pid})")
          end
        end
      rescue StandardError => e
        @logger&.error("[pgbus-hub] master hub failed to start (#{e.class}: #{e.message}) — " \
                       "workers fall back to per-worker listeners")
      end

      def monotonic
        ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
      end

      def format_seconds(value)
        value == value.to_i ? value.to_i : value
      end
    end

    # Logger-compatible writer over Puma's log (5.6: launcher.events; 6+: launcher.log_writer).
    class PumaLog
      SEVERITIES = %w[DEBUG INFO WARN ERROR FATAL ANY].freeze

      def initialize(launcher, level: ::Logger::INFO)
        @writer = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
        @level = level
      end

      def add(severity, message = nil, progname = nil)
        severity ||= ::Logger::UNKNOWN
        return true if severity < @level

        message = yield if message.nil? && block_given?
        message ||= progname
        @writer.log("#{SEVERITIES.fetch(severity, 'ANY')} #{message}")
        true
      rescue StandardError
        true
      end

      %w[debug info warn error fatal].each_with_index do |name, severity|
        define_method(name) { |message = nil, &block| add(severity, message, &block) }
      end
    end

    # The body of our Puma plugins (`plugin :pgbus_streams`, `plugin :pgbus_hub`).
    # Works on Puma 5.6 (tested), 6 and 7 (hook names guarded).
    module PumaPlugin
      # pgbus's own lib/puma/plugin/pgbus_streams.rb if it is on $LOAD_PATH
      # besides ours (nil otherwise).
      def self.pgbus_plugin_file(own_file)
        ours = File.realpath(File.join(File.dirname(own_file), "pgbus_streams.rb"))
        $LOAD_PATH.each do |dir|
          candidate = File.join(dir.to_s, "puma", "plugin", "pgbus_streams.rb")
          next unless File.file?(candidate)

          real = File.realpath(candidate)
          return real unless real == ours
        end
        nil
      end

      # Loads pgbus's plugin file (it registers itself as "pgbus_streams"),
      # returns its class so ours can run it. Must be called before our
      # Puma::Plugin.create so our registration is the one Puma keeps.
      def self.load_pgbus_plugin(own_file)
        file = pgbus_plugin_file(own_file)
        return nil unless file

        registry = ::Puma::Plugins
        before = registry.instance_variable_get(:@plugins)&.[]("pgbus_streams")
        require file
        klass = registry.instance_variable_get(:@plugins)&.[]("pgbus_streams")
        klass unless klass.nil? || klass.equal?(before) || klass.include?(PumaPlugin)
      rescue StandardError, LoadError => e
        warn "[pgbus-hub] could not load pgbus's pgbus_streams plugin (#{file}): #{e.class}: #{e.message}"
        nil
      end

      def self.included(base)
        base.extend(ClassMethods)
      end

      module ClassMethods
        attr_accessor :composed_class
      end

      # All pgbus-hub plugin instances of this process share one teardown.
      @instances = []
      class << self
        attr_reader :instances
      end

      def config(dsl)
        plugin = self
        on_hook(dsl, :before_restart, :on_restart) { plugin.teardown("hot restart") } # DSL restart hooks: USR2 only
        dsl.before_fork do
          Pgbus::Hub::PgbusIntegration.install!
          Pgbus::Hub::Boot.current&.boot_before_fork
        end
        on_hook(dsl, :before_worker_boot, :on_worker_boot) { Pgbus::Hub::PgbusIntegration.install! }
        composed&.config(dsl) if composed.respond_to?(:config)
      end

      def start(launcher)
        @launcher = launcher
        @log = PumaLog.new(launcher)
        PumaPlugin.instances << self
        Pgbus::Hub::PgbusIntegration.install!
        safely("pgbus's pgbus_streams plugin start") { composed&.start(launcher) }
        boot_hub(launcher)
        events = launcher.events
        stopped = events.respond_to?(:after_stopped) ? :after_stopped : :on_stopped
        events.public_send(stopped) { teardown("stop") }
      end

      # Puma 5.6 fires on_stopped from its SIGTERM trap, where Mutex#lock
      # raises: teardown work runs on a fresh thread and is joined (bounded).
      def self.off_trap(timeout = 15, &block)
        thread = Thread.new(&block)
        thread.report_on_exception = false
        thread.join(timeout)
      end

      # Stop the hub (socket unlinked) and run pgbus's streamer teardown.
      # Idempotent and safe to call from several plugin instances.
      def teardown(why)
        PumaPlugin.off_trap { teardown!(why) }
      end

      def teardown!(why)
        boot = Pgbus::Hub::Boot.current
        if boot || Pgbus::Hub::SharedHub.current
          @log&.info("[pgbus-hub] #{why}: stopping the master hub")
          boot&.stop
          Pgbus::Hub::SharedHub.stop
        end
        safely("Pgbus::Web::Streamer.reset!") do
          ::Pgbus::Web::Streamer.reset! if defined?(::Pgbus::Web::Streamer) && ::Pgbus::Web::Streamer.respond_to?(:reset!)
        end
      end

      private

      def composed
        return @composed if defined?(@composed)

        klass = self.class.composed_class
        @composed = klass&.new
      end

      def boot_hub(launcher)
        return @log.info("[pgbus-hub] single mode: no master hub; the process uses its own listener") unless cluster?(launcher)
        return if Pgbus::Hub::Boot.current&.running?

        Pgbus::Hub::Boot.new(logger: @log).start
      rescue StandardError => e
        @log.error("[pgbus-hub] boot failed: #{e.class}: #{e.message}")
      end

      def cluster?(launcher)
        launcher.options[:workers].to_i.positive?
      rescue StandardError
        false
      end

      def on_hook(dsl, modern, legacy, &block)
        dsl.public_send(dsl.respond_to?(modern) ? modern : legacy, &block)
      end

      def safely(what)
        yield
      rescue StandardError => e
        (@log || Kernel).warn("[pgbus-hub] #{what} raised #{e.class}: #{e.message}")
      end
    end
  end
end
