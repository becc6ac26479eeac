# frozen_string_literal: true

module Pgbus
  module Hub
    # What lands in a dispatch queue: pgbus's own
    # Pgbus::Web::Streamer::Listener::WakeMessage when pgbus is loaded (so its
    # dispatcher sees the class it expects), else this one with the same readers.
    WakeMessage = Struct.new(:queue_name, :payload, keyword_init: true)

    # Builds a wake in the class the running pgbus expects. Old pgbus versions
    # define WakeMessage with queue_name only: durable wakes (payload nil) fit;
    # an ephemeral payload cannot be carried there and is passed as a durable
    # wake (the stream re-reads) — with a warning, once.
    module Wakes
      module_function

      def factory(logger = nil)
        klass = pgbus_wake_class || WakeMessage
        takes_payload = !klass.respond_to?(:members) || klass.members.include?(:payload)
        warned = false
        lambda do |queue, payload|
          next klass.new(queue_name: queue, payload: payload) if takes_payload

          if payload && !warned && logger
            warned = true
            logger.warn("[pgbus-hub] this pgbus's WakeMessage has no payload: ephemeral payloads are delivered as durable wakes")
          end
          klass.new(queue_name: queue)
        end
      end

      def pgbus_wake_class
        return nil unless defined?(::Pgbus::Web::Streamer::Listener::WakeMessage)

        ::Pgbus::Web::Streamer::Listener::WakeMessage
      end
    end
  end
end
