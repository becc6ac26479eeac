# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: pgbus's Ruby MasterHub is NOT rendered. start raises, so a
      # MasterHubBoot that builds THIS class (pgbus-hub's MasterHubSwap missing)
      # logs "master hub failed to start" and the workers fall back — visibly.
      class MasterHub
        def initialize(config:, socket_path:, listener_factory: nil, status_interval: 1.0,
                       durable_queue_limit: 256, hard_queue_limit: 1024, logger: Pgbus.logger)
          @socket_path = socket_path
        end

        attr_reader :socket_path

        def start
          raise NotImplementedError, "stand-in: pgbus's Ruby MasterHub is not rendered"
        end

        def stop
          self
        end
      end
    end
  end
end
