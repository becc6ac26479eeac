# frozen_string_literal: true

module Pgbus
  module Hub
    # Native threads never call Ruby: they queue log records, and this Ruby
    # thread forwards them to the user's Logger. `next_batch` is a block that
    # waits without the GVL and returns [[severity, message], ...] or nil when done.
    module LogDrain
      module_function

      def start(logger, name, &next_batch)
        return nil unless logger

        thread = Thread.new do
          Thread.current.report_on_exception = false
          while (batch = next_batch.call)
            batch.each do |severity, message|
              logger.add(severity, message, "pgbus-hub")
            rescue StandardError
              nil # a broken logger must not kill the drain (the hub keeps running)
            end
          end
        end
        thread.name = name # set here, not in the thread: named from the moment it is returned
        # Never used by a forked child (Puma 7+ warns about threads started in app boot unless marked).
        thread.thread_variable_set(:fork_safe, true)
        thread
      end
    end
  end
end
