# frozen_string_literal: true

require_relative "boot"
require_relative "standalone"

module Pgbus
  module Hub
    # The pgbus glue. Everything is installed with Module#prepend onto pgbus's
    # own classes (never by redefining constants), so zeitwerk autoloading and
    # eager loading of pgbus keep working:
    # - pre-#382 pgbus: Configuration#streams_listen_scope (+ validation),
    #   Instance wiring (hub vs per-worker listener), the doctor's streams clause;
    # - #382 pgbus: Instance#build_hub_listener builds OUR HubClient +
    #   FailoverListener, and pgbus's MasterHub is backed by our native hub (so
    #   pgbus's own MasterHubBoot, if its plugin file won, runs ours).
    # install! is idempotent and cheap; it runs when pgbus-hub is required,
    # when our Puma plugin starts, before fork and on worker boot.
    module PgbusIntegration
      PLAN_KEY = :__pgbus_hub_listener_plan
      SCOPE_HINT = "Must be :master (one shared LISTEN connection per web host) or :process (one per worker)"
      STREAMS_PROCESS_CLAUSE = " + 1 per web-server process (streams)"
      STREAMS_MASTER_CLAUSE = " + 1 per web host (streams master hub; per-worker fallback during a hub outage " \
                              "costs 1 per web process)"

      @lock = Mutex.new
      @installed = []

      class << self
        attr_reader :installed

        # pgbus itself is loaded (its Pgbus.configuration, not just our hook).
        def pgbus?
          method = ::Pgbus.method(:configuration)
          method = method.super_method if method.owner == ConfigureHook
          !method.nil?
        rescue NameError
          false
        end

        # ConfigureHook's entry: the first Pgbus.configure/configuration call
        # after pgbus-hub loaded installs the glue (once; it is cheap to ask).
        def install_on_first_use
          return if @first_use_seen

          @first_use_seen = true
          install!
        end

        # The app ran Pgbus.configure: its configuration may be read from any
        # thread now, and a Boot waiting for it (Puma master, preload) starts
        # the hub at once, before any worker forks.
        def app_configured!
          @app_configured = true
          Boot.current&.boot_when_configured
        end

        def app_configured?
          @app_configured == true
        end

        def install!
          return false unless pgbus?

          @lock.synchronize do
            install_configuration
            install_doctor
            install_instance
            install_master_hub
          end
          auto_boot!
          true
        rescue StandardError => e
          warn "[pgbus-hub] pgbus integration failed: #{e.class}: #{e.message}" unless @warned
          @warned = true
          false
        end

        # Settings for the master hub from pgbus's configuration, nil until ready.
        def settings(config = ::Pgbus.configuration)
          return nil unless config.respond_to?(:streams_enabled) && config.streams_enabled

          connection = config.streams_connection_options
          unless connection.is_a?(String) || connection.is_a?(Hash)
            # pgbus's own streamer refuses these too (a Proc is a shared ActiveRecord connection).
            raise Pgbus::Hub::Error, "pgbus's streams_connection_options is a #{connection.class}; the hub needs a " \
                                     "libpq String (URL or keywords) or a Hash (set streams_database_url or database_url)"
          end

          Settings.new(scope: scope_of(config), connection: connection, health_check_ms: health_check_ms(config),
                       channel_prefix: channel_affix(:CHANNEL_PREFIX, Hub::DEFAULTS[:channel_prefix]),
                       channel_suffix: channel_affix(:CHANNEL_SUFFIX, Hub::DEFAULTS[:channel_suffix]), source: "pgbus")
        end

        def scope_of(config)
          config.respond_to?(:streams_listen_scope) ? config.streams_listen_scope : :master
        end

        def health_check_ms(config)
          value = config.respond_to?(:streams_listen_health_check_ms) ? config.streams_listen_health_check_ms : nil
          value.is_a?(Integer) && value.positive? ? value : Hub::DEFAULTS[:health_check_ms]
        end

        # nil, or a not-yet-complete plan for a pre-#382 Instance (see LegacyInstance).
        def legacy_plan(instance, config, dispatch_queue, logger)
          plan = LegacyPlan.new
          local = lambda do
            kwargs = plan.listener_kwargs || {}
            listener_class.new(**kwargs, pg_connection: instance.send(:build_pg_connection)).tap(&:start)
          end
          plan.listener = Pgbus::Hub.hub_listener(scope: scope_of(config), health_check_ms: health_check_ms(config),
                                                  dispatch_queue: dispatch_queue, local_factory: local, logger: logger)
          plan.listener && plan
        end

        def const(path)
          path.split("::").reject(&:empty?).inject(Object) do |mod, name|
            return nil unless mod.is_a?(Module) && mod.const_defined?(name, false)

            mod.const_get(name, false)
          end
        rescue NameError, LoadError
          nil
        end

        def listener_class
          const("Pgbus::Web::Streamer::Listener")
        end

        private

        def channel_affix(name, default)
          listener = listener_class
          value = listener&.const_defined?(name, false) ? listener.const_get(name, false) : nil
          value.is_a?(String) ? value : default
        end

        def mark(part)
          return false if @installed.include?(part)

          @installed << part
          true
        end

        def install_configuration
          klass = const("Pgbus::Configuration")
          return unless klass && !klass.method_defined?(:streams_listen_scope) && mark(:configuration)

          klass.const_set(:VALID_STREAMS_LISTEN_SCOPES, %i[master process].freeze) unless
            klass.const_defined?(:VALID_STREAMS_LISTEN_SCOPES, false)
          klass.prepend(ConfigurationScope)
        end

        def install_doctor
          check = const("Pgbus::Doctor::Check")
          doctor = const("Pgbus::Doctor")
          return unless check && doctor
          return if doctor.method_defined?(:streams_budget_clause) || doctor.private_method_defined?(:streams_budget_clause)
          return unless mark(:doctor)

          check.singleton_class.prepend(DoctorBudget)
        end

        def install_instance
          instance = const("Pgbus::Web::Streamer::Instance")
          return unless instance

          if instance.private_method_defined?(:build_hub_listener) || instance.method_defined?(:build_hub_listener)
            instance.prepend(HubInstance) if mark(:instance_382)
          elsif (listener = listener_class) && mark(:instance_legacy)
            instance.prepend(LegacyInstance)
            listener.singleton_class.prepend(LegacyListenerNew)
          end
        end

        def install_master_hub
          klass = const("Pgbus::Web::Streamer::MasterHub")
          klass.prepend(MasterHubSwap) if klass && mark(:master_hub)
        end

        # pgbus's own pgbus_streams.rb won the $LOAD_PATH, so ours never ran.
        # While the app is preloaded in the Puma master (preload_app! => this
        # is the master, before fork): register our teardown (Puma 5.6/6 never
        # fire the :after_stopped/:before_restart keys pgbus registers) and start
        # our Boot. A #382 pgbus's MasterHubBoot, when its plugin started one,
        # builds the same hub (MasterHubSwap -> SharedHub).
        def auto_boot!
          return if @auto_booted || Boot.current || !defined?(::Puma::Cluster) || !defined?(::Puma::Plugins)

          plugins = ::Puma::Plugins.instance_variable_get(:@plugins) || {}
          pgbus_plugin = plugins["pgbus_streams"]
          return if pgbus_plugin.nil? || pgbus_plugin.include?(PumaPlugin) || plugins.key?("pgbus_hub")

          runner = ::Puma.instance_variable_get(:@get_stats)
          return unless runner.is_a?(::Puma::Cluster)

          options = runner.instance_variable_get(:@options)
          return unless options && options[:preload_app] && options[:workers].to_i.positive?

          @auto_booted = true
          launcher = runner.instance_variable_get(:@launcher)
          logger = launcher ? PumaLog.new(launcher) : nil
          register_teardown(launcher, logger) if launcher
          # Booted even for a #382 pgbus: its plugin starts MasterHubBoot only if
          # pgbus was loaded before the plugin started (puma.rb required it), and
          # if it did, both boots reach the one SharedHub.
          logger&.info("[pgbus-hub] pgbus's own pgbus_streams plugin is loaded (not ours): booting the master hub at preload")
          Boot.new(logger: logger).start
        rescue StandardError => e
          warn "[pgbus-hub] auto boot failed: #{e.class}: #{e.message}"
        end

        def register_teardown(launcher, logger)
          events = launcher.events
          teardown = ->(why) { PumaPlugin.off_trap { teardown!(why, logger) } }
          events.public_send(events.respond_to?(:after_stopped) ? :after_stopped : :on_stopped) { teardown.call("stop") }
          # Events restart also fires on a phased restart, but preload_app! (required
          # here) turns USR1 into a hot restart, so this only ever runs before exec.
          events.public_send(events.respond_to?(:before_restart) ? :before_restart : :on_restart) { teardown.call("restart") }
        end

        def teardown!(why, logger)
          begin
            logger&.info("[pgbus-hub] #{why}: stopping the master hub")
            Boot.current&.stop
            SharedHub.stop
            ::Pgbus::Web::Streamer.reset! if const("Pgbus::Web::Streamer")&.respond_to?(:reset!)
          rescue StandardError => e
            logger&.warn("[pgbus-hub] teardown raised #{e.class}: #{e.message}")
          end
        end
      end

      # pgbus-hub is often loaded BEFORE pgbus (our Puma plugin file requires it
      # from puma.rb; Gemfile order), so requiring pgbus-hub cannot install the
      # glue. Prepended to Pgbus's singleton class, this runs it at the app's first
      # Pgbus.configure / Pgbus.configuration, before a pre-#382 pgbus's
      # initializer sets streams_listen_scope.
      module ConfigureHook
        def configure(...)
          PgbusIntegration.install_on_first_use
          result = super
          PgbusIntegration.app_configured!
          result
        end

        def configuration(...)
          PgbusIntegration.install_on_first_use
          super
        end
      end

      LegacyPlan = Struct.new(:listener, :listener_kwargs)

      # pre-#382 pgbus: the config attribute with 0.13.1's exact validation.
      module ConfigurationScope
        def streams_listen_scope
          (defined?(@streams_listen_scope) && @streams_listen_scope) || :master
        end

        def streams_listen_scope=(scope)
          error = defined?(::Pgbus::ConfigurationError) ? ::Pgbus::ConfigurationError : ArgumentError
          coerced = case scope
                    when Symbol then scope
                    when String then scope.to_sym
                    else raise error, "Invalid streams_listen_scope type: #{scope.class}. #{SCOPE_HINT}"
                    end
          raise error, "Invalid streams_listen_scope: #{coerced.inspect}. #{SCOPE_HINT}" unless
            %i[master process].include?(coerced)

          @streams_listen_scope = coerced
        end
      end

      # pre-#382 doctor: the "Connection budget" streams clause per scope.
      module DoctorBudget
        def new(*args, **kwargs, &block)
          super(*args, **DoctorBudget.rewrite(kwargs), &block)
        end

        def self.rewrite(kwargs)
          detail = kwargs[:detail]
          return kwargs unless kwargs[:name] == "Connection budget" && detail.is_a?(String) &&
                               detail.end_with?(STREAMS_PROCESS_CLAUSE) &&
                               PgbusIntegration.scope_of(::Pgbus.configuration) == :master

          kwargs.merge(detail: detail.delete_suffix(STREAMS_PROCESS_CLAUSE) + STREAMS_MASTER_CLAUSE)
        rescue StandardError
          kwargs
        end
      end

      # #382 pgbus: its Instance asks here for the hub listener; we build the
      # native HubClient + our FailoverListener; the fallback is pgbus's own
      # per-worker Listener, built by pgbus's own private methods.
      module HubInstance
        private

        def build_hub_listener(connection_factory)
          Pgbus::Hub.hub_listener(
            scope: PgbusIntegration.scope_of(@config),
            health_check_ms: PgbusIntegration.health_check_ms(@config),
            dispatch_queue: @dispatch_queue, logger: @logger,
            local_factory: -> { build_local_listener(build_pg_connection, connection_factory).tap(&:start) }
          )
        end
      end

      # pre-#382 pgbus: Instance#initialize built a per-worker Listener (and
      # its PG connection) unconditionally. In hub mode, while super runs, we
      # skip the connection and hand our FailoverListener out of Listener.new;
      # the kwargs pgbus passed there are kept for the failover's local Listener.
      module LegacyInstance
        def initialize(*args, **kwargs, &block)
          return super unless kwargs[:pg_connection].nil?

          config = kwargs.fetch(:config) { ::Pgbus.configuration }
          logger = kwargs.fetch(:logger) { ::Pgbus.respond_to?(:logger) ? ::Pgbus.logger : nil }
          kwargs[:dispatch_queue] ||= Queue.new
          plan = PgbusIntegration.legacy_plan(self, config, kwargs[:dispatch_queue], logger)
          return super(*args, **kwargs, &block) unless plan

          Thread.current[PLAN_KEY] = plan
          begin
            super(*args, **kwargs, &block)
          ensure
            Thread.current[PLAN_KEY] = nil
          end
        end

        private

        def build_pg_connection(*args)
          return nil if Thread.current[PLAN_KEY]

          super
        end
      end

      module LegacyListenerNew
        def new(*args, **kwargs, &block)
          plan = Thread.current[PLAN_KEY]
          return super if plan.nil? || plan.listener_kwargs

          plan.listener_kwargs = kwargs.reject { |key, _| key == :pg_connection }
          plan.listener
        end
      end

      # #382 pgbus: pgbus's MasterHub, as built by pgbus's MasterHubBoot
      # (MasterHub.new(config:, socket_path:)), is backed by the native hub.
      module MasterHubSwap
        def initialize(config: ::Pgbus.configuration, socket_path:, logger: nil, **_ruby_hub_tuning)
          @pgbus_hub_config = config
          @pgbus_hub_socket_path = socket_path
          @pgbus_hub_logger = logger || (::Pgbus.respond_to?(:logger) ? ::Pgbus.logger : nil)
          @pgbus_hub_native = nil
        end

        def start
          settings = PgbusIntegration.settings(@pgbus_hub_config)
          raise Pgbus::Hub::Error, "pgbus streams configuration is not ready" unless settings

          @pgbus_hub_native = SharedHub.start(socket_path: @pgbus_hub_socket_path, settings: settings,
                                              logger: @pgbus_hub_logger)
          self
        end

        def stop
          SharedHub.stop(@pgbus_hub_native) if @pgbus_hub_native
          self
        end

        def socket_path
          @pgbus_hub_socket_path
        end

        def native_hub
          @pgbus_hub_native
        end

        def stats
          @pgbus_hub_native&.stats || {}
        end

        def dropped_durable_wakes
          stats.fetch(:dropped_durable_wakes, 0)
        end

        def evicted_workers
          stats.fetch(:evicted_workers, 0)
        end
      end
    end
  end
end

Pgbus.singleton_class.prepend(Pgbus::Hub::PgbusIntegration::ConfigureHook)
Pgbus::Hub::PgbusIntegration.install!
