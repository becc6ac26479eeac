# frozen_string_literal: true

module Pgbus
  module Hub
    # A worker's connection to the master hub (ext/pgbus_hub/src/hub_client.rs).
    class HubClient
      include NativeObject

      HubUnavailableError = Pgbus::Hub::HubUnavailableError

      def initialize(**options) = resolve_options("HubClient", options)

      def socket_path = @options[:socket_path]

      # Raises HubUnavailableError "cannot reach master hub at PATH: ...".
      def connect
        native_connect(socket_path, @options[:ack_timeout])
        start_threads("pgbus-hub client")
        self
      end

      # :done once the hub acked (LISTEN active); nil during a database outage
      # (the hub LISTENs on reconnect) and for a name the hub refused (logged
      # once). Raises HubUnavailableError (dead, died while waiting, ack timeout).
      def ensure_listening(queue) = native_ensure_listening(queue.to_s)

      # Fire-and-forget; never raises on a dead hub.
      def remove_listening(queue) = native_remove_listening(queue.to_s)
    end
  end
end
