# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: 0.13.1 FailoverListener, per the contract: serve through the
      # hub client; on its HubUnavailableError build ONE local listener, replay
      # every recorded subscription there and swap it in; never flap back.
      class FailoverListener
        def initialize(hub_client:, local_listener_factory:, logger: Pgbus.logger)
          @hub_client = @impl = hub_client
          @factory = local_listener_factory
          @logger = logger
          @subscriptions = Set.new
          @state = Mutex.new
          @failover = Mutex.new
          @failed_over = false
        end

        def start = self

        def failed_over? = @state.synchronize { @failed_over }

        def ensure_listening(queue)
          @state.synchronize { @subscriptions << queue }
          current.ensure_listening(queue)
        rescue HubClient::HubUnavailableError
          fail_over!
          begin
            current.ensure_listening(queue)
          rescue HubClient::HubUnavailableError
            nil
          end
        end

        def remove_listening(queue)
          @state.synchronize { @subscriptions.delete(queue) }
          current.remove_listening(queue)
        rescue HubClient::HubUnavailableError
          nil
        end

        def fail_over!
          @failover.synchronize do
            return if failed_over?

            local = @factory.call
            @state.synchronize { @subscriptions.dup }.each { |queue| local.ensure_listening(queue) }
            @state.synchronize { @impl, @failed_over = local, true }
          end
        rescue StandardError => e
          @state.synchronize { @failed_over = true }
          @logger.error("stand-in FailoverListener: fallback failed (#{e.class}: #{e.message})")
        end

        def stop = current.stop

        # 0.15+ (stand-in's reading of PR #448): the threads of the hub client and of the side serving now.
        def threads = [@hub_client, current].uniq.flat_map(&:threads)

        private

        def current = @state.synchronize { @impl }
      end
    end
  end
end
