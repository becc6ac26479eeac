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
    # HubClient, FailoverListener and its subclass Listener): the Ruby threads
    # that carry what native code produced into Ruby, each looping on a native
    # call that waits without the GVL and hands over on this thread (wakes into
    # the dispatch queue, records to the logger); a bounded stop, inert in a
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
        @log_thread = Hub.thread("#{name} log") { nil while native_drain_logs(logger) } if logger
        @pump = Hub.thread("#{name} pump") { nil while native_deliver } if @options.key?(:dispatch_queue)
      end
    end

    [MasterHub, HubClient, FailoverListener].each { |native| native.include(NativeObject) }
  end
end
