# frozen_string_literal: true

module Pgbus
  module Hub
    # A worker's listener (ext/pgbus_hub/src/failover_listener.rs), with
    # pgbus's Listener surface: served by the master hub at socket_path until
    # the hub fails, then by a LISTEN connection of its own with every
    # subscription replayed; never back to the hub. A hub that cannot be
    # reached at start means the own connection at once.
    class FailoverListener
      include NativeObject

      def initialize(**options)
        resolve_options(is_a?(Listener) ? "Listener" : "FailoverListener", options)
        @lock = Mutex.new
      end

      # Idempotent.
      def start
        @lock.synchronize do
          next if @pump

          native_start(@options)
          start_threads("pgbus-hub listener")
        end
        self
      end

      # :done once LISTEN is active. nil (pgbus's "not listening", which its
      # dispatcher tolerates) when not confirmed in time (the subscription is
      # kept), and for a name no LISTEN can take: empty, over 63 bytes with
      # prefix and suffix, a NUL byte (logged at ERROR the first time).
      def ensure_listening(queue) = native_ensure_listening(queue.to_s)

      def remove_listening(queue) = native_remove_listening(queue.to_s)
    end

    # A per-worker LISTEN connection, no hub tried: the fallback, the
    # :process scope and the standalone listener.
    class Listener < FailoverListener
      def connected? = stats[:healthy] == true
    end
  end
end
