# frozen_string_literal: true

module Pgbus
  module Hub
    # ActiveSupport::Notifications events (docs/events.md). Native threads only
    # queue them (Pgbus::Hub::Events, bounded, the oldest dropped when full); one
    # Ruby thread of ours per process, "pgbus-hub events", publishes them with
    # ActiveSupport::Notifications.instrument. It runs while a MasterHub or a
    # FailoverListener (or Listener) started in this process runs, and only when
    # ActiveSupport::Notifications is loaded; otherwise nothing is queued.
    module Events
      THREAD_NAME = "pgbus-hub events"

      # How long a stop waits for the thread to publish what is left: a wedged
      # subscriber never holds up a worker's exit.
      JOIN_SECONDS = 5.0

      # The thread's wait per call: a missed interrupt delays its end by at most this.
      POLL_SECONDS = 0.5

      LOCK = ::Mutex.new
      # Per process: a forked child starts with none of its parent's owners or thread.
      @pid = nil
      @owners = {}
      @thread = nil

      class << self
        # From a hub's or a listener's start (before it runs, so its first events are seen).
        # True if +owner+ was not held already.
        def retain(owner)
          return false unless defined?(::ActiveSupport::Notifications)

          LOCK.synchronize do
            forget_parent
            next false if @owners.key?(owner.__id__)

            @owners[owner.__id__] = true
            next true if @thread&.alive? && !@stopping

            # A thread still stopping publishes what is left first.
            @thread&.join(JOIN_SECONDS)
            enable
            @stopping = false
            @thread = ::Thread.new { publish_until_stopped }
            @thread.name = THREAD_NAME
            @thread.report_on_exception = false
            # Puma 7+ warns about threads started during app boot unless fork_safe.
            @thread.thread_variable_set(:fork_safe, true)
            true
          end
        end

        # From its stop: the last owner in this process stops the thread (bounded
        # join), after it has published what was queued.
        def release(owner)
          thread = LOCK.synchronize do
            next unless @pid == ::Process.pid && @owners.delete(owner.__id__) && @owners.empty?

            @stopping = true
            interrupt
            @thread
          end
          return unless thread

          thread.join(JOIN_SECONDS) unless thread.equal?(::Thread.current)
          LOCK.synchronize { disable if @owners.empty? }
        end

        # The publishing thread while it runs (nil once stopped).
        def thread
          @thread if @pid == ::Process.pid && @thread&.alive?
        end

        private

        def forget_parent
          return if @pid == ::Process.pid

          @pid = ::Process.pid
          @owners = {}
          @thread = nil
        end

        def publish_until_stopped
          loop do
            event = next_event(POLL_SECONDS)
            if event
              publish(*event)
            elsif @stopping
              break
            end
          end
        end

        # The payload's `duration` (where there is one) is the native measure;
        # the block is empty, so the instrumented time is not the event's.
        def publish(name, payload)
          ::ActiveSupport::Notifications.instrument(name, payload)
        rescue StandardError => e
          # A subscriber's bug must not end the thread.
          warn "[pgbus-hub] a subscriber to #{name} raised #{e.inspect}"
        end
      end
    end

    # Hubs and listeners hold the events thread while they run.
    module EventsOwner
      def start
        retained = Events.retain(self)
        super
      rescue ::Exception # rubocop:disable Lint/RescueException -- released whatever ended the start
        # Not for a second start of a running object (MasterHub's raises): it still runs.
        Events.release(self) if retained
        raise
      end

      def stop
        super
      ensure
        Events.release(self)
      end
    end

    MasterHub.prepend(EventsOwner)
    FailoverListener.prepend(EventsOwner)
  end
end
