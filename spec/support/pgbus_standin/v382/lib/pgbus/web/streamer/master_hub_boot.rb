# frozen_string_literal: true

require "tmpdir"

module Pgbus
  module Web
    module Streamer
      # STAND-IN: pgbus 0.13.1's MasterHubBoot (contract §4): export the socket
      # path at once, poll until the configuration is ready, build + start the
      # hub under :master, give up quietly after the deadline.
      class MasterHubBoot
        def self.default_socket_path
          File.join(Dir.tmpdir, "pgbus-streams-hub-#{::Process.pid}.sock")
        end

        def initialize(socket_path: self.class.default_socket_path, hub_factory: nil, poll_interval: 1.0,
                       deadline: 120, logger: nil)
          @socket_path = socket_path
          @hub_factory = hub_factory || ->(socket_path:) { MasterHub.new(config: Pgbus.configuration, socket_path: socket_path) }
          @poll_interval = poll_interval
          @deadline = deadline
          @logger = logger || Pgbus.logger
          @mutex = Mutex.new
          @running = false
          @hub = nil
        end

        def start
          ENV["PGBUS_STREAMS_HUB_SOCKET"] = @socket_path
          @running = true
          @poller = Thread.new { poll }
          self
        end

        def stop
          hub = @mutex.synchronize do
            @running = false
            @hub.tap { @hub = nil }
          end
          @poller&.join(2)
          hub&.stop
          self
        end

        private

        def poll
          started = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
          while @running
            return boot if configuration_ready?

            if ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - started >= @deadline
              @logger.info("[Pgbus::Streamer::MasterHubBoot] configuration never became ready within #{@deadline}s " \
                           "(no preload_app!?) — no master hub; workers use per-worker listeners")
              return
            end
            sleep @poll_interval
          end
        end

        def configuration_ready?
          config = Pgbus.configuration
          config.streams_enabled && [String, Hash].any? { |k| config.streams_connection_options.is_a?(k) }
        rescue StandardError
          false
        end

        def boot
          return unless Pgbus.configuration.streams_listen_scope == :master

          hub = @hub_factory.call(socket_path: @socket_path).start
          late = @mutex.synchronize { @running ? (@hub = hub) && false : true }
          return hub.stop if late

          @logger.info("[Pgbus::Streamer::MasterHubBoot] master hub listening at #{@socket_path}")
        rescue StandardError => e
          @logger.error("[Pgbus::Streamer::MasterHubBoot] master hub failed to start (#{e.class}: #{e.message}) " \
                        "— workers fall back to per-worker listeners")
        end
      end
    end
  end
end
