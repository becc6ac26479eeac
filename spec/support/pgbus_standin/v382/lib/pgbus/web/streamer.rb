# frozen_string_literal: true

module Pgbus
  module Web
    # STAND-IN: the per-process Streamer entry points (current / reset!).
    module Streamer
      @mutex = Mutex.new
      @current = nil
      @pid = nil

      class << self
        # TEST SEAM (not pgbus): called with every WakeMessage the dispatcher pops.
        attr_accessor :on_wake

        def current
          @mutex.synchronize do
            @current = nil unless @pid == ::Process.pid
            @pid = ::Process.pid
            @current ||= Instance.new.start
          end
        end

        def reset!
          instance = @mutex.synchronize do
            taken = @pid == ::Process.pid ? @current : nil
            @current = nil
            taken
          end
          leaked = instance&.shutdown!
          Pgbus.logger.info("[Pgbus::Streamer] reset! (pid #{::Process.pid})")
          leaked # 0.15+: names of threads alive after the shutdown ([] for none), nil without an instance
        end
      end
    end
  end
end
