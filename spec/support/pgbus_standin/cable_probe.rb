# frozen_string_literal: true

# Runs in a child process with the pre-0.13.1 stand-in on $LOAD_PATH (tests only): pgbus whose
# WakeMessage has no payload, loaded beside ActionCable's pgbus_hub adapter in one process.
#   ruby -I lib -I spec/support/pgbus_standin/pre382/lib cable_probe.rb DATABASE_URL
# Prints one JSON report: the message a subscriber got through the adapter, and the log.
require "json"
require "logger"
require "stringio"
require "timeout"
require "pgbus"
require "pgbus/hub"
require "action_cable"
require "action_cable/subscription_adapter/pgbus_hub"

log = StringIO.new
Pgbus.logger = Logger.new(log)
# What the adapter asks of ActionCable's server: its cable.yml, logger and event loop.
inline = Object.new.tap { |executor| executor.define_singleton_method(:post) { |&block| block.call } }
server = Struct.new(:config, :logger, :event_loop)
               .new(Struct.new(:cable).new({ "adapter" => "pgbus_hub", "url" => ARGV.fetch(0) }), Logger.new(log), inline)
adapter = ActionCable::SubscriptionAdapter::PgbusHub.new(server)
room = "cable_probe_#{Process.pid}"
got = Queue.new
confirmed = Queue.new
adapter.subscribe(room, ->(message) { got << message }, -> { confirmed << true })
report = { pgbus_wake_members: Pgbus::Web::Streamer::Listener::WakeMessage.members }
report[:confirmed] = (Timeout.timeout(10) { confirmed.pop } rescue false) # rubocop:disable Style/RescueModifier
adapter.broadcast(room, "hello")
report[:got] = (Timeout.timeout(5) { got.pop } rescue nil) # rubocop:disable Style/RescueModifier
adapter.shutdown
report[:log] = log.string.lines.grep(/WARN|ERROR/).map(&:strip)
puts JSON.generate(report)
