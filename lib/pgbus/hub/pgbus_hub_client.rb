# frozen_string_literal: true

module Pgbus
  module Hub
    # pgbus 0.13.1+'s HubClient.new, as its Instance builds the worker's hub client: our
    # FailoverListener at pgbus's socket_path, answering that client's calls (docs/pgbus-surface.md).
    # pgbus's own FailoverListener stays on a connection of its own until the worker recycles; ours
    # comes back once a hub answers at the socket again (a restarted sidecar), so it never reports the
    # hub's failure to pgbus's: on_failure goes unused, and so does ack_timeout (ours waits one LISTEN budget).
    # Where our listener cannot be built from pgbus's configuration (streams off, a Proc connection),
    # pgbus's own client serves, as without this gem. The configuration read is pgbus's global one
    # (what pgbus's Instance uses unless a test hands it another: HubClient.new is not given it).
    module PgbusHubClient
      def new(**keywords)
        options = PgbusAdapter.worker_options or return super
        FailoverListenerAsHubClient.new(self::HubUnavailableError, **Hub.listener_keywords(options),
                                        socket_path: keywords.fetch(:socket_path),
                                        dispatch_queue: keywords.fetch(:dispatch_queue), logger: keywords[:logger])
      end
    end

    # The calls pgbus's Instance, FailoverListener and shutdown make on a hub client that a
    # FailoverListener does not answer under the same name. Started at `connect`; after `stop`
    # ensure_listening is nil and the hub neither healthy nor dead, so pgbus never opens a
    # connection of its own while shutting down.
    class FailoverListenerAsHubClient < FailoverListener
      def initialize(unavailable_error, **keywords)
        @unavailable_error = unavailable_error
        super(**keywords)
      end

      # Idempotent (start is). pgbus rescues its HubUnavailableError here and builds its own per-worker listener.
      def connect
        start
      rescue StandardError => e
        raise @unavailable_error, "pgbus-hub could not start this worker's listener: #{e.class}: #{e.message}"
      end

      def dead? = failed_over?
    end
  end
end
