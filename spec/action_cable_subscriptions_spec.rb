# frozen_string_literal: true

require "timeout"
require_relative "support/database"
require_relative "support/held_relay"

begin
  require "action_cable"
  require "action_cable/subscription_adapter/pgbus_hub"
rescue LoadError => e
  CABLE_SUBSCRIPTIONS_MISSING = e.message
end

# The adapter's subscriber map in-process, on a real Listener whose first
# connection a relay holds, so its LISTEN stays on its way while subscribers
# come: none may be confirmed before it is active. Rails' SubscriberMap
# confirms a channel's later subscribers at once (so does Rails' postgresql
# adapter): a message sent before that LISTEN reached none of them, yet they
# were confirmed (the soak's hot restart lost one so, on two clients of a new
# worker, while connected).
RSpec.describe "ActionCable adapter pgbus_hub: confirmations" do
  before do
    skip "ActionCable not loadable: #{CABLE_SUBSCRIPTIONS_MISSING}" if defined?(CABLE_SUBSCRIPTIONS_MISSING)
    skip "no PostgreSQL" unless TestDatabase.available?
  end

  # Runs callbacks where they are posted (Rails' event loop runs them on its own thread).
  INLINE = Object.new.tap { |executor| executor.define_singleton_method(:post) { |&block| block.call } }

  it "confirms no subscriber of a channel before that channel's LISTEN is active" do
    relay = HeldRelay.new
    confirmed = Queue.new
    got = Queue.new
    subscriptions = ActionCable::SubscriptionAdapter::PgbusHub::Subscriptions.new(INLINE) do |wakes, on_listening|
      Pgbus::Hub::Listener.new(connection: TestDatabase.keywords(host: "127.0.0.1", port: relay.port),
                               dispatch_queue: wakes, on_listening: on_listening, health_check_ms: 100).start
    end
    room = "cable_confirm_#{Process.pid}_#{rand(1 << 30).to_s(36)}"
    %w[first second third].each do |name|
      subscriptions.add_subscriber(room, ->(message) { got << [name, message] }, -> { confirmed << name })
    end
    sleep 0.5 # the LISTEN is held: nothing may be confirmed meanwhile
    expect(confirmed.size).to eq(0)

    relay.release
    expect(Timeout.timeout(10) { Array.new(3) { confirmed.pop } }).to contain_exactly("first", "second", "third")
    TestDatabase.notify(room, "hello", prefix: "", suffix: "")
    expect(Timeout.timeout(5) { Array.new(3) { got.pop } }).to contain_exactly(%w[first hello], %w[second hello],
                                                                              %w[third hello])
    # Its LISTEN active: a later subscriber is confirmed at once.
    subscriptions.add_subscriber(room, ->(_) {}, -> { confirmed << "fourth" })
    expect(confirmed.pop(true)).to eq("fourth")
  ensure
    subscriptions&.shutdown
    relay&.close
  end
end

# A burst (a black hole's backlog, a SIGSTOPped worker's) through Rails' own event loop, whose
# executor runs each posted task on a pool of up to 10 threads: every subscriber gets the
# channel's messages in the order they were NOTIFYed (the soak counted 236 out of order on this
# adapter where Rails' postgresql adapter, slower to hand a burst on, showed 0).
RSpec.describe "ActionCable adapter pgbus_hub: order" do
  before do
    skip "ActionCable not loadable: #{CABLE_SUBSCRIPTIONS_MISSING}" if defined?(CABLE_SUBSCRIPTIONS_MISSING)
    skip "no PostgreSQL" unless TestDatabase.available?
  end

  it "hands a burst to each subscriber in NOTIFY order through Rails' event loop" do
    require "concurrent" # loaded by ActionCable's server in an app; the event loop needs them
    require "nio"
    event_loop = ActionCable::Connection::StreamEventLoop.new
    confirmed = Queue.new
    seen = Hash.new { |h, k| h[k] = [] }
    lock = Mutex.new
    subscriptions = ActionCable::SubscriptionAdapter::PgbusHub::Subscriptions.new(event_loop) do |wakes, on_listening|
      Pgbus::Hub::Listener.new(connection: TestDatabase.url, dispatch_queue: wakes, on_listening: on_listening).start
    end
    room = "cable_order_#{Process.pid}_#{rand(1 << 30).to_s(36)}"
    %w[first second].each do |name|
      # sleep: a callback that gives up the GVL for a moment (ActionCable's hands off to its worker pool).
      subscriptions.add_subscriber(room, ->(m) { sleep 0.0002; lock.synchronize { seen[name] << m.to_i } }, -> { confirmed << name })
    end
    Timeout.timeout(10) { 2.times { confirmed.pop } }
    burst = 2000
    TestDatabase.with do |conn|
      conn.transaction { (1..burst).each { |i| conn.exec_params("select pg_notify($1, $2)", [room, i.to_s]) } }
    end
    Timeout.timeout(30) { sleep 0.05 until lock.synchronize { seen.values.sum(&:size) } == 2 * burst }
    lock.synchronize do
      expect(seen.transform_values { |got| got.each_cons(2).count { |a, b| b < a } }).to eq("first" => 0, "second" => 0)
      expect(seen.values).to all(eq((1..burst).to_a))
    end
  ensure
    subscriptions&.shutdown
    event_loop&.stop
  end
end
