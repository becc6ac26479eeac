# frozen_string_literal: true

module Pgbus
  module Hub
    # pgbus 0.13.1+'s HubClient.new, as its Instance builds the worker's hub client: our
    # FailoverListener at pgbus's socket_path, behind that client's interface (docs/pgbus-surface.md).
    # pgbus's own FailoverListener stays on a connection of its own until the worker recycles; ours
    # comes back once a hub answers at the socket again (a restarted sidecar), so it never reports the
    # hub's failure to pgbus's: on_failure goes unused, and so does ack_timeout (ours waits one LISTEN budget).
    # Where our listener cannot be built from pgbus's configuration (streams off, a Proc connection),
    # pgbus's own client serves, as without this gem. The configuration read is pgbus's global one
    # (what pgbus's Instance uses unless a test hands it another: HubClient.new is not given it).
    module PgbusHubClient
      def new(**keywords)
        options = PgbusAdapter.worker_options or return super
        FailoverListenerAsHubClient.new(keywords.fetch(:socket_path), keywords.fetch(:dispatch_queue), keywords[:logger],
                                        self::HubUnavailableError, options)
      end
    end

    # The calls pgbus's Instance, FailoverListener and shutdown make on a hub client
    # (docs/pgbus-surface.md), answered by our FailoverListener, started at `connect`.
    class FailoverListenerAsHubClient
      attr_reader :listener

      def initialize(socket_path, dispatch_queue, logger, unavailable_error, options)
        @socket_path = socket_path
        @worker = { dispatch_queue: dispatch_queue, logger: logger }
        @unavailable_error = unavailable_error
        @options = options
      end

      # pgbus rescues its HubUnavailableError here and builds its own per-worker listener.
      def connect
        return self if @listener

        @listener = Hub.worker_listener(@options, socket_path: @socket_path, **@worker)
        self
      rescue StandardError => e
        raise @unavailable_error, "pgbus-hub could not start this worker's listener: #{e.class}: #{e.message}"
      end

      # nil (not confirmed) before connect and after stop: never a fresh connection of pgbus's while shutting down.
      def ensure_listening(queue) = (@listener.ensure_listening(queue) if live?)
      def remove_listening(queue) = (@listener.remove_listening(queue) if live?)
      def hub_healthy? = live? && @listener.hub_healthy?
      def dead? = live? && @listener.failed_over?
      def threads = @listener ? @listener.threads : []

      def stop
        @stopped = true
        @listener&.stop
        self
      end

      private

      def live? = !@listener.nil? && !@stopped
    end
  end
end
