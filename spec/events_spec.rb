# frozen_string_literal: true

require "rbconfig"
require_relative "support/database"

# ActiveSupport::Notifications events (docs/events.md). The events are seen
# for real in a Ruby of its own (spec/support/events_check.rb: ActiveSupport
# stays out of the suite's process), from a MasterHub and a FailoverListener
# through every fault they report.
RSpec.describe "ActiveSupport::Notifications events" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  it "publishes each event from our one thread, with the documented payloads, and stops that thread with the last owner" do
    script = File.join(__dir__, "support/events_check.rb")
    rubylib = [File.join(ROOT, "lib"), *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR)
    out = IO.popen({ "RUBYLIB" => rubylib }, [RbConfig.ruby, script], "rb", &:read)
    expect(Process.last_status).to be_success
    report = Marshal.load(out) # rubocop:disable Security/MarshalLoad -- our own child's output
    events = report[:events]
    expect(events.map { |_, _, thread| thread }.uniq).to eq([Pgbus::Hub::Events::THREAD_NAME])
    first = ->(name) { events.find { |event, _, _| event == name }&.at(1) }

    subscribe = first.call("subscribe.pgbus_hub")
    expect(subscribe).to include(queue: "ev_sub", via: :hub, outcome: :done, state: :on_hub)
    expect(subscribe[:duration]).to be_a(Float).and be >= 0
    own = events.find { |name, payload, _| name == "subscribe.pgbus_hub" && payload[:queue] == "ev_own" }&.at(1)
    expect(own).to include(via: :own_connection, outcome: :done, state: :standalone)
    reconnects = events.select { |name, _, _| name == "reconnect.pgbus_hub" }.map { |_, payload, _| payload }
    expect(reconnects).to eq([{ state: :listening, queues: 0, reconnects: 1 }, { state: :listening, queues: 1, reconnects: 2 }])
    health = events.select { |name, _, _| name == "hub_health.pgbus_hub" }.map { |_, payload, _| payload }
    expect(health.first(2)).to eq([{ healthy: false }, { healthy: true }])
    expect(first.call("drop.pgbus_hub")).to include(queue: "ev_flood", pid: Integer, connection: Integer, wake: :durable)
    expect(first.call("drop.pgbus_hub")[:dropped]).to be >= 1
    expect(first.call("evict.pgbus_hub")).to include(reason: :not_draining, pid: Integer, connection: Integer)
    # The hub's stop moved the worker at a marker, and the new hub took it back at one: nothing to re-read.
    expect(first.call("fail_over.pgbus_hub")).to include(state: :failed_over, subscriptions: 1, woken: 0, aligned: true)
    expect(first.call("fail_back.pgbus_hub")).to include(state: :on_hub, subscriptions: 1, woken: 0, aligned: true)

    expect(report[:steps]).to include(ensure_listening: :done, threads_running: 1, threads_after_second_starts: 1,
                                      threads_with_the_hub_alone: 1,
                                      second_start: "master hub is already running",
                                      threads_while_only_the_listener_runs: 1, state_after_fail_back: :on_hub,
                                      threads_after_stop: 0, enabled_after_stop: false)
  end

  it "queues nothing and starts no thread without ActiveSupport" do
    skip "ActiveSupport is loaded in this process" if defined?(ActiveSupport::Notifications)

    listener = Pgbus::Hub::Listener.new(connection: TestDatabase.url, dispatch_queue: Queue.new).start
    expect(listener.ensure_listening("ev_plain")).to eq(:done)
    expect(Pgbus::Hub::Events.stats).to eq(enabled: false, queued: 0, dropped: 0)
    expect(Thread.list.map(&:name)).not_to include(Pgbus::Hub::Events::THREAD_NAME)
  ensure
    listener&.stop
  end
end
