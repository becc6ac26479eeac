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

# Every worker subscribes to the demo's topics as it boots, so each one's
# counter on the page moves with every broadcast (Puma 7 renamed the hook).
respond_to?(:before_worker_boot) ? before_worker_boot { DemoWorker.current } : on_worker_boot { DemoWorker.current }

# Demo control (the page's buttons, bin/demo's fail-over phase): SIGWINCH to
# the master stops its hub (socket closed and unlinked), the way the e2e specs
# "kill the hub": every worker then fails over to its own LISTEN connection.
# SIGURG starts it again at the same socket: the workers come back to it
# (fail-back) and close their own connections.
master = Process.pid
Signal.trap("WINCH") do
  Thread.new { Pgbus::Hub::SharedHub.stop if Process.pid == master }
end
Signal.trap("URG") do
  Thread.new do
    next unless Process.pid == master

    Pgbus::Hub::SharedHub.start(socket_path: ENV.fetch("PGBUS_STREAMS_HUB_SOCKET"), logger: Pgbus::Hub::Boot.logger,
                                **Pgbus::Hub.master_options)
  rescue StandardError => e
    warn "[demo] the hub did not start again: #{e.class}: #{e.message}"
  end
end
