# frozen_string_literal: true

module Pgbus
  module Hub
    # A per-worker LISTEN connection (ext/pgbus_hub/src/listener.rs), the same
    # engine the master hub runs: the fallback when there is no hub, and the
    # standalone listener. pgbus's Listener surface: start / ensure_listening
    # (:done once LISTEN is active, nil on timeout) / remove_listening / stop.
    # One outcome for a queue name no LISTEN can take (empty, over 63 bytes
    # with prefix and suffix, a NUL byte) in every mode: the listener an app
    # gets (a local Listener in single mode or :process scope, a
    # FailoverListener over the hub in cluster mode, the same under pgbus)
    # returns nil from ensure_listening, pgbus's "not listening" result, which
    # its dispatcher already tolerates, and logs the first refusal of each name
    # at ERROR (app code repeats a bad name on every request). HubClient, the
    # transport underneath, raises InvalidQueueError.
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

    class Listener
      DEFAULTS = {
        connection: Options::REQUIRED,
        dispatch_queue: Options::REQUIRED,
        health_check_ms: Hub::DEFAULTS[:health_check_ms],
        channel_prefix: Hub::DEFAULTS[:channel_prefix],
        channel_suffix: Hub::DEFAULTS[:channel_suffix],
        logger: nil
      }.freeze

      def initialize(**options)
        opts = Options.resolve("Listener", options, DEFAULTS)
        @dispatch_queue = opts[:dispatch_queue]
        raise ArgumentError, "Listener: dispatch_queue must respond to <<" unless @dispatch_queue.respond_to?(:<<)

        @logger = opts[:logger]
        health_check_ms = Options.positive_integer("Listener", :health_check_ms, opts[:health_check_ms])
        @ack_timeout = Hub.listen_ack_timeout(health_check_ms) # pgbus's Listener budget
        @native_options = {
          connection: opts[:connection],
          health_check_ms: health_check_ms,
          channel_prefix: Options.string("Listener", :channel_prefix, opts[:channel_prefix]),
          channel_suffix: Options.string("Listener", :channel_suffix, opts[:channel_suffix])
        }.freeze
        @owner_pid = ::Process.pid
        @lock = Mutex.new
        @refused = RefusedQueues.new
      end

      # Idempotent. Connects in the background; ensure_listening waits for it.
      def start
        @lock.synchronize do
          return self if @pump

          native_start(@native_options)
          @log_thread = LogDrain.start(@logger, "pgbus-hub listener log") { native_next_logs }
          @pump = Pump.start(name: "pgbus-hub listener pump", dispatch_queue: @dispatch_queue,
                             wake: Wakes.factory(@logger), logger: @logger) { native_next_batch }
        end
        self
      end

      def ensure_listening(queue)
        result = native_ensure_listening(queue.to_s, @ack_timeout)
        @logger&.warn("[pgbus-hub] LISTEN for #{queue} not confirmed within #{@ack_timeout}s") if result.nil?
        result
      rescue InvalidQueueError => e
        @refused.report(queue, e, @logger)
      end

      def remove_listening(queue)
        native_remove_listening(queue.to_s)
        nil
      end

      def stats
        native_stats
      end

      def alive?
        !@pump.nil? && ::Process.pid == @owner_pid
      end

      # The live Ruby threads this object owns (pump, log drain); [] after stop.
      # Newer pgbus collects these at shutdown to report leaked threads.
      def threads
        [@pump, @log_thread].compact.select(&:alive?)
      end

      def stop
        native_stop
        if ::Process.pid == @owner_pid
          @pump&.join(2)
          @log_thread&.join(2)
        end
        @pump = @log_thread = nil
        self
      end
    end
  end
end
