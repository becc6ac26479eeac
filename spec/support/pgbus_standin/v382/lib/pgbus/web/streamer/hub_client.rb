# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: pgbus's Ruby HubClient is NOT rendered. Its surface exists so
      # Instance#build_hub_listener compiles; connect always fails, so a worker
      # that ends up here (pgbus-hub's wiring missing) visibly falls back.
      class HubClient
        class HubUnavailableError < StandardError; end

        def initialize(socket_path:, dispatch_queue:, ack_timeout: 2.0, on_failure: nil, logger: Pgbus.logger)
          @socket_path = socket_path
        end

        def connect
          raise HubUnavailableError, "stand-in: pgbus's Ruby HubClient is not rendered (#{@socket_path})"
        end
      end
    end
  end
end
