# frozen_string_literal: true

# Puma config for the e2e specs (tests only), driven by PGBUS_E2E_* variables.
workers Integer(ENV.fetch("PGBUS_E2E_WORKERS", "4"))
threads 1, 1
bind "tcp://127.0.0.1:#{ENV.fetch('PGBUS_E2E_PORT')}"
preload_app! ENV["PGBUS_E2E_PRELOAD"] == "1"
fork_worker if ENV["PGBUS_E2E_FORK_WORKER"] == "1"
rackup ENV.fetch("PGBUS_E2E_RACKUP") { File.join(__dir__, "config.ru") }
worker_shutdown_timeout 5
# puma.rb may load pgbus itself (then pgbus's own plugin can boot its MasterHubBoot).
ENV.fetch("PGBUS_E2E_PUMA_RB_REQUIRES", "").split(",").each { |lib| require lib }
ENV.fetch("PGBUS_E2E_PLUGINS", "pgbus_streams").split(",").each { |name| plugin name.to_sym }

state_dir = ENV.fetch("PGBUS_E2E_STATE_DIR")

# Standalone apps may configure in the master (the hub then runs without
# preload_app!, which is what phased restarts need).
if ENV["PGBUS_E2E_CONFIGURE_IN_MASTER"] == "1"
  require "pgbus/hub"
  Pgbus::Hub.configure do |c|
    c.connection = ENV.fetch("PGBUS_E2E_HUB_DATABASE_URL") { ENV.fetch("PGBUS_E2E_DATABASE_URL") }
    c.channel_prefix = ""
    c.channel_suffix = ""
    c.health_check_ms = 100
  end
end

# Test controls in the master: SIGWINCH stops the hub (the "kill the hub"
# scenario), SIGURG starts it again at the same socket (fail-back; with
# fork_worker, Puma's own SIGURG refork replaces this trap); a thread publishes
# the hub's stats for the spec to read.
master = Process.pid
Signal.trap("WINCH") do
  Thread.new { Pgbus::Hub::SharedHub.stop if Process.pid == master && defined?(Pgbus::Hub::SharedHub) }
end
Signal.trap("URG") do
  Thread.new do
    next unless Process.pid == master

    Pgbus::Hub::SharedHub.start(socket_path: ENV.fetch("PGBUS_STREAMS_HUB_SOCKET"), logger: Pgbus::Hub::Boot.logger,
                                **Pgbus::Hub.master_options)
  end
end
Thread.new do
  loop do
    hub = defined?(Pgbus::Hub::SharedHub) ? Pgbus::Hub::SharedHub.current : nil
    info = { pid: Process.pid, running: hub&.running? || false, stats: hub&.stats || {},
             socket: ENV["PGBUS_STREAMS_HUB_SOCKET"] }
    path = File.join(state_dir, "hub-#{Process.pid}.json")
    File.write("#{path}.tmp", JSON.generate(info))
    File.rename("#{path}.tmp", path)
    sleep 0.2
  rescue StandardError
    sleep 0.2
  end
end
require "json"
