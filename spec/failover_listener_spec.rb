# frozen_string_literal: true

require "tmpdir"
require "logger"
require "stringio"
require "timeout"
require_relative "support/database"

# The Ruby surface of the native FailoverListener (its fail-over story runs
# in failover_e2e_spec.rb and, natively, ext/pgbus_hub_core/tests/failover_pg.rs).
RSpec.describe Pgbus::Hub::FailoverListener do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    Dir.mktmpdir("pgbus-hub-fo") do |dir|
      @dir = dir
      example.run
    ensure
      @listener&.stop
      @hub&.stop
    end
  end

  def start(socket_path, queue = Queue.new, logger: nil)
    @listener = described_class.new(socket_path: socket_path, connection: TestDatabase.url, dispatch_queue: queue,
                                    logger: logger).start
  end

  it "serves through the hub: no connection of its own, wakes as WakeMessages, named threads that stop" do
    @hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(@dir, "hub.sock")).start
    wait_for("hub connected") { @hub.stats[:listener_healthy] }
    queue = Queue.new
    listener = start(@hub.socket_path, queue, logger: Logger.new(StringIO.new))
    expect(listener.start).to equal(listener) # idempotent
    expect(listener.ensure_listening(:fo_spec)).to eq(:done)
    TestDatabase.notify("fo_spec", "hello")
    wake = Timeout.timeout(5) { queue.pop }
    expect([wake.queue_name, wake.payload]).to eq(%w[fo_spec hello])
    expect(listener.failed_over?).to be(false)
    expect(listener.state).to eq(:on_hub)
    expect(listener.stats).to eq(state: :on_hub, dropped_payloads: 0) # no local connection
    expect(listener.threads.map(&:name)).to contain_exactly("pgbus-hub listener pump", "pgbus-hub listener log")
    listener.stop
    expect(listener.threads).to eq([])
    expect(listener.state).to eq(:stopped)
  end

  it "without a reachable hub serves from its own connection at once, and says so" do
    out = StringIO.new
    queue = Queue.new
    listener = start(File.join(@dir, "nobody.sock"), queue, logger: Logger.new(out))
    expect(listener.failed_over?).to be(true)
    expect(listener.ensure_listening("fo_alone")).to eq(:done)
    TestDatabase.notify("fo_alone")
    expect(Timeout.timeout(5) { queue.pop }.queue_name).to eq("fo_alone")
    expect(listener.stats).to include(state: :failed_over, listener_state: :listening, healthy: true, channels: 1)
    wait_for("the log line") { out.string.include?("cannot reach master hub") }
    expect(out.string).to include("using a per-worker listener")
    expect(out.string).to match(/failed over to a per-worker listener .* state=failed_over$/)
  end

  # The listener is the only holder of its dispatch queue, logger and
  # callback: they live in its typed options, marked for the GC (pinned, so
  # compaction leaves them where the native side put them).
  it "keeps the objects it was given alive through GC and compaction" do
    confirmed = Queue.new
    listener = described_class.new(socket_path: File.join(@dir, "nobody.sock"), connection: TestDatabase.url,
                                   dispatch_queue: Queue.new, logger: Logger.new(StringIO.new),
                                   on_listening: ->(queue, ticket) { confirmed << [queue.dup, ticket] })
    @listener = listener
    3.times { GC.start(full_mark: true, immediate_sweep: true) }
    GC.compact if GC.respond_to?(:compact)
    listener.start
    ticket = listener.listen("fo_gc")
    expect(Timeout.timeout(10) { confirmed.pop }).to eq(["fo_gc", ticket])
    expect(listener.threads.map(&:name)).to contain_exactly("pgbus-hub listener pump", "pgbus-hub listener log")
  end

  it "is refused before initialize, and initialize is refused twice" do
    expect { described_class.allocate.start }.to raise_error(ArgumentError, /FailoverListener was never initialized/)
    listener = described_class.new(connection: TestDatabase.url, dispatch_queue: Queue.new, socket_path: "/x.sock")
    expect { listener.send(:initialize, connection: TestDatabase.url, dispatch_queue: Queue.new, socket_path: "/x") }
      .to raise_error(ArgumentError, /FailoverListener is already initialized/)
  end

  it "refuses unknown and missing options by name" do
    expect { described_class.new(connection: TestDatabase.url, dispatch_queue: Queue.new) }
      .to raise_error(ArgumentError, /missing required option\(s\) :socket_path/)
    expect { Pgbus::Hub::Listener.new(connection: TestDatabase.url, dispatch_queue: Queue.new, socket_path: "x") }
      .to raise_error(ArgumentError, /unknown option\(s\) :socket_path/)
    expect { described_class.new(connection: TestDatabase.url, dispatch_queue: Queue.new, socket_path: "/x", wake_message: 1) }
      .to raise_error(ArgumentError, /wake_message must be a class/)
  end
end
