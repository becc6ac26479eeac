# frozen_string_literal: true

module ActionCable
  module SubscriptionAdapter
    class PgbusHub < Base
      # The adapter's callbacks, run one at a time in the order they were posted, on
      # the executor Rails' adapter posts to. That executor (the event loop's; 8.2:
      # the server's) runs each task on a pool of threads, which reorders a burst: a
      # black hole's backlog or a SIGSTOPped worker's reached clients out of order
      # (the soak counted 236). One drain task at a time keeps the order the
      # listener delivered in, which is NOTIFY order, and paces a burst into
      # ActionCable's worker pool (below).
      class InOrder
        # Tasks waiting at most; past it the listener's pump waits (the hub's
        # backpressure then applies, as for any slow worker) rather than the queue
        # growing without end.
        LIMIT = 10_000

        def initialize(executor, logger: nil, limit: LIMIT)
          @executor = executor
          @logger = logger
          @limit = limit
          @tasks = []
          @lock = Mutex.new
          @room = ConditionVariable.new
          @draining = false
          @closed = false
        end

        def post(&task)
          start = @lock.synchronize do
            # A timed wait: #close (which signals) must never be missed for good.
            @room.wait(@lock, 0.1) while @tasks.size >= @limit && !@closed
            return if @closed

            @tasks << task
            !@draining && (@draining = true)
          end
          @executor.post { drain } if start
        end

        # Shutdown: what still waits is dropped, a waiting post returns.
        def close
          @lock.synchronize do
            @closed = true
            @tasks.clear
            @room.broadcast
          end
        end

        private

        def drain
          while (task = next_task)
            begin
              task.call
            rescue StandardError => e
              @logger&.error("[pgbus-hub] an ActionCable callback raised #{e.class}: #{e.message}")
            end
            # Lets ActionCable's worker pool take this callback's task before the next one is
            # handed to it. Its threads transmit concurrently: consecutive messages of one client
            # in the pool at once can leave out of order (the soak: 8 to 34 per SIGSTOP or black
            # hole without this line, 0 with it). Rails' listener gives up the GVL for every
            # notification it reads, which paces its bursts the same way.
            Thread.pass
          end
        ensure
          # Left by an exception that is not a StandardError (Thread#kill): the next post drains the rest.
          @lock.synchronize { @draining = false } if task
        end

        def next_task
          @lock.synchronize do
            task = @tasks.shift
            @draining = false unless task
            @room.signal
            task
          end
        end
      end
    end
  end
end
