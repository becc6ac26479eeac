# frozen_string_literal: true

require "logger"
require "stringio"
require "timeout"
require_relative "support/database"
require_relative "support/native_wait"
require_relative "support/held_relay"

RSpec.describe Pgbus::Hub::Listener do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  def pop(queue, timeout: 5)
    Timeout.timeout(timeout) { queue.pop }
  end

  def listener(**options)
    l = described_class.new(connection: TestDatabase.url, dispatch_queue: options.delete(:queue) || Queue.new,
                            health_check_ms: 100, **options)
    (@listeners ||= []) << l
    l
  end

  after { @listeners&.each(&:stop) }

  it "acks only once LISTEN is active and delivers durable and ephemeral wakes" do
    queue = Queue.new
    l = listener(queue: queue).start
    expect(l.start).to equal(l)
    expect(l.ensure_listening("pgbus_orders")).to eq(:done)
    TestDatabase.notify("pgbus_orders")
    TestDatabase.notify("pgbus_orders", "<p>ephemeral</p>")
    expect(pop(queue)).to have_attributes(queue_name: "pgbus_orders", payload: nil)
    expect(pop(queue)).to have_attributes(queue_name: "pgbus_orders", payload: "<p>ephemeral</p>")
    expect(l).to be_connected
    expect(l.state).to eq(:standalone) # no hub to try
    expect(l.stats).to include(state: :standalone, listener_state: :listening, channels: 1, healthy: true)
  end

  # Issue 57: a worker's own connection takes standby: true too (after a fail-over, or without a hub).
  it "runs a standby beside its own connection with standby: true, and says so in its stats" do
    queue = Queue.new
    l = listener(queue: queue, standby: true).start
    expect(l.ensure_listening("pgbus_standby_own")).to eq(:done)
    wait_for("the standby aligned") { l.stats[:standby_aligned] }
    expect(l.stats).to include(listen_connections: 2, standby_promotions: 0)
    TestDatabase.notify("pgbus_standby_own", "once")
    expect(pop(queue)).to have_attributes(queue_name: "pgbus_standby_own", payload: "once")
    expect { listener(standby: "yes") }.to raise_error(ArgumentError, 'Listener: standby must be true or false, got "yes"')
  end

  # `rake bench` once saw a fresh listener answer nil (its first LISTEN not
  # confirmed within listen_ack_timeout): fresh listeners in a row, and at once
  # in forked children (the first connect racing the first LISTEN), all confirm.
  it "confirms the first LISTEN of 500 fresh listeners in a row and of 32 started at once after a fork" do
    answers = Array.new(500) do |i|
      l = described_class.new(connection: TestDatabase.url, dispatch_queue: Queue.new).start
      l.ensure_listening("pgbus_fresh_#{i}").tap { l.stop }
    end
    expect(answers.tally).to eq(done: 500)
    # On Ruby 3.3 a few children's first wait was cut short at once by an unblock call with no
    # interrupt pending (nil in 0.0 s, the listener connected a moment later): see the wake-up example.
    children = Array.new(32) do |i|
      reader, writer = IO.pipe
      pid = fork do
        reader.close
        l = described_class.new(connection: TestDatabase.url, dispatch_queue: Queue.new).start
        answer = l.ensure_listening("pgbus_forked_#{i}")
        writer.puts(answer ? answer.inspect : "nil #{l.stats.inspect}")
        l.stop
        exit!(0)
      end
      writer.close
      [pid, reader]
    end
    forked = children.map do |pid, reader|
      reader.read.strip.tap do
        reader.close
        ::Process.wait(pid)
      end
    end
    expect(forked.reject { |answer| answer == ":done" }).to eq([])
  end

  # A listener whose first connection is held `hold` seconds by a relay in
  # front of the test server (yielded, then stopped; the example fails if the
  # relay's backend outlives it).
  def with_first_connection_held(hold)
    relay = HeldRelay.new(hold: hold)
    l = described_class.new(connection: TestDatabase.keywords(host: "127.0.0.1", port: relay.port),
                            dispatch_queue: Queue.new, health_check_ms: 100)
    (@listeners ||= []) << l
    yield l.start
  ensure
    l&.stop
    relay&.close
  end

  # The cause found in CI: 32 listeners forked at once on 2 loaded cores took
  # longer than listen_ack_timeout (health check + 1 s) to connect (TLS,
  # authentication), and that budget covers a LISTEN on a live connection.
  it "waits out a slow first connection before its first LISTEN times out" do
    with_first_connection_held(1.6) do |l| # longer than this listener's listen_ack_timeout (1.1 s)
      started = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
      expect(l.ensure_listening("pgbus_slow_first")).to eq(:done)
      expect(::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - started).to be >= 1.6
    end
  end

  # Ruby calls a waiting thread's unblock function with nothing to act on
  # (Thread#wakeup; on Ruby 3.3, the first wait in a freshly forked child):
  # the wait resumes instead of answering nil.
  it "resumes its wait after a wake-up that is not an interrupt" do
    with_first_connection_held(1.0) do |l|
      waiter = Thread.new { l.ensure_listening("pgbus_woken") }
      NativeWait.await_inside(waiter, "ensure_listening")
      waiter.wakeup
      expect(waiter.value).to eq(:done)
    end
  end

  it "reports its live threads (pump, log drain) for pgbus's leak check; [] after stop" do
    l = listener(logger: Logger.new(StringIO.new)).start
    expect(l.threads.map(&:name)).to contain_exactly("pgbus-hub listener pump", "pgbus-hub listener log")
    l.stop
    expect(l.threads).to eq([])
  end

  it "keeps delivering and logging when the app's dispatch queue or logger raises" do
    queue = Queue.new
    refusing = Object.new
    refusing.define_singleton_method(:<<) { |wake| wake.payload == "refused" ? raise("queue full") : queue << wake }
    lines = StringIO.new
    logger = Logger.new(lines)
    logger.define_singleton_method(:add) do |severity, message = nil, progname = nil|
      "#{message}#{progname}".include?("x" * 70) ? raise("broken logger") : super(severity, message, progname)
    end
    l = listener(queue: refusing, logger: logger).start
    expect(l.ensure_listening("x" * 70)).to be_nil # its ERROR line makes the logger raise
    expect(l.ensure_listening("pgbus_raising")).to eq(:done)
    TestDatabase.notify("pgbus_raising", "refused")
    TestDatabase.notify("pgbus_raising", "accepted")
    expect(pop(queue)).to have_attributes(payload: "accepted")
    expect(l.ensure_listening("y" * 70)).to be_nil
    wait_for("the second refusal logged", timeout: 5) { lines.string.include?("y" * 70) }
    expect(lines.string).to include("wake delivery raised #<RuntimeError: queue full>")
    expect(l.threads.size).to eq(2)
  end

  it "opens one pgbus-listen connection, standalone channel names, quoting-safe" do
    queue = Queue.new
    before = TestDatabase.census
    l = listener(queue: queue, channel_prefix: "", channel_suffix: "").start
    name = %(it's "quoted"; drop table x)
    expect(l.ensure_listening(name)).to eq(:done)
    expect(TestDatabase.census - before).to eq(1)
    TestDatabase.notify(name, "ok", prefix: "", suffix: "")
    expect(pop(queue)).to have_attributes(queue_name: name, payload: "ok")
  end

  it "connects with gssencmode=disable (pgbus's integration helper always adds it), refuses require by name" do
    l = described_class.new(connection: TestDatabase.keywords(gssencmode: "disable"), dispatch_queue: Queue.new).start
    (@listeners ||= []) << l
    expect(l.ensure_listening("gss_ok")).to eq(:done)
    expect { described_class.new(connection: TestDatabase.keywords(gssencmode: "require"), dispatch_queue: Queue.new).start }
      .to raise_error(ArgumentError, /gssencmode=require is not supported: pgbus-hub never uses GSS encryption/)
  end

  it "returns nil for names PostgreSQL would truncate or cannot take, logging each name once at ERROR" do
    out = StringIO.new
    l = listener(logger: Logger.new(out)).start
    2.times do
      expect(l.ensure_listening("")).to be_nil
      expect(l.ensure_listening("x" * 60)).to be_nil
      expect(l.ensure_listening("nul\0byte")).to be_nil
    end
    expect(l.ensure_listening("fine_after")).to eq(:done)
    wait_for("the log thread to write them") { out.string.lines.grep(/ERROR/).size >= 3 }
    errors = out.string.lines.grep(/ERROR/)
    expect(errors.size).to eq(3)
    expect(errors.join).to include("empty").and include("63 bytes").and include("NUL")
  end

  it "stops unlisten'd delivery and stops within 2 s" do
    queue = Queue.new
    l = listener(queue: queue).start
    l.ensure_listening("gone")
    l.remove_listening("gone")
    l.ensure_listening("kept")
    TestDatabase.notify("gone", "no")
    TestDatabase.notify("kept", "yes")
    expect(pop(queue).payload).to eq("yes")
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    l.stop
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 2.5
    expect(l.stop).to equal(l)
  end

  it "rejects unknown keywords naming the valid ones" do
    expect { described_class.new(connection: "x", dispatch_queue: Queue.new, nope: 1) }
      .to raise_error(ArgumentError, /unknown option\(s\) :nope \(valid: :connection, :dispatch_queue/)
  end
end
