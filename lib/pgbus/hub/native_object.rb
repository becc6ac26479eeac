# frozen_string_literal: true

module Pgbus
  module Hub
    # A named Ruby thread that never reaches a forked child (fork_safe: Puma 7+
    # warns about threads started during app boot otherwise).
    def self.thread(name, &body)
      thread = Thread.new do
        Thread.current.report_on_exception = false
        body.call
      end
      thread.name = name # named from the moment it is returned
      thread.thread_variable_set(:fork_safe, true)
      thread
    end

    # The Ruby side of the native classes (ext/pgbus_hub/src: MasterHub,
    # HubClient, FailoverListener and its subclass Listener, each resolving
    # its keywords into @options in Rust): the Ruby threads that carry what
    # native code produced into Ruby (native threads never call Ruby; each
    # waits in a native call without the GVL); a bounded stop, inert in a
    # forked child (the native side checks its owner pid too).
    module NativeObject
      def threads = [@pump, @log_thread].compact.select(&:alive?)

      def stop
        native_stop
        threads.each { |thread| thread.join(5) } if ::Process.pid == @owner_pid
        @pump = @log_thread = nil
        self
      end

      private

      # Called by the native start/connect once it succeeded.
      def start_threads(name)
        logger = @options[:logger]
        @log_thread = Hub.thread("#{name} log") { drain_logs(logger) } if logger
        @pump = Hub.thread("#{name} pump") { pump_wakes(logger) } if @options.key?(:dispatch_queue)
      end

      # [[severity, message], ...] batches to the user's Logger.
      def drain_logs(logger)
        while (batch = native_next_logs)
          batch.each do |severity, message|
            logger.add(severity, message, "pgbus-hub")
          rescue StandardError
            nil # a broken logger must not stop the drain
          end
        end
      end

      # Batches of wakes (built natively in pgbus's WakeMessage class, else
      # ours) into the dispatch queue; :failed runs on_failure at most once, on this Ruby thread.
      def pump_wakes(logger)
        on_failure = @options[:on_failure]
        while (batch = native_next_batch(logger))
          batch.each do |wake|
            next @options[:dispatch_queue] << wake unless wake == :failed

            failure, on_failure = on_failure, nil
            failure&.call
          rescue StandardError => e
            logger&.error("[pgbus-hub] #{self.class} pump: #{e.class}: #{e.message}") # keep pumping
          end
        end
      end
    end

    [MasterHub, HubClient, FailoverListener].each { |native| native.include(NativeObject) }
  end
end
