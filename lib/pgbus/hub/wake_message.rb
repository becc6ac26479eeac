# frozen_string_literal: true

module Pgbus
  module Hub
    # A wake in a dispatch queue when pgbus is not loaded (pgbus's own class otherwise).
    WakeMessage = Struct.new(:queue_name, :payload, keyword_init: true)

    module Wakes
      # Builds wakes in the class the running pgbus expects. A pgbus whose
      # WakeMessage has no payload gets an ephemeral payload as a durable wake
      # (its stream re-reads), with one warning.
      def self.factory(logger = nil)
        klass = defined?(::Pgbus::Web::Streamer::Listener::WakeMessage) ? ::Pgbus::Web::Streamer::Listener::WakeMessage : WakeMessage
        return ->(queue, payload) { klass.new(queue_name: queue, payload: payload) } if klass.members.include?(:payload)

        warned = false
        lambda do |queue, payload|
          logger&.warn("[pgbus-hub] this pgbus's WakeMessage has no payload: ephemeral payloads arrive as durable wakes") if payload && !warned
          warned ||= !payload.nil?
          klass.new(queue_name: queue)
        end
      end
    end
  end
end
