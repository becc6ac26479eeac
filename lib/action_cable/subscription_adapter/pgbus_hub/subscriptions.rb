# frozen_string_literal: true

module ActionCable
  module SubscriptionAdapter
    class PgbusHub < Base
      # Rails' SubscriberMap (channel => callbacks) over a pgbus-hub listener,
      # which LISTENs and UNLISTENs in order on a native thread (a slow LISTEN
      # never holds the map's lock) and asks again while one is not confirmed.
      # A success callback waits for its channel's LISTEN (the listen ticket
      # tells it from an earlier one of the same channel), also a later
      # subscriber's, which SubscriberMap would confirm at once while the first
      # one's LISTEN is still on its way (Rails' postgresql adapter does: a
      # message sent meanwhile reaches neither, yet both were confirmed).
      # Callbacks and messages are posted where Rails' adapter posts them (the
      # event loop; 8.2: the executor), one at a time in arrival order (InOrder).
      class Subscriptions < SubscriberMap
        KEY_PREFIX = Pgbus::Hub.channel_key("")

        # The block builds the listener for a dispatch queue and an on_listening callback.
        def initialize(executor, logger: nil, &build_listener)
          super()
          @callbacks = InOrder.new(executor, logger: logger)
          @owner_pid = ::Process.pid
          @confirming = {} # channel => [listen ticket, success callbacks], until its LISTEN is active
          @confirming_lock = Mutex.new
          @listener = build_listener.call(self, method(:listening))
        end

        def owned? = @owner_pid == ::Process.pid
        def shutdown
          @callbacks.close
          @listener.stop
        end

        # SubscriberMap calls on_success at once for a channel it has already: held here
        # until that channel's LISTEN is active.
        def add_subscriber(channel, subscriber, on_success)
          super(channel, subscriber, on_success && -> { confirm_once_listening(channel, on_success) })
        end

        def add_channel(channel, on_success)
          @confirming_lock.synchronize do
            ticket = @listener.listen(Pgbus::Hub.channel_key(channel))
            @confirming[channel] = [ticket, [on_success].compact]
          end
        end

        def remove_channel(channel)
          @confirming_lock.synchronize { @confirming.delete(channel) }
          @listener.unlisten(Pgbus::Hub.channel_key(channel))
        end

        def invoke_callback(*)
          @callbacks.post { super }
        end

        # The listener's dispatch queue: a NOTIFY of a channel.
        def <<(wake) = broadcast(wake.queue_name.delete_prefix(KEY_PREFIX), wake.payload)

        private

        # The listener's on_listening (its pump thread): a listen is active.
        def listening(key, ticket)
          channel = key.delete_prefix(KEY_PREFIX)
          confirmed = @confirming_lock.synchronize do
            @confirming.delete(channel) if @confirming[channel]&.first == ticket
          end
          confirmed&.last&.each { |on_success| @callbacks.post(&on_success) }
        end

        # Now if the channel's LISTEN is active, else with the pending one's confirmation.
        def confirm_once_listening(channel, on_success)
          waiting = @confirming_lock.synchronize { @confirming[channel]&.last&.push(on_success) }
          on_success.call unless waiting
        end
      end
    end
  end
end
