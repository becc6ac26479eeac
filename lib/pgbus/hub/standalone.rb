# frozen_string_literal: true

module Pgbus
  module Hub
    # Configuration for apps that use pgbus-hub without pgbus:
    #
    #   Pgbus::Hub.configure do |c|
    #     c.connection = ENV["DATABASE_URL"]   # String or Hash (:variables => SET ...)
    #     c.listen_scope = :master             # or :process (one connection per worker)
    #     c.channel_prefix = ""                # LISTEN "<prefix><queue><suffix>"
    #     c.channel_suffix = ""
    #   end
    class Configuration
      VALID_LISTEN_SCOPES = %i[master process].freeze

      attr_accessor :channel_prefix, :channel_suffix, :logger
      attr_reader :connection, :listen_scope, :health_check_ms

      def initialize
        @connection = nil
        @listen_scope = :master
        @channel_prefix = Hub::DEFAULTS[:channel_prefix]
        @channel_suffix = Hub::DEFAULTS[:channel_suffix]
        @health_check_ms = Hub::DEFAULTS[:health_check_ms]
        @logger = nil
      end

      # Checked here (ArgumentError/TypeError naming the problem), so a typo
      # fails the boot instead of every worker's first subscription.
      def connection=(value)
        Hub.check_connection(value) unless value.nil?
        @connection = value
      end

      def listen_scope=(scope)
        coerced = case scope
                  when Symbol then scope
                  when String then scope.to_sym
                  else raise ArgumentError, "Pgbus::Hub listen_scope must be :master or :process, got #{scope.class}"
                  end
        raise ArgumentError, "Pgbus::Hub listen_scope must be :master or :process, got #{coerced.inspect}" unless
          VALID_LISTEN_SCOPES.include?(coerced)

        @listen_scope = coerced
      end

      def health_check_ms=(value)
        @health_check_ms = Options.positive_integer("Pgbus::Hub.configure", :health_check_ms, value)
      end

      def to_settings
        Settings.new(scope: listen_scope, connection: connection, health_check_ms: health_check_ms,
                     channel_prefix: channel_prefix.to_s, channel_suffix: channel_suffix.to_s, source: "standalone")
      end
    end

    class << self
      def configuration
        @configuration ||= Configuration.new
      end

      def configure
        yield configuration
        configuration
      end

      # Ready for a master hub: a String or Hash connection was configured.
      def configured?
        !@configuration.nil? && (@configuration.connection.is_a?(String) || @configuration.connection.is_a?(Hash))
      end

      # A started listener for this worker: a FailoverListener over the master
      # hub when the scope is :master and the hub answers, else a local Listener
      # (its own LISTEN connection). Wakes land in dispatch_queue as WakeMessages.
      def listener(dispatch_queue:, logger: configuration.logger)
        raise Error, "Pgbus::Hub.listener: call Pgbus::Hub.configure with a connection first" unless configured?

        settings = configuration.to_settings
        local = lambda do
          Listener.new(connection: settings.connection, dispatch_queue: dispatch_queue,
                       health_check_ms: settings.health_check_ms, channel_prefix: settings.channel_prefix,
                       channel_suffix: settings.channel_suffix, logger: logger).start
        end
        hub = hub_listener(scope: settings.scope, health_check_ms: settings.health_check_ms,
                           dispatch_queue: dispatch_queue, local_factory: local, logger: logger)
        hub || local.call
      end

      # The worker half shared by the standalone API and the pgbus wiring:
      # nil unless scope :master, the socket is exported and the hub answers.
      def hub_listener(scope:, health_check_ms:, dispatch_queue:, local_factory:, logger:)
        return nil unless scope.to_s == "master"

        socket_path = ENV.fetch(Boot::ENV_KEY, nil)
        return nil if socket_path.nil? || socket_path.empty?

        failover = nil
        client = HubClient.new(socket_path: socket_path, dispatch_queue: dispatch_queue,
                               ack_timeout: Hub.hub_ack_timeout(health_check_ms), # pgbus's formula
                               on_failure: -> { failover&.fail_over! }, logger: logger)
        client.connect
        failover = FailoverListener.new(hub_client: client, local_listener_factory: local_factory, logger: logger)
      rescue HubUnavailableError => e
        logger&.info("[Pgbus::Streamer] master hub not reachable (#{e.message}) — using a per-worker listener")
        nil
      end
    end
  end
end
