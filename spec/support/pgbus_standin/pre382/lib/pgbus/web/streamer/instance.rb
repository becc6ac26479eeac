# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: pre-#382 Instance — builds its PG connection and per-worker
      # Listener unconditionally in the constructor (the dispatcher is reduced
      # to a thread that hands wakes to Streamer.on_wake).
      class Instance
        attr_reader :listener, :dispatch_queue

        def initialize(client: nil, config: Pgbus.configuration, pg_connection: nil, logger: Pgbus.logger,
                       registry: nil, dispatch_queue: nil)
          @client = client
          @config = config
          @logger = logger
          @registry = registry
          @dispatch_queue = dispatch_queue || Queue.new
          @pg_connection = pg_connection || build_pg_connection
          @listener = Listener.new(
            pg_connection: @pg_connection,
            dispatch_queue: @dispatch_queue,
            health_check_ms: @config.streams_listen_health_check_ms,
            dispatch_queue_limit: 0,
            logger: @logger
          )
        end

        def start
          @listener.start
          @dispatcher = Thread.new { dispatch }
          self
        end

        def subscribe(stream)
          @listener.ensure_listening(@config.queue_name(stream))
        end

        def shutdown!
          @listener.stop
          @dispatch_queue << :stop
          @dispatcher&.join(2)
          @pg_connection.close if @pg_connection && !@pg_connection.finished?
        end

        private

        def dispatch
          while (message = @dispatch_queue.pop) != :stop
            Streamer.on_wake&.call(message)
          end
        end

        def build_pg_connection
          DedicatedConnection.connect(@config.streams_connection_options)
        end
      end
    end
  end
end
