# frozen_string_literal: true

# The pgbus glue in one file: what it needs of pgbus (PgbusSurface, checked at install), the hub
# client it hands pgbus 0.13.1+ (PgbusHubClient), and the adapter that installs it (PgbusAdapter;
# installed at the end of this file, and at the app's first Pgbus.configure).
module Pgbus
  module Hub
    # What pgbus-hub's glue uses of pgbus, per shape, checked at install before anything is
    # prepended (the other side, what pgbus calls on our objects, is spec/support/pgbus_calls.rb's
    # list). docs/pgbus-surface.md shows both (`rake docs:surface` writes its tables from them).
    module PgbusSurface
      SUPPORTED = "0.13.0 to 0.17"

      # What the glue uses of pgbus, by shape: [constant path, kind, names]. Kinds: :class (defined),
      # :keywords (its #initialize takes these keywords), :methods (its instances answer these),
      # :singleton (the module/class itself answers these), :constants (defined under it).
      STREAMER = "Pgbus::Web::Streamer"
      CONFIGURATION = ["Pgbus::Configuration", :methods, %i[streams_enabled streams_connection_options
                                                            streams_listen_health_check_ms]].freeze
      NEEDS = {
        hub_era: [
          ["#{STREAMER}::HubClient", :keywords, %i[socket_path dispatch_queue]],
          ["#{STREAMER}::HubClient::HubUnavailableError", :class, []],
          ["#{STREAMER}::MasterHub", :keywords, %i[socket_path]],
          ["#{STREAMER}::Listener", :constants, %i[CHANNEL_PREFIX CHANNEL_SUFFIX]],
          [STREAMER, :singleton, %i[reset!]],
          ["Pgbus", :singleton, %i[configuration logger]],
          CONFIGURATION, ["Pgbus::Configuration", :methods, %i[streams_listen_scope]]
        ],
        pre_hub: [
          ["#{STREAMER}::Listener", :keywords, %i[dispatch_queue]],
          ["#{STREAMER}::Listener", :constants, %i[CHANNEL_PREFIX CHANNEL_SUFFIX]],
          [STREAMER, :singleton, %i[reset!]],
          ["Pgbus", :singleton, %i[configuration logger]],
          ["Pgbus::ConfigurationError", :class, []], CONFIGURATION
        ]
      }.freeze

      LACKS = { keywords: "%s.new(%s:)", methods: "%s#%s", singleton: "%s.%s", constants: "%s::%s" }.freeze

      class << self
        # What the loaded pgbus lacks of +shape+'s needs, as readable strings ([] when it has it all).
        def missing(shape)
          NEEDS.fetch(shape).flat_map do |path, kind, names|
            target = Object.const_get(path) if Object.const_defined?(path)
            next ["#{path} (not defined)"] unless target

            names.reject { |name| has?(target, kind, name) }.map { |name| format(LACKS.fetch(kind), path, name) }
          end
        end

        private

        def has?(target, kind, name)
          case kind
          when :keywords then target.instance_method(:initialize).parameters.any? { |type, key| type.to_s.start_with?("key") && key == name }
          when :methods then target.method_defined?(name)
          when :singleton then target.respond_to?(name)
          when :constants then target.const_defined?(name, false)
          end
        end
      end
    end

    # pgbus 0.13.1+'s HubClient.new, as its Instance builds the worker's hub client: our
    # FailoverListener at pgbus's socket_path, answering that client's calls (docs/pgbus-surface.md).
    # pgbus's own FailoverListener stays on a connection of its own until the worker recycles; ours
    # comes back once a hub answers at the socket again (a restarted sidecar), so it never reports the
    # hub's failure to pgbus's: on_failure goes unused, and so does ack_timeout (ours waits one LISTEN budget).
    # Where our listener cannot be built from pgbus's configuration (streams off, a Proc connection),
    # pgbus's own client serves, as without this gem. The configuration read is pgbus's global one
    # (what pgbus's Instance uses unless a test hands it another: HubClient.new is not given it).
    module PgbusHubClient
      def new(**keywords)
        options = PgbusAdapter.worker_options or return super
        FailoverListenerAsHubClient.new(self::HubUnavailableError, **Hub.listener_keywords(options),
                                        socket_path: keywords.fetch(:socket_path),
                                        dispatch_queue: keywords.fetch(:dispatch_queue), logger: keywords[:logger])
      end
    end

    # The calls pgbus's Instance, FailoverListener and shutdown make on a hub client that a
    # FailoverListener does not answer under the same name. Started at `connect`; after `stop`
    # ensure_listening is nil and the hub neither healthy nor dead, so pgbus never opens a
    # connection of its own while shutting down.
    class FailoverListenerAsHubClient < FailoverListener
      def initialize(unavailable_error, **keywords)
        @unavailable_error = unavailable_error
        super(**keywords)
      end

      # Idempotent (start is). pgbus rescues its HubUnavailableError here and builds its own per-worker listener.
      def connect
        start
      rescue StandardError => e
        raise @unavailable_error, "pgbus-hub could not start this worker's listener: #{e.class}: #{e.message}"
      end

      def dead? = failed_over?
    end

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
