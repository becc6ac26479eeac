# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: pgbus's Ruby FailoverListener is NOT rendered (never reached:
      # the stand-in HubClient cannot connect).
      class FailoverListener
        def initialize(hub_client:, local_listener_factory:, logger: Pgbus.logger)
          raise NotImplementedError, "stand-in: pgbus's Ruby FailoverListener is not rendered"
        end
      end
    end
  end
end
