# frozen_string_literal: true

require "tmpdir"
require "logger"
require "stringio"
require "puma"
require "timeout"
require_relative "support/database"

# In-process: the master's boot (arm, the hub started by Ruby's fork hook,
# teardown), SharedHub's one-hub rule and the standalone API (no pgbus here).
RSpec.describe Pgbus::Hub::Boot do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    saved = ENV.fetch("PGBUS_STREAMS_HUB_SOCKET", nil)
    Dir.mktmpdir("pgbus-boot") do |dir|
      @dir = dir
      example.run
    ensure
      described_class.teardown("spec")
      Pgbus::Hub.instance_variable_set(:@configuration, nil)
      ENV["PGBUS_STREAMS_HUB_SOCKET"] = saved
    end
  end

  let(:out) { StringIO.new }
  let(:logger) { Logger.new(out) }

  def configure(connection: TestDatabase.url, socket: "hub.sock")
    Pgbus::Hub.configure do |c|
      c.connection = connection
      c.socket_path = File.join(@dir, socket)
      c.health_check_ms = 100
    end
  end

  def fork_child
    Process.wait(fork { exit!(0) })
  end

  it "uses pgbus's default socket path" do
    expect(described_class.default_socket_path(42)).to eq(File.join(Dir.tmpdir, "pgbus-streams-hub-42.sock"))
  end

  it "arm exports the socket; the hub listens before the first fork returns; teardown stops it and unlinks" do
    configure
    path = File.join(@dir, "hub.sock")
    described_class.arm(logger: logger)
    expect(ENV.fetch("PGBUS_STREAMS_HUB_SOCKET")).to eq(path)
    expect(File.exist?(path)).to be(false)
    fork_child
    expect(File.socket?(path)).to be(true)
    expect(out.string.scan("[pgbus-hub] standalone configuration: master hub started before fork").size).to eq(1)
    fork_child # a later fork: the same hub
    expect(Pgbus::Hub::SharedHub.current.socket_path).to eq(path)
    described_class.teardown("spec")
    expect(File.exist?(path)).to be(false)
    expect(Pgbus::Hub::SharedHub.current).to be_nil
    expect(described_class.armed?).to be(false)
  end

  it "an unarmed process, or a forked child of an armed one, never starts a hub" do
    configure
    fork_child
    expect(Pgbus::Hub::SharedHub.current).to be_nil
    reader, writer = IO.pipe
    described_class.arm(logger: logger)
    Process.wait(fork do
      reader.close
      Process.wait(fork { exit!(0) }) # the child forks: it is not the armed master
      writer.write(Pgbus::Hub::SharedHub.current.nil? ? "none" : "hub")
      exit!(0)
    end)
    writer.close
    expect(reader.read).to eq("hub") # inherited object, stopped only by its owner; no second start
  end

  it "says ERROR once for a refused configuration; WARNs once for a missing one and starts it at a later fork" do
    configure(socket: "r.sock")
    Pgbus::Hub.configuration.listen_scope = :master
    allow(Pgbus::Hub).to receive(:master_options).and_raise(Pgbus::Hub::Error, "a refusal")
    described_class.arm(logger: logger)
    2.times { fork_child }
    expect(out.string.scan("ERROR -- : [pgbus-hub] no master hub: a refusal").size).to eq(1)
    described_class.teardown("spec")

    ready = nil
    allow(Pgbus::Hub).to receive(:master_options) { ready }
    described_class.arm(logger: logger)
    2.times { fork_child }
    expect(out.string.scan(/WARN -- : \[pgbus-hub\] no hub configuration as workers fork \(no preload_app!\?/).size).to eq(1)
    expect(Pgbus::Hub::SharedHub.current).to be_nil # no thread polls for it
    ready = Pgbus::Hub.configuration.master_options
    fork_child
    expect(Pgbus::Hub::SharedHub.current&.running?).to be(true)
    expect(File.socket?(File.join(@dir, "r.sock"))).to be(true)
  end

  it "says ERROR once for a connection string the hub cannot use, and disarms" do
    configure(socket: "bad.sock") # Pgbus::Hub.configure refuses a bad string itself: pgbus's reaches MasterHub.new
    bad = Pgbus::Hub.configuration.master_options.merge(connection: "host=/nowhere port=notanumber")
    allow(Pgbus::Hub).to receive(:master_options).and_return(bad)
    described_class.arm(logger: logger)
    3.times { fork_child }
    expect(out.string.scan("ERROR -- : [pgbus-hub] no master hub: ").size).to eq(1), out.string
    expect(out.string).not_to include("master hub failed to start")
    expect(described_class.armed?).to be(false)
    expect(File.exist?(File.join(@dir, "bad.sock"))).to be(false)
  end

  it "starts nothing under :process, and logs a hub that cannot start" do
    configure(socket: "p.sock")
    Pgbus::Hub.configuration.listen_scope = :process
    described_class.arm(logger: logger)
    fork_child
    expect(File.exist?(File.join(@dir, "p.sock"))).to be(false)
    described_class.teardown("spec")
    File.write(File.join(@dir, "file"), "x")
    configure(socket: "file")
    Pgbus::Hub.configuration.listen_scope = :master
    described_class.arm(logger: logger)
    fork_child
    expect(out.string).to match(/master hub failed to start \(Pgbus::Hub::Error: .*not a socket.*\) — workers fall back/)
  end

  it "SharedHub: two starts in one process run ONE native hub" do
    configure
    before = TestDatabase.census
    options = Pgbus::Hub.configuration.master_options
    a = Pgbus::Hub::SharedHub.start(socket_path: File.join(@dir, "d.sock"), **options)
    b = Pgbus::Hub::SharedHub.start(socket_path: File.join(@dir, "d.sock"), **options)
    expect(a).to equal(b)
    peer = WirePeer.new(a.socket_path)
    peer.subscribe("one")
    expect(TestDatabase.census - before).to eq(1)
    peer.close
    Pgbus::Hub::SharedHub.stop(a)
    expect(File.exist?(File.join(@dir, "d.sock"))).to be(false)
  end

  it "refuses pgbus connection options it cannot use (a Proc) by name, instead of waiting for them" do
    config = Struct.new(:streams_enabled, :streams_connection_options).new(true, -> { :raw_connection })
    expect { Pgbus::Hub::PgbusAdapter.master_options(config) }
      .to raise_error(Pgbus::Hub::Error, /streams_connection_options is a Proc; the hub needs a libpq String/)
  end
end

RSpec.describe "Pgbus::Hub standalone API" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    saved = ENV.fetch("PGBUS_STREAMS_HUB_SOCKET", nil)
    Dir.mktmpdir("pgbus-standalone") do |dir|
      @dir = dir
      example.run
    ensure
      @listener&.stop
      Pgbus::Hub::SharedHub.stop
      Pgbus::Hub.instance_variable_set(:@configuration, nil)
      ENV["PGBUS_STREAMS_HUB_SOCKET"] = saved
    end
  end

  it "validates listen_scope and refuses a listener before configure" do
    expect { Pgbus::Hub.listener(dispatch_queue: Queue.new) }.to raise_error(Pgbus::Hub::Error, /configure/)
    expect { Pgbus::Hub.configure { |c| c.listen_scope = :bogus } }.to raise_error(ArgumentError, /:master or :process/)
    # A connection the hub cannot use is refused where it is written.
    expect { Pgbus::Hub.configure { |c| c.connection = "postgress://app:s3cret@localhost/app" } }
      .to raise_error(ArgumentError, %r{invalid connection: .*unknown URL scheme "postgress://"}) { |e| expect(e.message).not_to include("s3cret") }
    expect { Pgbus::Hub.configure { |c| c.connection = { host: "h", nope: 1 } } }
      .to raise_error(ArgumentError, /unknown connection option `nope`/)
    expect { Pgbus::Hub.configure { |c| c.connection = 5432 } }.to raise_error(TypeError, /must be a String/)
    expect(Pgbus::Hub.check_connection("postgres://u:secret@db/app")).not_to include("secret")
    expect(Pgbus::Hub.configure { |c| c.listen_scope = "process" }.listen_scope).to eq(:process)
  end

  # A sub sent before the hub's first connection is up waits for it within the ack timeout; these
  # examples are about which listener answers, not about a hub's start-up.
  def hub_listening(hub)
    wait_for("the hub LISTENing") { hub.stats[:listener_healthy] }
  end

  it "returns a FailoverListener over the hub, or a local Listener without one" do
    Pgbus::Hub.configure do |c|
      c.connection = TestDatabase.url
      c.channel_prefix = ""
      c.channel_suffix = ""
    end
    ENV.delete("PGBUS_STREAMS_HUB_SOCKET")
    local = Pgbus::Hub.listener(dispatch_queue: Queue.new)
    expect(local).to be_a(Pgbus::Hub::Listener)
    local.stop
    path = File.join(@dir, "s.sock")
    hub_listening(Pgbus::Hub::SharedHub.start(socket_path: path, **Pgbus::Hub.configuration.master_options))
    ENV["PGBUS_STREAMS_HUB_SOCKET"] = path
    queue = Queue.new
    @listener = Pgbus::Hub.listener(dispatch_queue: queue)
    expect(@listener).to be_a(Pgbus::Hub::FailoverListener)
    expect(@listener.ensure_listening("standalone_q")).to eq(:done)
    TestDatabase.notify("standalone_q", "x", prefix: "", suffix: "")
    expect(Timeout.timeout(5) { queue.pop }).to have_attributes(queue_name: "standalone_q", payload: "x")
  end

  it "gives a refused queue name one outcome in cluster, single and :process mode: nil and one ERROR" do
    Pgbus::Hub.configure { |c| c.connection = TestDatabase.url }
    path = File.join(@dir, "r.sock")
    hub_listening(Pgbus::Hub::SharedHub.start(socket_path: path, **Pgbus::Hub.configuration.master_options))
    modes = {
      cluster: -> { ENV["PGBUS_STREAMS_HUB_SOCKET"] = path },
      single: -> { ENV.delete("PGBUS_STREAMS_HUB_SOCKET") },
      process: -> { Pgbus::Hub.configure { |c| c.listen_scope = :process } }
    }
    modes.each do |mode, arrange|
      arrange.call
      out = StringIO.new
      @listener = Pgbus::Hub.listener(dispatch_queue: Queue.new, logger: Logger.new(out)) # stopped by `around` if this fails
      expect(@listener).to be_a(mode == :cluster ? Pgbus::Hub::FailoverListener : Pgbus::Hub::Listener)
      2.times { expect(@listener.ensure_listening("q" * 70)).to be_nil, mode.to_s }
      expect(@listener.ensure_listening("fine")).to eq(:done), mode.to_s # the log thread has written what came before
      wait_for("#{mode}: the refusal logged") { out.string.include?("cannot listen to") }
      expect(out.string.lines.grep(/ERROR .*cannot listen to "q{70}": .*63 bytes/).size).to eq(1), "#{mode}: #{out.string}"
      expect(@listener.ensure_listening("fine")).to eq(:done), mode.to_s
      @listener.stop
    end
  end
end

RSpec.describe "pgbus-hub Puma plugin files" do
  it "register pgbus_streams and pgbus_hub with one body" do
    require "puma/plugin/pgbus_streams"
    require "puma/plugin/pgbus_hub"
    %w[pgbus_streams pgbus_hub].each { |name| expect(Puma::Plugins.find(name).include?(Pgbus::Hub::PumaPlugin)).to be(true) }
  end

  it "logs through log_writer on Puma 6+ and events on 5.6" do
    lines = []
    writer = Struct.new(:lines) { def log(msg) = lines << msg }.new(lines)
    modern = Struct.new(:log_writer, :events).new(writer, nil)
    legacy = Struct.new(:events).new(writer)
    Pgbus::Hub::PumaLog.logger(modern).info("a")
    Pgbus::Hub::PumaLog.logger(legacy).warn("b")
    Pgbus::Hub::PumaLog.logger(legacy).debug("c")
    Pgbus::Hub::PumaLog.logger(legacy).add(3, "d", "pgbus-hub") # as the native log threads add (Logger::ERROR)
    expect(lines).to eq(["INFO a", "WARN b", "ERROR d"])
  end
end
