# frozen_string_literal: true

require "logger"

module Pgbus
  module Hub
    # Logger-compatible writer over Puma's log (5.6: launcher.events; 6+: launcher.log_writer).
    class PumaLog < ::Logger
      def initialize(launcher)
        writer = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
        super(nil, level: ::Logger::INFO)
        @writer = writer
      end

      def add(severity, message = nil, progname = nil)
        return true if (severity ||= UNKNOWN) < level

        message = yield if message.nil? && block_given?
        @writer.log("#{format_severity(severity)} #{message || progname}")
        true
      end
    end

    # The body of `plugin :pgbus_hub` / `plugin :pgbus_streams`, through Puma's
    # public plugin API only (5.6 to 8): in the master, once Puma knows it runs
    # workers, arm the boot (the hub then starts right before the first fork);
    # stop it on stop and before a hot restart's exec.
    module PumaPlugin
      def config(dsl)
        dsl.public_send(dsl.respond_to?(:before_restart) ? :before_restart : :on_restart) do
          Boot.teardown("hot restart")
        end
      end

      def start(launcher)
        log = PumaLog.new(launcher)
        if launcher.options[:workers].to_i.positive?
          Boot.arm(logger: log)
        else
          log.info("[pgbus-hub] single mode: no master hub; the process uses its own listener")
        end
        events = launcher.events
        events.public_send(events.respond_to?(:after_stopped) ? :after_stopped : :on_stopped) { Boot.teardown("stop") }
      end
    end
  end
end
