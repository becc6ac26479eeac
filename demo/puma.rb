# frozen_string_literal: true

# Puma config of the demo (bin/demo): a 4-worker cluster, preload_app!, and
# pgbus-hub's standalone plugin: ONE PostgreSQL LISTEN connection in the master.
workers Integer(ENV.fetch("DEMO_WORKERS", "4"))
threads 2, 4
bind "tcp://127.0.0.1:#{ENV.fetch('DEMO_PORT')}"
preload_app!
rackup File.join(__dir__, "config.ru")
worker_shutdown_timeout 3
plugin :pgbus_hub

# Demo control: SIGWINCH to the master stops its hub (socket closed and
# unlinked), the way the e2e specs "kill the hub": every worker then fails
# over to its own LISTEN connection.
master = Process.pid
Signal.trap("WINCH") do
  Thread.new { Pgbus::Hub::SharedHub.stop if Process.pid == master && defined?(Pgbus::Hub::SharedHub) }
end
