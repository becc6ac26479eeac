# frozen_string_literal: true

module Pgbus
  module Hub
    # One outcome for a queue name no LISTEN can take (empty, over 63 bytes
    # with prefix and suffix, a NUL byte), whatever listener an app got:
    # ensure_listening returns nil (pgbus's "not listening", which its
    # dispatcher tolerates) and the first refusal of each name is logged at
    # ERROR (app code repeats a bad name on every request).
    class RefusedQueues
      def initialize
        @names = Set.new
        @lock = Mutex.new
      end

      def report(queue, error, logger)
        first = @lock.synchronize { @names.add?(queue) }
        logger&.error("[pgbus-hub] cannot listen to #{queue.inspect}: #{error.message}") if first
        nil
      end
    end

    # A per-worker LISTEN connection (ext/pgbus_hub/src/listener.rs), the
    # engine the master hub runs: the fallback when there is no hub, and the
    # standalone listener, with pgbus's Listener surface.
    class Listener
      include NativeObject

      def initialize(**options)
        resolve_options("Listener", options)
        @ack_timeout = Hub.listen_ack_timeout(@options[:health_check_ms]) # pgbus's Listener budget
        @logger = @options[:logger]
        @lock = Mutex.new
        @refused = RefusedQueues.new
      end

      # Idempotent. Connects in the background; ensure_listening waits for it.
      def start
        @lock.synchronize do
          next if @pump

          native_start(@options)
          start_threads("pgbus-hub listener")
        end
        self
      end

      # :done once LISTEN is active, nil when not confirmed within the budget.
      def ensure_listening(queue)
        result = native_ensure_listening(queue.to_s, @ack_timeout)
        @logger&.warn("[pgbus-hub] LISTEN for #{queue} not confirmed within #{@ack_timeout}s") if result.nil?
        result
      rescue InvalidQueueError => e
        @refused.report(queue, e, @logger)
      end

      def remove_listening(queue) = native_remove_listening(queue.to_s)

      def stats = native_stats

      def alive? = !@pump.nil? && ::Process.pid == @owner_pid
    end
  end
end
