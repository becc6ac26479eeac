# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: 0.13.1 Instance — picks the wake source by streams_listen_scope
      # (build_listener); the dispatcher is reduced to a thread that hands wakes
      # to Streamer.on_wake.
      class Instance
        attr_reader :listener, :dispatch_queue

        def initialize(client: nil, config: Pgbus.configuration, pg_connection: nil, logger: Pgbus.logger,
                       registry: nil, dispatch_queue: nil, connection_factory: nil)
          @client = client
          @config = config
          @logger = logger
          @registry = registry
          @dispatch_queue = dispatch_queue || Queue.new
          @listener = build_listener(pg_connection, connection_factory)
        end

        def start
          @listener.start
          @dispatcher = Thread.new { dispatch }
          @dispatcher.name = "stand-in dispatcher"
          self
        end

        def subscribe(stream)
          @listener.ensure_listening(@config.queue_name(stream))
        end

        # 0.15+: the components' threads are taken BEFORE the stops (a stop forgets its thread even
        # when the join timed out) and the names of those still alive after them are returned.
        def shutdown!
          threads = @listener.threads + [@dispatcher].compact if Pgbus.reports_leaks?
          @listener.stop
          @dispatch_queue << :stop
          @dispatcher&.join(2)
          @pg_connection.close if @pg_connection && !@pg_connection.finished?
          threads&.select(&:alive?)&.map { |thread| thread.name || thread.inspect }
        end

        private

        def dispatch
          while (message = @dispatch_queue.pop) != :stop
            Streamer.on_wake&.call(message)
          end
        end

        def build_listener(pg_connection, connection_factory)
          build_hub_listener(connection_factory) ||
            build_local_listener(@pg_connection = pg_connection || build_pg_connection, connection_factory)
        end

        def build_hub_listener(connection_factory)
          return nil unless @config.streams_listen_scope == :master

          path = ENV.fetch("PGBUS_STREAMS_HUB_SOCKET", nil)
          return nil if path.nil? || path.empty?

          failover = nil
          client = HubClient.new(socket_path: path, dispatch_queue: @dispatch_queue,
                                 ack_timeout: (@config.streams_listen_health_check_ms / 1000.0) + 2.0,
                                 on_failure: -> { failover&.fail_over! }, logger: @logger)
          client.connect
          failover = FailoverListener.new(
            hub_client: client,
            local_listener_factory: -> { build_local_listener(build_pg_connection, connection_factory).tap(&:start) },
            logger: @logger
          )
        rescue HubClient::HubUnavailableError => e
          @logger.info("[Pgbus::Streamer] master hub not reachable (#{e.message}) — using a per-worker listener")
          nil
        end

        def build_local_listener(pg_connection, connection_factory)
          Listener.new(pg_connection: pg_connection, dispatch_queue: @dispatch_queue,
                       health_check_ms: @config.streams_listen_health_check_ms, dispatch_queue_limit: 0,
                       logger: @logger, connection_factory: connection_factory || -> { build_pg_connection })
        end

        def build_pg_connection
          DedicatedConnection.connect(@config.streams_connection_options)
        end
      end
    end
  end
end
