# frozen_string_literal: true

# Runs in a child process with one stand-in shape on $LOAD_PATH (tests only):
#   ruby -I lib -I spec/support/pgbus_standin/<shape>/lib probe.rb DATABASE_URL [hub-first]
# Prints one JSON report of the pgbus seams as pgbus-hub wired them.
require "json"
require "logger"
require "stringio"
order = ARGV[1] == "hub-first" ? ["pgbus/hub", "pgbus"] : ["pgbus", "pgbus/hub"]
order.each { |lib| require lib }
Pgbus::Hub::PgbusAdapter.install! # what the first Pgbus.configure does when pgbus came second
Pgbus.logger = Logger.new(File::NULL)
report = { shape: Pgbus::STANDIN_SHAPE, installed: Pgbus::Hub::PgbusAdapter.shape }
config = Pgbus.configuration
report[:default_scope] = config.streams_listen_scope
report[:errors] = [42, "nope", :bogus].map do |value|
  config.streams_listen_scope = value
  nil
rescue Pgbus::ConfigurationError => e
  e.message
end
config.streams_listen_scope = "process"
report[:string_scope] = config.streams_listen_scope
config.streams_enabled = true
config.database_url = ARGV[0]
config.streams_listen_scope = :master

local = Pgbus::Web::Streamer::Instance.new
report[:no_socket_listener] = local.listener.class.name
local.shutdown!

path = File.join(Dir.tmpdir, "pgbus-hub-probe-#{Process.pid}.sock")
hub = Pgbus::Hub::SharedHub.start(socket_path: path, logger: nil, **Pgbus::Hub::PgbusAdapter.master_options)
ENV["PGBUS_STREAMS_HUB_SOCKET"] = path
got = Queue.new
# Bounded: re-NOTIFY every 0.5 s (a concurrent suite may terminate pgbus-listen backends).
deliver = lambda do |payload|
  20.times do
    PG.connect(ARGV[0]) { |c| c.exec_params("select pg_notify('pgmq.q_pgbus_probe.INSERT', $1)", [payload]) }
    deadline = Time.now + 0.5
    sleep 0.01 while got.empty? && Time.now < deadline
    return got.pop.to_h unless got.empty?
  end
  nil
end
Pgbus::Web::Streamer.on_wake = ->(m) { got << m }
instance = Pgbus::Web::Streamer.current
report[:hub_listener] = instance.listener.class.name
# pgbus 0.13.1+'s FailoverListener holds ours (a FailoverListener subclass) as its hub client; older pgbus gets ours directly
ours = instance.listener.is_a?(Pgbus::Hub::FailoverListener) ? instance.listener : instance.listener.instance_variable_get(:@hub_client)
report[:our_listener] = ours.class.name
report[:subscribe] = instance.subscribe("probe")
report[:ephemeral] = deliver.call("eph")
report[:hub_workers] = hub.stats[:workers]
Pgbus::Hub::SharedHub.stop
deadline = Time.now + 5
sleep 0.05 until ours.failed_over? || Time.now > deadline
report[:failed_over] = ours.failed_over?
report[:pgbus_failed_over] = !ours.equal?(instance.listener) && instance.listener.failed_over?
got.clear
report[:durable_after_failover] = deliver.call("")
report[:socket_left] = File.exist?(path)
hub = Pgbus::Hub::SharedHub.start(socket_path: path, logger: nil, **Pgbus::Hub::PgbusAdapter.master_options)
deadline = Time.now + 10
# A fail-back ends at the hub's marker (the aligned fail-back): failing_back until then.
sleep 0.05 while ours.state != :on_hub && Time.now < deadline
report[:back_on_hub] = !ours.failed_over?
got.clear
report[:durable_after_fail_back] = deliver.call("")
report[:hub_workers_after_fail_back] = hub.stats[:workers]
Pgbus::Hub::SharedHub.stop
if defined?(Pgbus::Web::Streamer::MasterHub)
  ruby_hub = Pgbus::Web::Streamer::MasterHub.new(config: config, socket_path: "#{path}.2").start
  report[:pgbus_master_hub_native] = ruby_hub.native_hub.class.name
  report[:pgbus_master_hub_dropped] = ruby_hub.dropped_durable_wakes
  ruby_hub.stop
  report[:pgbus_master_hub_socket_left] = File.exist?("#{path}.2")
  # The tuning rule: pgbus's MasterHub.new tuning where Pgbus::Hub.configure left the default.
  warnings = StringIO.new
  tuned = lambda do
    hub = Pgbus::Web::Streamer::MasterHub.new(config: config, socket_path: "#{path}.3", durable_queue_limit: 7,
                                              logger: Logger.new(warnings)).start
    hub.native_hub.stats[:limits]["durable_queue_limit"].tap { hub.stop }
  end
  report[:tuning_pgbus_only] = tuned.call
  Pgbus::Hub.configure { |c| c.durable_queue_limit = 9 }
  report[:tuning_both] = tuned.call
  report[:tuning_warnings] = warnings.string.lines.grep(/WARN/).map { |line| line[/\[pgbus-hub\].*/] }
end
Pgbus::Web::Streamer.reset!
puts JSON.generate(report)
