# frozen_string_literal: true

require "tmpdir"
require "logger"
require "stringio"
require "puma"
require "timeout"
require_relative "support/database"

# In-process: our MasterHubBoot (Pgbus::Hub::Boot), SharedHub's one-hub rule,
# the standalone API, and how the plugin files compose (no pgbus loaded here).
RSpec.describe Pgbus::Hub::Boot do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    saved = ENV.fetch("PGBUS_STREAMS_HUB_SOCKET", nil)
    Dir.mktmpdir("pgbus-boot") do |dir|
      @dir = dir
      example.run
    ensure
      Pgbus::Hub::SharedHub.stop
      ENV["PGBUS_STREAMS_HUB_SOCKET"] = saved
    end
  end

  let(:out) { StringIO.new }
  let(:logger) { Logger.new(out) }

  def settings(scope: :master)
    Pgbus::Hub::Settings.new(scope: scope, connection: TestDatabase.url, health_check_ms: 100,
                             channel_prefix: "", channel_suffix: "", source: "spec")
  end

  it "uses pgbus's default socket path and reads its tuning from the environment" do
    expect(described_class.default_socket_path(42)).to eq(File.join(Dir.tmpdir, "pgbus-streams-hub-42.sock"))
    ENV["PGBUS_HUB_TEST_SECONDS"] = "0.5"
    expect(described_class.env_seconds("PGBUS_HUB_TEST_SECONDS", 1.0)).to eq(0.5)
    ENV["PGBUS_HUB_TEST_SECONDS"] = "junk"
    expect(described_class.env_seconds("PGBUS_HUB_TEST_SECONDS", 1.0)).to eq(1.0)
  ensure
    ENV.delete("PGBUS_HUB_TEST_SECONDS")
  end

  it "exports the socket at once, starts the native hub once ready, stops it and unlinks the socket" do
    path = File.join(@dir, "hub.sock")
    ready = nil
    boot = described_class.new(socket_path: path, settings: -> { ready }, poll_interval: 0.05, deadline: 10,
                               logger: logger).start
    expect(ENV.fetch("PGBUS_STREAMS_HUB_SOCKET")).to eq(path)
    sleep 0.2
    expect(boot.hub).to be_nil
    ready = settings
    wait_for("hub") { boot.hub&.running? }
    expect(File.socket?(path)).to be(true)
    expect(out.string).to include("master hub listening at #{path}")
    boot.stop
    expect(File.exist?(path)).to be(false)
    expect(Pgbus::Hub::SharedHub.current).to be_nil
    expect(ENV.fetch("PGBUS_STREAMS_HUB_SOCKET")).to eq(path) # pgbus: ENV stays
  end

  it "gives up after the deadline with pgbus's wording, and starts nothing under :process" do
    quiet = described_class.new(socket_path: File.join(@dir, "a.sock"), settings: -> { nil }, poll_interval: 0.05,
                                deadline: 0.3, logger: logger).start
    wait_for("deadline") { out.string.include?("never became ready") }
    expect(out.string).to include("configuration never became ready within 0.3s (no preload_app!?) — no master hub; " \
                                  "workers use per-worker listeners")
    process = described_class.new(socket_path: File.join(@dir, "b.sock"), settings: -> { settings(scope: :process) },
                                  poll_interval: 0.05, deadline: 5, logger: logger).start
    sleep 0.3
    expect(process.hub).to be_nil
    expect(File.exist?(File.join(@dir, "b.sock"))).to be(false)
    [quiet, process].each(&:stop)
  end

  it "stop cancels a waiting poller; a failing start is logged and survived" do
    boot = described_class.new(socket_path: File.join(@dir, "c.sock"), settings: -> { nil }, poll_interval: 5,
                               deadline: 60, logger: logger).start
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    boot.stop
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).to be < 1
    File.write(File.join(@dir, "file"), "x")
    bad = described_class.new(socket_path: File.join(@dir, "file"), settings: -> { settings }, poll_interval: 0.05,
                              logger: logger).start
    wait_for("error") { out.string.include?("master hub failed to start") }
    expect(out.string).to match(/master hub failed to start \(Pgbus::Hub::Error: .*not a socket.*\) — workers fall back/)
    bad.stop
  end

  it "before_fork binds at once when ready; says ERROR for a refused configuration, WARN for a missing one" do
    path = File.join(@dir, "bf.sock")
    boot = described_class.new(socket_path: path, settings: -> { settings }, poll_interval: 60, logger: logger).start
    boot.boot_before_fork # synchronous: bound when it returns, no poll tick needed
    expect(File.socket?(path)).to be(true)
    # Boot's own line, once (the native hub's "master hub listening at" arrives via the log drain, asynchronously)
    expect(out.string.scan("[pgbus-hub] master hub listening at #{path} (native").size).to eq(1)
    boot.stop

    refused = described_class.new(socket_path: File.join(@dir, "r.sock"), poll_interval: 60, logger: logger,
                                  settings: -> { raise Pgbus::Hub::Error, "streams_connection_options is a Proc" }).start
    refused.boot_before_fork
    expect(out.string).to include("ERROR -- : [pgbus-hub] no master hub: streams_connection_options is a Proc")
    expect(out.string).not_to include("no hub configuration yet")
    refused.stop

    missing = described_class.new(socket_path: File.join(@dir, "m.sock"), settings: -> { nil }, poll_interval: 60,
                                  logger: logger).start
    missing.boot_before_fork
    expect(out.string).to match(/WARN -- : \[pgbus-hub\] no hub configuration yet as workers fork \(no preload_app!\?\)/)
    missing.stop
  end

  it "refuses pgbus connection options it cannot use (a Proc) by name, instead of waiting for them" do
    config = Struct.new(:streams_enabled, :streams_connection_options).new(true, -> { :raw_connection })
    expect { Pgbus::Hub::PgbusIntegration.settings(config) }
      .to raise_error(Pgbus::Hub::Error, /streams_connection_options is a Proc; the hub needs a libpq String/)
    config.streams_connection_options = { host: "127.0.0.1", port: 5432, dbname: "x", variables: { "a" => "b" } }
    expect(Pgbus::Hub::PgbusIntegration.settings(config).connection).to eq(config.streams_connection_options)
  end

  it "SharedHub: two boots in one process run ONE native hub" do
    before = TestDatabase.census
    a = described_class.new(socket_path: File.join(@dir, "d.sock"), settings: -> { settings }, poll_interval: 0.05,
                            logger: logger).start
    b = described_class.new(socket_path: File.join(@dir, "d.sock"), settings: -> { settings }, poll_interval: 0.05,
                            logger: logger).start
    wait_for("both") { a.hub && b.hub }
    expect(a.hub).to equal(b.hub)
    peer = WirePeer.new(a.hub.socket_path)
    peer.subscribe("one")
    expect(TestDatabase.census - before).to eq(1)
    peer.close
    a.stop
    b.stop
    expect(File.exist?(File.join(@dir, "d.sock"))).to be(false)
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
    Pgbus::Hub::SharedHub.start(socket_path: path, settings: Pgbus::Hub.configuration.to_settings)
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
    Pgbus::Hub::SharedHub.start(socket_path: path, settings: Pgbus::Hub.configuration.to_settings)
    modes = {
      cluster: -> { ENV["PGBUS_STREAMS_HUB_SOCKET"] = path },
      single: -> { ENV.delete("PGBUS_STREAMS_HUB_SOCKET") },
      process: -> { Pgbus::Hub.configure { |c| c.listen_scope = :process } }
    }
    modes.each do |mode, arrange|
      arrange.call
      out = StringIO.new
      listener = Pgbus::Hub.listener(dispatch_queue: Queue.new, logger: Logger.new(out))
      expect(listener).to be_a(mode == :cluster ? Pgbus::Hub::FailoverListener : Pgbus::Hub::Listener)
      2.times { expect(listener.ensure_listening("q" * 70)).to be_nil, mode.to_s }
      expect(out.string.lines.grep(/ERROR .*cannot listen to "q{70}": .*63 bytes/).size).to eq(1), "#{mode}: #{out.string}"
      expect(listener.ensure_listening("fine")).to eq(:done)
      listener.stop
    end
  end
end

RSpec.describe "pgbus-hub Puma plugin files" do
  it "register pgbus_streams and pgbus_hub with one shared body, composing no foreign file when none exists" do
    require "puma/plugin/pgbus_streams"
    require "puma/plugin/pgbus_hub"
    %w[pgbus_streams pgbus_hub].each do |name|
      klass = Puma::Plugins.find(name)
      expect(klass.include?(Pgbus::Hub::PumaPlugin)).to be(true)
      expect(klass.composed_class).to be_nil
    end
  end

  it "finds pgbus's pgbus_streams.rb on $LOAD_PATH but never our own" do
    standin = File.join(ROOT, "spec/support/pgbus_standin/v382/lib")
    own = File.join(ROOT, "lib/puma/plugin/pgbus_hub.rb")
    expect(Pgbus::Hub::PumaPlugin.pgbus_plugin_file(own)).to be_nil
    $LOAD_PATH.push(standin)
    expect(Pgbus::Hub::PumaPlugin.pgbus_plugin_file(own)).to eq(File.join(standin, "puma/plugin/pgbus_streams.rb"))
  ensure
    $LOAD_PATH.delete(standin)
  end

  it "logs through log_writer on Puma 6+ and events on 5.6" do
    lines = []
    writer = Struct.new(:lines) { def log(msg) = lines << msg }.new(lines)
    modern = Struct.new(:log_writer, :events).new(writer, nil)
    legacy = Struct.new(:events).new(writer)
    Pgbus::Hub::PumaLog.new(modern).info("a")
    Pgbus::Hub::PumaLog.new(legacy).warn("b")
    expect(lines).to eq(["INFO a", "WARN b"])
  end
end
