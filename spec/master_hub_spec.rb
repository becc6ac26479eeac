# frozen_string_literal: true

require "socket"
require "tmpdir"
require "logger"
require "stringio"
require "rbconfig"
require "timeout"
require_relative "support/database"
require_relative "support/native_wait"

RSpec.describe Pgbus::Hub::MasterHub do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    Dir.mktmpdir("pgbus-hub-spec") do |dir|
      @dir = dir
      example.run
    ensure
      @hubs&.each(&:stop)
    end
  end

  def start_hub(**options)
    defaults = { connection: TestDatabase.url, socket_path: File.join(@dir, "hub.sock"),
                 health_check_ms: 100, status_interval: 0.2 }
    hub = described_class.new(**defaults, **options).start
    (@hubs ||= []) << hub
    hub
  end

  it "rejects unknown and missing options, naming the valid ones" do
    expect { described_class.new(socket_path: "x") }.to raise_error(ArgumentError, /missing.*:connection/)
    expect { described_class.new(connection: "x", socket_path: "y", bogus: 1) }
      .to raise_error(ArgumentError, /unknown option\(s\) :bogus \(valid: :connection, :socket_path/)
    expect { described_class.new(connection: "x", socket_path: "y", hard_queue_limit: 0) }
      .to raise_error(ArgumentError, /hard_queue_limit must be a positive Integer/)
    expect { described_class.new(connection: 42, socket_path: File.join(@dir, "t.sock")).start }
      .to raise_error(TypeError, /connection: must be a String/)
  end

  it "raises Pgbus::Hub::Error with the reason when it cannot bind" do
    path = File.join(@dir, "file")
    File.write(path, "x")
    hub = described_class.new(connection: TestDatabase.url, socket_path: path)
    expect { hub.start }.to raise_error(Pgbus::Hub::Error, /not a socket/)
    long = described_class.new(connection: TestDatabase.url, socket_path: File.join(@dir, "x" * 120))
    expect { long.start }.to raise_error(Pgbus::Hub::Error, /bytes/)
  end

  it "acks a sub after LISTEN, delivers durable and ephemeral wakes, and reports stats" do
    hub = start_hub
    expect(hub).to be_running
    expect(File.stat(hub.socket_path).mode & 0o777).to eq(0o600)
    peer = WirePeer.new(hub.socket_path)
    expect(peer.next_frame).to include("t" => "status")
    peer.subscribe("pgbus_chat")
    TestDatabase.notify("pgbus_chat")
    expect(peer.next_non_status).to eq({ "t" => "wake", "q" => "pgbus_chat", "p" => nil })
    TestDatabase.notify("pgbus_chat", "<turbo-stream>hi</turbo-stream>")
    expect(peer.next_non_status).to eq({ "t" => "wake", "q" => "pgbus_chat", "p" => "<turbo-stream>hi</turbo-stream>" })
    stats = hub.stats
    expect(stats).to include(workers: 1, channels: 1, listener_healthy: true, threads: 1)
    expect(stats.keys).to include(:reconnects, :wakes_received, :frames_sent, :dropped_durable_wakes,
                                  :evicted_workers, :rejected_peers, :handovers, :abandoned_connections)
    peer.close
  end

  it "keeps ONE pgbus-listen connection for 16 clients and releases refs on disconnect" do
    before = TestDatabase.census
    hub = start_hub
    peers = Array.new(16) { WirePeer.new(hub.socket_path) }
    peers.each_with_index { |peer, i| peer.subscribe("q_shared"); peer.subscribe("q_own_#{i}") }
    expect(TestDatabase.census - before).to eq(1)
    TestDatabase.notify("q_shared", "all")
    peers.each { |peer| expect(peer.next_non_status).to include("q" => "q_shared", "p" => "all") }
    peers.each(&:close)
    wait_for("refs released") { hub.stats[:workers].zero? && hub.stats[:channels].zero? }
  end

  it "stop closes clients, unlinks the socket, closes PostgreSQL, and is idempotent" do
    before = TestDatabase.census
    hub = start_hub
    peer = WirePeer.new(hub.socket_path)
    peer.subscribe("bye")
    wait_for("listen connection") { TestDatabase.census == before + 1 }
    expect(hub.stop).to equal(hub)
    expect(hub.stop).to equal(hub)
    expect(hub).not_to be_running
    expect(File.exist?(hub.socket_path)).to be(false)
    # A peer that does not answer the stop's move (as pgbus's own client: an unknown frame) is closed after the grace.
    expect(peer.next_non_status).to include("t" => "move", "c" => start_with("pgbus_hub.handover."))
    expect(peer.next_non_status).to be_nil
    wait_for("listen connection closed") { TestDatabase.census == before }
  end

  # Issue 57: standby: true reaches the engine (2 pgbus-listen backends, and stats say so);
  # anything but true or false is refused by name, here and in Pgbus::Hub.configure.
  it "takes standby: true (2 LISTEN connections in the census and the stats) and refuses another value" do
    before = TestDatabase.census
    hub = start_hub(standby: true)
    wait_for("the standby aligned") { hub.stats[:standby_aligned] && hub.stats[:listen_connections] == 2 }
    expect(TestDatabase.census).to eq(before + 2)
    expect(hub.stats).to include(listen_connections: 2, standby_promotions: 0)
    %w[true yes].push(1, nil).each do |bad|
      expect { described_class.new(connection: TestDatabase.url, socket_path: "/x", standby: bad) }
        .to raise_error(ArgumentError, "MasterHub: standby must be true or false, got #{bad.inspect}")
    end
    expect { Pgbus::Hub.configure { |c| c.standby = "false" } }
      .to raise_error(ArgumentError, 'Pgbus::Hub.configure: standby must be true or false, got "false"')
    expect(Pgbus::Hub.configure { |c| c.standby = true }.master_options).to include(standby: true)
  ensure
    Pgbus::Hub.instance_variable_set(:@configuration, nil)
  end

  it "counts 1 LISTEN connection without standby" do
    hub = start_hub
    wait_for("listening") { hub.stats[:listener_healthy] }
    expect(hub.stats).to include(listen_connections: 1, standby_aligned: false, standby_promotions: 0)
  end

  it "is inert in a forked child: stop there leaves the parent's hub serving" do
    hub = start_hub
    peer = WirePeer.new(hub.socket_path)
    peer.subscribe("forked")
    pid = fork do
      ok = !hub.running?
      hub.stop
      exit!(ok ? 0 : 1)
    end
    Process.wait(pid)
    expect($?.exitstatus).to eq(0)
    expect(hub).to be_running
    TestDatabase.notify("forked", "still here")
    expect(peer.next_non_status).to include("p" => "still here")
  end

  it "forwards native log lines to the Ruby logger from a Ruby thread" do
    out = StringIO.new
    hub = start_hub(logger: Logger.new(out))
    peer = WirePeer.new(hub.socket_path)
    peer.send_frame({ "t" => "bogus" })
    wait_for("log line") { out.string.include?("unknown frame") }
    # The hub's connection number and the peer's pid (SO_PEERCRED), not a "worker" number.
    expect(out.string).to match(/connection \d+ \(pid #{Process.pid}\) sent unknown frame \(t="bogus"\)/)
    hub.stop
    expect(out.string).to include("master hub listening at #{hub.socket_path}")
    expect(out.string).to include("stopped")
  end

  it "answers a refused queue name with a nack and ONE warning naming the connection" do
    out = StringIO.new
    hub = start_hub(logger: Logger.new(out))
    peer = WirePeer.new(hub.socket_path)
    queue = "x" * 70
    peer.send_frame({ "t" => "sub", "q" => queue })
    expect(peer.next_non_status).to include("t" => "nack", "q" => queue)
    wait_for("the warning") { out.string.include?("refused") }
    warnings = out.string.lines.grep(/WARN/).grep(/#{queue}/)
    expect(warnings.size).to eq(1), warnings.join
    expect(warnings.first).to match(/connection \d+ \(pid #{Process.pid}\) subscribed to "x{70}": .*63 bytes.* — refused/)
  end

  it "loses no wake committed after an ack, under a NOTIFY storm" do
    hub = start_hub
    storm = Thread.new do
      conn = TestDatabase.connect
      2000.times { conn.exec("select pg_notify('pgmq.q_storm.INSERT', 'noise')") }
    ensure
      conn&.close
    end
    30.times do |i|
      peer = WirePeer.new(hub.socket_path)
      peer.subscribe("fresh_#{i}")
      TestDatabase.notify("fresh_#{i}", "marker")
      expect(peer.next_non_status).to include("q" => "fresh_#{i}", "p" => "marker")
      peer.close
    end
    storm.join
  end

  it "evicts a worker that never reads; the others keep getting wakes" do
    hub = start_hub(durable_queue_limit: 3, hard_queue_limit: 8)
    stuck = WirePeer.new(hub.socket_path)
    stuck.subscribe("flood")
    healthy = WirePeer.new(hub.socket_path)
    healthy.subscribe("flood")
    payload = "y" * 7000
    sent = 0
    while hub.stats[:evicted_workers].zero? && sent < 2000
      TestDatabase.notify("flood", payload)
      sent += 1
      expect(healthy.next_non_status).to include("p" => payload)
    end
    expect(hub.stats[:evicted_workers]).to eq(1)
    frames = 0
    frames += 1 while stuck.next_frame(timeout: 5)
    expect(frames).to be < sent # only what the socket buffer held before the eviction...
    expect(Timeout.timeout(5) { stuck.socket.read(1) }).to be_nil # ...then EOF, not silence
    wait_for("evicted worker gone") { hub.stats[:workers] == 1 }
  end

  it "recovers from pg_terminate_backend: healthy false, then true, wakes flow" do
    hub = start_hub
    peer = WirePeer.new(hub.socket_path)
    peer.subscribe("survive")
    # Only this hub's backend: other runs on the same server have their own.
    TestDatabase.with { |conn| conn.exec_params("select pg_terminate_backend($1)", [hub.stats[:backend_pid]]) }
    seen = []
    until seen.last == true && seen.include?(false)
      frame = peer.next_frame
      raise "hub closed the worker" unless frame

      seen << frame["healthy"] if frame["t"] == "status"
    end
    # Before any NOTIFY: the catch-up wake (durable) for the queue it routes.
    expect(peer.next_non_status).to eq("t" => "wake", "q" => "survive", "p" => nil)
    TestDatabase.notify("survive", "again")
    expect(peer.next_non_status).to include("p" => "again")
    expect(hub.stats[:reconnects]).to be >= 1
  end

  it "caps the channels a connection and the host may LISTEN on: past them a nack and one WARN per connection" do
    log = StringIO.new
    hub = start_hub(max_channels_per_connection: 3, max_channels: 5, logger: Logger.new(log))
    hostile = WirePeer.new(hub.socket_path)
    %w[cap_a cap_b cap_c].each { |queue| hostile.subscribe(queue) }
    hostile.send_frame("t" => "sub", "q" => "cap_d")
    hostile.send_frame("t" => "sub", "q" => "cap_e")
    nacks = Array.new(2) { hostile.next_non_status }
    expect(nacks.map { |f| f["q"] }).to eq(%w[cap_d cap_e])
    expect(nacks.first["reason"]).to include("already has the hub LISTEN on 3 channels (max_channels_per_connection 3)")
    hostile.subscribe("cap_a") # already its own: adds nothing, acked

    other = WirePeer.new(hub.socket_path)
    %w[cap_x cap_y].each { |queue| other.subscribe(queue) } # 5 channels in all
    other.send_frame("t" => "sub", "q" => "cap_z")
    expect(other.next_non_status).to include("t" => "nack", "q" => "cap_z",
                                             "reason" => "the hub already LISTENs on 5 channels (max_channels 5)")
    other.subscribe("cap_a") # LISTENed already: adds no channel, acked at the host cap
    wait_for("stats") { hub.stats[:refused_subs] == 3 && hub.stats[:channels] == 5 }
    TestDatabase.notify("cap_a", "still")
    expect(hostile.next_non_status).to include("t" => "wake", "q" => "cap_a", "p" => "still")
    expect(other.next_non_status).to include("t" => "wake", "q" => "cap_a", "p" => "still")
    wait_for("log drained") { log.string.scan("refused (further refusals").size == 2 }
    expect(log.string).to match(/WARN.*connection \d+ \(pid \d+\) subscribed to "cap_d"/)
  end

  it "ends a stop waiting on a frozen database session at once when its thread is killed" do
    hub = start_hub
    wait_for("healthy") { hub.stats[:listener_healthy] }
    backend = hub.stats[:backend_pid]
    comm = File.read("/proc/#{backend}/comm").strip rescue nil # rubocop:disable Style/RescueModifier
    skip "this hub's backend is not a local process we may signal" unless comm == "postgres" && Process.euid.zero?
    # SIGSTOP only this hub's own backend: stop's UNLISTEN and close then wait out their grace.
    Process.kill(:STOP, backend)
    begin
      stopper = Thread.new { hub.stop } # its native wait lasts about 0.4 s
      seconds, bound = NativeWait.kill_inside(stopper, "stop")
      expect(seconds).to be < bound
      expect(hub).not_to be_running
      expect(File.exist?(hub.socket_path)).to be(false) # no worker connects to a stopping hub
      hub.stop # idempotent: finishes the Ruby side (log thread)
    ensure
      Process.kill(:CONT, backend)
    end
  end

  it "refuses a peer of another uid and counts it" do
    skip "needs root and setpriv" unless Process.euid.zero? && system("setpriv --version", out: File::NULL)
    hub = start_hub
    File.chmod(0o755, @dir)
    File.chmod(0o666, hub.socket_path) # only so the other uid reaches the peer check
    script = "require 'socket'; s = UNIXSocket.new(#{hub.socket_path.inspect}); puts((s.read(100) || '').bytesize)"
    out = IO.popen(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", RbConfig.ruby, "-e", script], &:read)
    expect(out.strip).to eq("0")
    expect(hub.stats[:rejected_peers]).to eq(1)
    WirePeer.new(hub.socket_path).subscribe("still-served")
  end

  it "serves a pure-Ruby protocol peer (wire compatibility)" do
    require_relative "support/ruby_hub_peer"
    hub = start_hub
    sock = UNIXSocket.new(hub.socket_path)
    next_frame = lambda do
      frame = RubyWire.read(sock)
      frame = RubyWire.read(sock) while frame["t"] == "status"
      frame
    end
    RubyWire.write(sock, { "t" => "sub", "q" => "pure" })
    expect(next_frame.call).to eq({ "t" => "ack", "q" => "pure" })
    TestDatabase.notify("pure", "from pg")
    expect(next_frame.call).to eq({ "t" => "wake", "q" => "pure", "p" => "from pg" })
    sock.close
  end

  it "connects from a Hash of libpq keywords with variables, over TLS with sslmode=require" do
    params = TestDatabase.conninfo
    connection = params.merge(host: "127.0.0.1", port: params.fetch(:port, "5432"), sslmode: "require",
                              application_name: "pgbus-listen-tls", variables: { statement_timeout: "5s" })
    hub = start_hub(connection: connection)
    wait_for("listener healthy") { hub.stats[:listener_healthy] }
    ssl = TestDatabase.with do |conn|
      conn.exec("select s.ssl from pg_stat_ssl s join pg_stat_activity a using (pid) " \
                "where a.application_name = 'pgbus-listen-tls'").values.flatten
    end
    expect(ssl).to eq(["t"])
  end
end
