# frozen_string_literal: true

# Runs in a child process with one stand-in shape on $LOAD_PATH (tests only):
#   PGBUS_STANDIN_VERSION=0.15.0 ruby -I lib -I spec/support/pgbus_standin/<shape>/lib surface_probe.rb DATABASE_URL DIR
# Builds each object pgbus-hub hands this pgbus release the way pgbus builds it, takes it through
# its states (PgbusCalls::STATES: failed over at start, on the hub after a fail-back, on the hub,
# failed over, stopped; our listener's #state read in each) and makes
# there every call spec/support/pgbus_calls.rb lists for the release. Prints one JSON report:
# objects -> object -> state -> method -> what came back (or the error raised).
require "json"
require "pgbus"
require "pgbus/hub"
require_relative "../pgbus_calls"

url, dir = ARGV
Pgbus.logger = Logger.new(File::NULL)
config = Pgbus.configuration
config.streams_enabled = true
config.database_url = url
config.streams_listen_scope = :master
calls = PgbusCalls.calls(Pgbus::VERSION)
objects = Hash.new { |hash, key| hash[key] = {} }
report = { version: Pgbus::VERSION, installed: Pgbus::Hub::PgbusAdapter.shape, objects: objects, states: {} }
hub_path = File.join(dir, "hub.sock")
ENV["PGBUS_STREAMS_HUB_SOCKET"] = hub_path

def outcome(value, receiver)
  return { "self" => true } if value.equal?(receiver)
  return { "class" => "Array", "size" => value.size, "threads" => value.all?(Thread) } if value.is_a?(Array)

  { "class" => value.class.name, "value" => value.is_a?(Symbol) ? value.to_s : value }
end

# Every call listed for +object+ in +state+; the lifecycle ones (connect, start, stop: made in
# only some states) first, so a stopped object is stopped before it is asked anything.
record = lambda do |object, state, receiver|
  due = calls.select { |call| call.object == object && call.states.include?(state) }
  due.sort_by { |call| call.states == PgbusCalls::STATES.fetch(object) ? 1 : 0 }.each do |call|
    args = call.args.empty? ? [] : ["pgbus_surface"]
    objects[object][state] = objects[object].fetch(state, {}).merge(
      call.method => begin
        outcome(receiver.public_send(call.method, *args), receiver)
      rescue StandardError, NotImplementedError => e
        { "error" => "#{e.class}: #{e.message.lines.first.to_s[0, 160]}" }
      end
    )
  end
  ours = receiver.respond_to?(:listener) ? receiver.listener : receiver
  (report[:states][object] ||= {})[state] = ours.state.to_s if ours.respond_to?(:state)
end

def wait_for(seconds = 10)
  deadline = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) + seconds
  sleep 0.05 until yield || ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) > deadline
  yield
end

start_hub = -> { Pgbus::Hub::SharedHub.start(socket_path: hub_path, logger: nil, **Pgbus::Hub::PgbusAdapter.master_options) }
failures = []
# Read off our listener, not the call under test (a missing dead? must fail its row, not the probe).
listener_of = ->(o) { o.respond_to?(:listener) ? o.listener : o }
away = ->(o) { listener_of.call(o).failed_over? }
# A fail-back ends at the hub's marker (the aligned fail-back): failing_back until then.
back = ->(o) { listener_of.call(o).state.to_s == "on_hub" }
# Built as pgbus builds them: its Instance (0.13.1+: HubClient.new, then connect) or, before 0.13.1,
# Listener.new with the worker's own connection (which pgbus-hub closes and replaces).
build = if report[:installed] == :hub_era
          [:hub_client, lambda do
            Pgbus::Web::Streamer::HubClient.new(socket_path: hub_path, dispatch_queue: Queue.new, ack_timeout: 2.25,
                                                on_failure: -> { failures << :called }, logger: Pgbus.logger)
          end]
        else
          [:listener, lambda do
            Pgbus::Web::Streamer::Listener.new(pg_connection: PG.connect(url), dispatch_queue: Queue.new,
                                               health_check_ms: 250, logger: Pgbus.logger)
          end]
        end
object, make = build
first = make.call
record.call(object, :failed_over_at_start, first)
start_hub.call
wait_for { back.call(first) }
record.call(object, :on_hub_after_fail_back, first)
second = make.call
record.call(object, :on_hub, second)
Pgbus::Hub::SharedHub.stop
wait_for { away.call(second) }
record.call(object, :failed_over, second)
record.call(object, :stopped, second)
first.stop
report[:on_failure_calls] = failures.size

if report[:installed] == :hub_era
  master = Pgbus::Web::Streamer::MasterHub.new(socket_path: File.join(dir, "master.sock"), config: config,
                                               logger: Pgbus.logger, status_interval: 0.5)
  record.call(:master_hub, :started, master)
  record.call(:master_hub, :stopped, master)
end

# pgbus 0.15+'s shutdown: the streamer's threads taken before the stops, those alive after them reported.
if Pgbus.respond_to?(:reports_leaks?) && Pgbus.reports_leaks?
  report[:shutdowns] = %i[on_hub failed_over].map do |state|
    start_hub.call
    instance = Pgbus::Web::Streamer.current
    instance.subscribe("surface")
    if state == :failed_over
      Pgbus::Hub::SharedHub.stop
      wait_for { away.call(instance.listener.instance_variable_get(:@hub_client)) }
    end
    before = instance.listener.threads.size
    leaked = Pgbus::Web::Streamer.reset!
    Pgbus::Hub::SharedHub.stop
    { state: state, threads_before: before, leaked: leaked }
  end
end
puts JSON.generate(report)
