# frozen_string_literal: true

module Pgbus
  module Hub
    # The native master hub (ext/pgbus_hub/src/master_hub.rs): one PostgreSQL
    # LISTEN connection, fanned out to workers over a Unix socket.
    class MasterHub
      include NativeObject

      def initialize(**options) = resolve_options("MasterHub", options)

      def socket_path = @options[:socket_path]

      # Binds the socket, starts the native thread; raises Pgbus::Hub::Error with the reason.
      def start
        native_start(@options)
        start_threads("pgbus-hub")
        self
      end

      def stats = native_stats
    end
  end
end
