# frozen_string_literal: true

module Pgbus
  module Hub
    # Serves through the hub client; on its first failure builds ONE local
    # listener, re-LISTENs every recorded subscription there and swaps it in.
    # Never raises into a request thread; never flaps back to the hub.
    class FailoverListener
      def initialize(hub_client:, local_listener_factory:, logger: nil)
        raise ArgumentError, "FailoverListener: local_listener_factory must respond to call" unless
          local_listener_factory.respond_to?(:call)

        @hub_client = @impl = hub_client
        @factory = local_listener_factory
        @logger = logger
        @subscriptions = Set.new
        @lock = Mutex.new          # @subscriptions and @impl
        @failover_lock = Mutex.new # one fail-over
        @refused = RefusedQueues.new
      end

      def start = self

      def failed_over? = !@failed_over.nil?

      # The impl's result (:done, or nil when it timed out / is degraded).
      def ensure_listening(queue)
        @lock.synchronize { @subscriptions << queue && @impl }.ensure_listening(queue)
      rescue HubUnavailableError
        fail_over!
        retry_locally(queue)
      rescue InvalidQueueError => e
        @lock.synchronize { @subscriptions.delete(queue) } # never replayed
        @refused.report(queue, e, @logger)
      end

      def remove_listening(queue)
        @lock.synchronize { @subscriptions.delete(queue) && @impl }.remove_listening(queue)
      rescue StandardError => e
        @logger&.warn("[pgbus-hub] remove_listening(#{queue.inspect}) failed: #{e.class}: #{e.message}")
      end

      # Idempotent: builds the local listener, replays, swaps.
      def fail_over!
        @failover_lock.synchronize do
          return if @failed_over

          @failed_over = true
          local = @factory.call
          replayed = Set.new
          # Replay until nothing recorded is left, then swap in the same
          # critical section: a sub recorded during the replay is not lost.
          until (pending = @lock.synchronize { (@subscriptions - replayed).tap { |p| @impl = local if p.empty? } }).empty?
            pending.each do |queue|
              local.ensure_listening(queue)
              replayed << queue
            end
          end
          @logger&.info("[pgbus-hub] failed over to a per-worker listener (#{replayed.size} subscription(s) re-LISTENed)")
        rescue StandardError => e
          local&.stop if @impl.equal?(@hub_client) # half-built: never left running
          @logger&.error("[pgbus-hub] fallback listener failed to build (#{e.class}: #{e.message}) — " \
                         "streams degraded until this worker recycles")
        end
      end

      # The live threads of the hub client and of the local listener; [] after stop.
      def threads = owned.flat_map { |part| part.respond_to?(:threads) ? part.threads : [] }.uniq

      def stop
        owned.each do |part|
          part.stop
        rescue StandardError => e
          @logger&.warn("[pgbus-hub] stop of #{part.class} raised #{e.class}: #{e.message}")
        end
        self
      end

      private

      def owned = @lock.synchronize { [@hub_client, @impl].uniq }

      def retry_locally(queue)
        impl = @lock.synchronize { @impl }
        impl.equal?(@hub_client) ? nil : impl.ensure_listening(queue) # nil: degraded
      rescue StandardError => e
        @logger&.error("[pgbus-hub] local listener failed for #{queue.inspect}: #{e.class}: #{e.message}")
      end
    end
  end
end
