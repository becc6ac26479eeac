# frozen_string_literal: true

module Pgbus
  module Hub
    # A worker's connection to the master hub (ext/pgbus_hub/src/hub_client.rs).
    # Native: the socket, frame decoding, ack waits (without the GVL).
    # Here: keywords, the pump thread (it reads the socket in native code,
    # fills dispatch_queue and calls on_failure), and the log thread.
    class HubClient
      HubUnavailableError = Pgbus::Hub::HubUnavailableError

      DEFAULTS = {
        socket_path: Options::REQUIRED,
        dispatch_queue: Options::REQUIRED,
        ack_timeout: Hub::DEFAULTS[:ack_timeout],
        on_failure: nil,
        logger: nil
      }.freeze

      attr_reader :socket_path

      def initialize(**options)
        opts = Options.resolve("HubClient", options, DEFAULTS)
        @socket_path = Options.string("HubClient", :socket_path, opts[:socket_path])
        @dispatch_queue = opts[:dispatch_queue]
        raise ArgumentError, "HubClient: dispatch_queue must respond to <<" unless @dispatch_queue.respond_to?(:<<)

        @ack_timeout = Options.positive_number("HubClient", :ack_timeout, opts[:ack_timeout])
        @on_failure = opts[:on_failure]
        @logger = opts[:logger]
        @owner_pid = ::Process.pid
      end

      # Raises HubUnavailableError "cannot reach master hub at PATH: ...".
      def connect
        native_connect(@socket_path, @ack_timeout)
        @log_thread = LogDrain.start(@logger, "pgbus-hub client log") { native_next_logs }
        @pump = Pump.start(name: "pgbus-hub client pump", dispatch_queue: @dispatch_queue,
                           wake: Wakes.factory(@logger), on_failure: @on_failure, logger: @logger) do
          native_next_batch
        end
        self
      end

      # :done once the hub acked (LISTEN active); nil within ~50 ms while the hub
      # reports its database connection down (the hub keeps the sub and LISTENs
      # it on reconnect; the worker stays on the hub). Raises HubUnavailableError
      # (dead, died while waiting, ack timeout) or InvalidQueueError (the hub refused the name).
      def ensure_listening(queue)
        native_ensure_listening(queue.to_s)
      end

      # Fire-and-forget; never raises on a dead hub.
      def remove_listening(queue)
        native_remove_listening(queue.to_s)
        nil
      end

      # The live Ruby threads this object owns (pump, log drain); [] after stop.
      # Newer pgbus collects these at shutdown to report leaked threads.
      def threads
        [@pump, @log_thread].compact.select(&:alive?)
      end

      # Idempotent; returns within ~2 s even if the hub is wedged. In a forked
      # child it leaves the parent's socket and threads alone.
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
