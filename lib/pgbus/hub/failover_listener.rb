# frozen_string_literal: true

module Pgbus
  module Hub
    # pgbus's FailoverListener contract: serve through the hub client, and on
    # the first transport failure build ONE local listener, re-LISTEN every
    # recorded subscription on it and swap it in. Never raises into a request
    # thread; never flaps back to the hub.
    class FailoverListener
      DEFAULTS = { hub_client: Options::REQUIRED, local_listener_factory: Options::REQUIRED, logger: nil }.freeze

      def initialize(**options)
        opts = Options.resolve("FailoverListener", options, DEFAULTS)
        @hub_client = @impl = opts[:hub_client]
        @factory = opts[:local_listener_factory]
        raise ArgumentError, "FailoverListener: local_listener_factory must respond to call" unless @factory.respond_to?(:call)

        @logger = opts[:logger]
        @subscriptions = Set.new
        @lock = Mutex.new          # guards @subscriptions and @impl
        @failover_lock = Mutex.new # serialises fail_over!
        @failed_over = false
        @refused = RefusedQueues.new
      end

      def start
        self
      end

      # The impl's result (:done, or nil when it timed out / is degraded).
      def ensure_listening(queue)
        impl = @lock.synchronize do
          @subscriptions << queue
          @impl
        end
        impl.ensure_listening(queue)
      rescue HubUnavailableError
        fail_over!
        retry_locally(queue)
      rescue InvalidQueueError => e
        @lock.synchronize { @subscriptions.delete(queue) } # never replayed on a fail-over
        @refused.report(queue, e, @logger)
      end

      def remove_listening(queue)
        impl = @lock.synchronize do
          @subscriptions.delete(queue)
          @impl
        end
        impl.remove_listening(queue)
      rescue StandardError => e
        @logger&.warn("[pgbus-hub] remove_listening(#{queue.inspect}) failed: #{e.class}: #{e.message}")
        nil
      end

      # Idempotent. Builds the local listener, replays the recorded subs, swaps.
      def fail_over!
        @failover_lock.synchronize do
          return if @failed_over

          @failed_over = true
          begin
            local = @factory.call
          rescue StandardError => e
            @logger&.error("[pgbus-hub] fallback listener failed to build (#{e.class}: #{e.message}) — " \
                           "streams degraded until this worker recycles")
            return
          end
          # Replay until nothing recorded is left un-replayed, then swap in the
          # same critical section: a sub recorded during the replay is not lost.
          replayed = Set.new
          loop do
            pending = @lock.synchronize do
              remaining = @subscriptions.to_a - replayed.to_a
              @impl = local if remaining.empty?
              remaining
            end
            break if pending.empty?

            pending.each do |queue|
              local.ensure_listening(queue)
              replayed << queue
            end
          end
          @logger&.info("[pgbus-hub] failed over to a per-worker listener (#{replayed.size} subscription(s) re-LISTENed)")
        end
      end

      def failed_over?
        @failed_over
      end

      # The live threads of the hub client and of the local listener (once
      # failed over); [] after stop.
      def threads
        owned.flat_map { |component| component.respond_to?(:threads) ? component.threads : [] }.uniq
      end

      # Stops the hub client and the local listener (if one was built).
      def stop
        owned.each do |component|
          component.stop
        rescue StandardError => e
          @logger&.warn("[pgbus-hub] stop of #{component.class} raised #{e.class}: #{e.message}")
        end
        self
      end

      private

      def owned
        @lock.synchronize { [@hub_client, @impl].uniq }
      end

      def retry_locally(queue)
        impl = @lock.synchronize { @impl }
        return nil if impl.equal?(@hub_client) # the fallback could not be built: degraded

        impl.ensure_listening(queue)
      rescue StandardError => e
        @logger&.error("[pgbus-hub] local listener failed for #{queue.inspect}: #{e.class}: #{e.message}")
        nil
      end
    end
  end
end
