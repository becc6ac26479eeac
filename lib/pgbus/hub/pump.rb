# frozen_string_literal: true

module Pgbus
  module Hub
    # The Ruby thread that moves wakes from native code into a dispatch queue.
    # `next_batch` (a native call that waits without the GVL) returns
    # [[queue, payload], ..., [:failed, reason]] or nil once the source is
    # stopped. `on_failure` runs here, on this Ruby thread, at most once.
    module Pump
      module_function

      def start(name:, dispatch_queue:, wake:, on_failure: nil, logger: nil, &next_batch)
        thread = Thread.new do
          Thread.current.report_on_exception = false
          failed = false
          while (batch = next_batch.call)
            batch.each do |queue, payload|
              if queue == :failed
                next if failed

                failed = true
                run_failure(on_failure, logger)
              else
                dispatch_queue << wake.call(queue, payload)
              end
            end
          end
        end
        thread.name = name # set here, not in the thread: named from the moment it is returned
        # Never used by a forked child (Puma 7+ warns about threads started in app boot unless marked).
        thread.thread_variable_set(:fork_safe, true)
        thread
      end

      def run_failure(on_failure, logger)
        on_failure&.call
      rescue StandardError => e
        logger&.error("[pgbus-hub] on_failure raised #{e.class}: #{e.message}")
      end
    end
  end
end
