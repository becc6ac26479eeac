# frozen_string_literal: true

module ActionCable
  module SubscriptionAdapter
    class PgbusHub < Base
      # Rails' SubscriberMap (channel => callbacks) over a pgbus-hub listener:
      # LISTEN and UNLISTEN run in order on one thread (a slow LISTEN never
      # holds the map's lock); success callbacks and messages are posted on the
      # server's event loop, as Rails' adapter does.
      class Subscriptions < SubscriberMap
        # A LISTEN not confirmed (database down, listener degraded) is retried after this pause.
        RETRY_SECONDS = 1.0
        KEY_PREFIX = Pgbus::Hub.channel_key("")

        def initialize(listener_factory, event_loop, logger)
          super()
          @event_loop = event_loop
          @logger = logger
          @owner_pid = ::Process.pid
          @actions = Queue.new
          @retrying = Set.new # channels whose LISTEN waits for a retry (the actions thread's own)
          @wanted = Set.new   # channels with subscribers, as add_channel/remove_channel said
          @wanted_lock = Mutex.new
          @thread = Pgbus::Hub.thread("pgbus-hub cable") { run(listener_factory) }
        end

        def owned? = @owner_pid == ::Process.pid

        def shutdown
          @actions << [:stop]
          @thread.join(15)
        end

        def add_channel(channel, on_success)
          @wanted_lock.synchronize { @wanted << channel }
          @actions << [:listen, channel, on_success]
        end

        def remove_channel(channel)
          @wanted_lock.synchronize { @wanted.delete(channel) }
          @actions << [:unlisten, channel]
        end

        def invoke_callback(*)
          @event_loop.post { super }
        end

        # The listener's dispatch queue: a NOTIFY of a channel.
        def <<(wake)
          broadcast(wake.queue_name.delete_prefix(KEY_PREFIX), wake.payload)
        end

        private

        def run(listener_factory)
          listener = build(listener_factory) or return
          loop do
            action, channel, on_success = @actions.pop
            case action
            when :listen then listen(listener, channel, on_success)
            when :unlisten then listener.remove_listening(Pgbus::Hub.channel_key(channel))
            when :stop then break
            end
          rescue StandardError => e
            @logger&.error("[pgbus-hub] ActionCable #{action} #{channel.inspect}: #{e.class}: #{e.message}")
          end
        ensure
          listener&.stop
        end

        def build(listener_factory)
          listener_factory.call(self)
        rescue StandardError => e
          @logger&.error("[pgbus-hub] ActionCable listener failed to build (#{e.class}: #{e.message}): no subscriptions")
          nil
        end

        def listen(listener, channel, on_success)
          if listener.ensure_listening(Pgbus::Hub.channel_key(channel)) == :done
            @retrying.delete(channel)
            @event_loop.post(&on_success) if on_success
          elsif @wanted_lock.synchronize { @wanted.include?(channel) } # still wanted: never a lost subscription
            @logger&.warn("[pgbus-hub] ActionCable LISTEN #{channel.inspect} not confirmed: retrying every " \
                          "#{RETRY_SECONDS}s") if @retrying.add?(channel) # once: a database outage may last
            sleep RETRY_SECONDS
            @actions << [:listen, channel, on_success]
          end
        end
      end
    end
  end
end
