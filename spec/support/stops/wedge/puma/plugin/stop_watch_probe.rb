# frozen_string_literal: true

require "puma/plugin"

# `plugin :stop_watch_probe` (spec/puma_main_stop_spec.rb only), after `plugin :pgbus_hub`: logs in
# each worker which Puma's server runs ("notify_safely in FILE": the checkout's, not the installed
# Puma) and, when its server thread is past the close of its pipes (Puma's :done state, fired right
# after that close), whether the plugin's stop watch was still running then: a watch alive at :done
# that logged no WARN line watched the whole close and let it return.
Puma::Plugin.create do
  def start(launcher)
    log = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
    launcher.events.register(:state) do |state|
      case state
      when :running
        log.log("stop_watch_probe: #{Process.pid} notify_safely in #{Puma::Server.instance_method(:notify_safely).source_location.first}")
      when :done
        watching = Thread.list.any? { |t| t.name == "pgbus-hub stop watch" && t.alive? }
        log.log("stop_watch_probe: #{Process.pid} closed, stop watch running: #{watching}")
      end
    end
  end
end
