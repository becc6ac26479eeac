# frozen_string_literal: true

module Pgbus
  module Hub
    # The pgbus glue, chosen once by pgbus's shape, through pgbus's public
    # constructors and configuration (prepended: zeitwerk and eager loading keep working).
    # pgbus 0.13.1+: its HubClient.new and MasterHub.new build ours; its own
    # Instance, FailoverListener and MasterHubBoot do the rest. Older pgbus:
    # the streams_listen_scope setting, and Listener.new hands out our FailoverListener.
    module PgbusAdapter
      class << self
        attr_reader :shape

        # Idempotent: at require and at pgbus's first configuration. A pgbus whose classes lack what
        # the glue uses (PgbusSurface::NEEDS) is left as it is, with one logged error.
        def install!
          return nil unless ::Pgbus.method(:configuration).super_method

          @shape ||= install_shape(defined?(::Pgbus::Web::Streamer::HubClient) ? :hub_era : :pre_hub)
          arm_under_pgbus_plugin if installed?
          @shape
        rescue StandardError => e
          @shape = :failed
          warn "[pgbus-hub] pgbus integration failed: #{e.class}: #{e.message}"
        end

        def installed? = %i[hub_era pre_hub].include?(@shape)

        # The master hub's options from pgbus's configuration, nil until streams are enabled.
        def master_options(config = (::Pgbus.configuration if installed?))
          return nil unless config.respond_to?(:streams_enabled) && config.streams_enabled

          connection = config.streams_connection_options
          unless connection.is_a?(String) || connection.is_a?(Hash) # pgbus's streamer refuses these too
            raise Error, "pgbus's streams_connection_options is a #{connection.class}; the hub needs a libpq " \
                         "String (URL or keywords) or a Hash (set streams_database_url or database_url)"
          end

          listener = ::Pgbus::Web::Streamer::Listener
          health_check_ms = config.streams_listen_health_check_ms # pgbus's Listener ignores an invalid one too
          health_check_ms = DEFAULTS[:health_check_ms] unless health_check_ms.is_a?(Integer) && health_check_ms > 0
          Hub.configuration.master_options(
            scope: config.respond_to?(:streams_listen_scope) ? config.streams_listen_scope : :master,
            source: "pgbus", connection: connection, health_check_ms: health_check_ms,
            channel_prefix: listener::CHANNEL_PREFIX, channel_suffix: listener::CHANNEL_SUFFIX
          )
        end

        # master_options, or nil where pgbus's own classes serve a worker: streams off, or a
        # connection the hub cannot use (a Proc: pgbus's streamer refuses it too, and says why).
        def worker_options
          master_options
        rescue Error
          nil
        end

        private

        def install_shape(shape)
          missing = PgbusSurface.missing(shape)
          return send(:"install_#{shape}") if missing.empty?

          version = defined?(::Pgbus::VERSION) ? ::Pgbus::VERSION : "(no Pgbus::VERSION)"
          ::Pgbus.logger.error("[pgbus-hub] pgbus #{version} is not the shape pgbus-hub #{VERSION} supports " \
                               "(pgbus #{PgbusSurface::SUPPORTED}): it lacks #{missing.join(', ')}. pgbus-hub " \
                               "leaves pgbus's own streams as they are (no shared hub for pgbus)")
          :unsupported
        end

        def install_hub_era
          streamer = ::Pgbus::Web::Streamer
          streamer::HubClient.singleton_class.prepend(PgbusHubClient)
          streamer::MasterHub.singleton_class.prepend(PgbusMasterHub::New)
          Boot.on_teardown { streamer.reset! }
          :hub_era
        end

        def install_pre_hub
          ::Pgbus::Configuration.prepend(ListenScope) unless ::Pgbus::Configuration.method_defined?(:streams_listen_scope)
          ::Pgbus::Web::Streamer::Listener.singleton_class.prepend(ListenerNew)
          Boot.on_teardown { ::Pgbus::Web::Streamer.reset! }
          :pre_hub
        end

        # No plugin of ours runs (pgbus's own puma/plugin/pgbus_streams.rb came
        # first on $LOAD_PATH, and boots no hub unless puma.rb required pgbus):
        # in a preloading Puma cluster master the gem alone arms the same boot.
        def arm_under_pgbus_plugin
          return if Boot.armed? || !PumaPlugin.preloading_cluster_master?

          Boot.arm(logger: ::Pgbus.logger)
          Boot.logger.info("[pgbus-hub] no pgbus-hub plugin in this Puma cluster: the hub starts before the first fork")
        end
      end

      # pgbus-hub often loads BEFORE pgbus (puma.rb, Gemfile order): the glue then installs at the
      # app's first Pgbus.configuration (pgbus's Pgbus.configure calls it too).
      module ConfigurationHook
        def configuration(...)
          PgbusAdapter.install! unless PgbusAdapter.shape
          super
        end
      end

      # pgbus <= 0.13.0: the setting, with 0.13.1's exact validation and messages.
      module ListenScope
        HINT = "Must be :master (one shared LISTEN connection per web host) or :process (one per worker)"

        def streams_listen_scope = @streams_listen_scope || :master

        def streams_listen_scope=(scope)
          unless scope.is_a?(::Symbol) || scope.is_a?(::String)
            raise ::Pgbus::ConfigurationError, "Invalid streams_listen_scope type: #{scope.class}. #{HINT}"
          end
          raise ::Pgbus::ConfigurationError, "Invalid streams_listen_scope: #{scope.to_sym.inspect}. #{HINT}" unless
            %i[master process].include?(scope.to_sym)

          @streams_listen_scope = scope.to_sym
        end
      end

      # pgbus <= 0.13.0 builds its per-worker Listener (and connection) in
      # Instance.new: with a hub the worker gets our FailoverListener instead
      # (its fallback connects afresh) and pgbus's connection is closed.
      module ListenerNew
        def new(**kwargs)
          options = PgbusAdapter.worker_options
          return super unless options && Hub.hub_served?(options)

          kwargs[:pg_connection]&.close
          Hub.worker_listener(options, dispatch_queue: kwargs[:dispatch_queue], logger: kwargs[:logger])
        end
      end
    end

    # pgbus 0.13.1+'s MasterHub (as its MasterHubBoot builds and starts it): the shared native hub.
    # Its tuning (status_interval:, durable_queue_limit:, hard_queue_limit:) applies where
    # Pgbus::Hub.configure left the default: a value set there wins, and a different one passed
    # here is named in a WARN; so is tuning that comes when our boot already started the hub.
    PgbusMasterHub = Struct.new(:socket_path, :config, :logger, :tuning, :native_hub) do
      def start
        options = PgbusAdapter.master_options(config) or raise Error, "pgbus streams configuration is not ready"
        tuning = applied_tuning(options)
        if SharedHub.current&.running? && !tuning.empty?
          logger&.warn("[pgbus-hub] #{tuning.map { |key, value| "#{key}: #{value.inspect}" }.join(', ')} from " \
                       "pgbus's MasterHub.new not applied: the master hub already runs (started before fork)")
        end
        self.native_hub = SharedHub.start(socket_path: socket_path, logger: logger, **options, **tuning)
        self
      end

      def applied_tuning(options)
        tuning.reject do |key, value|
          next false if options[key] == DEFAULTS[key]

          unless value == options[key]
            logger&.warn("[pgbus-hub] #{key}: #{options[key].inspect} from Pgbus::Hub.configure applies, " \
                         "not #{value.inspect} from pgbus's MasterHub.new")
          end
          true
        end
      end

      def stop = tap { SharedHub.stop(native_hub) if native_hub }
      def threads = native_hub ? native_hub.threads : []
      def stats = native_hub&.stats || {}
      def dropped_durable_wakes = stats.fetch(:dropped_durable_wakes, 0)
      def evicted_workers = stats.fetch(:evicted_workers, 0)
    end

    # pgbus 0.13.1+'s MasterHub.new.
    module PgbusMasterHub::New
      def new(socket_path:, config: ::Pgbus.configuration, logger: nil, **tuning)
        PgbusMasterHub.new(socket_path, config, logger || ::Pgbus.logger,
                           tuning.slice(:status_interval, :durable_queue_limit, :hard_queue_limit))
      end
    end
  end
end

Pgbus.singleton_class.prepend(Pgbus::Hub::PgbusAdapter::ConfigurationHook)
Pgbus::Hub::PgbusAdapter.install!
