# frozen_string_literal: true

require "puma/plugin"

# `plugin :wedge_stop` (spec/puma_stuck_close_spec.rb only): as a worker's server stops, its thread
# enters an IO#close that never returns (a popen'd child that never exits: close waits for it), the
# state Puma's server thread is left in by puma#3677. Logs "wedge_stop: PID wedged", and
# "wedge_stop: PID exited on its own" at exit unless the master had to kill the worker.
Puma::Plugin.create do
  def start(launcher)
    log = launcher.respond_to?(:log_writer) ? launcher.log_writer : launcher.events
    launcher.events.register(:state) do |state|
      next unless state == :stop

      child = IO.popen(%w[sleep 120])
      at_exit do
        Process.kill("KILL", child.pid) rescue nil # rubocop:disable Style/RescueModifier
        log.log("wedge_stop: #{Process.pid} exited on its own")
      end
      log.log("wedge_stop: #{Process.pid} wedged")
      child.close
    end
  end
end
