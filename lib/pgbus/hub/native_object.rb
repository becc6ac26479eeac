# frozen_string_literal: true

module Pgbus
  module Hub
    # The Ruby side of the native classes (MasterHub, HubClient, FailoverListener
    # and its subclass Listener): a pump and a log thread, each looping on a
    # native call that waits without the GVL, then hands wakes to the dispatch
    # queue or records to the logger on its own Ruby thread; a bounded stop,
    # inert in a forked child (the native side checks its owner pid too).
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
        @log_thread = named_thread("#{name} log") { nil while native_drain_logs(logger) } if logger
        @pump = named_thread("#{name} pump") { nil while native_deliver } if @options.key?(:dispatch_queue)
      end

      # fork_safe: Puma 7+ warns about threads started during app boot otherwise.
      def named_thread(name, &body)
        Thread.new(&body).tap do |thread|
          thread.report_on_exception = false
          thread.name = name
          thread.thread_variable_set(:fork_safe, true)
        end
      end
    end

    [MasterHub, HubClient, FailoverListener].each { |native| native.include(NativeObject) }
  end
end
