# frozen_string_literal: true

require "json"
require "socket"
require_relative "puma_apps/e2e_helpers"
require_relative "serve_process"

# A preforking server of 4 worker processes (Unicorn, Passenger: whatever
# `start_server(env)` starts, returning its pid, in a process group of its own,
# and the log its workers write) sharing a `pgbus-hub serve` sidecar through
# PGBUS_STREAMS_HUB_SOCKET: the e2e rack app of the Puma specs, standalone mode.
# The sidecar killed with -9: every worker falls back to its own connection;
# the sidecar restarted: every worker comes back to it.
RSpec.shared_examples "4 worker processes on a pgbus-hub serve sidecar" do |server, executable|
  def get(path) = PumaCluster.get(@port, path)

  # pgbus-listen connections in this run's database, now.
  def census
    TestDatabase.connect.then do |conn|
      Census::Count.new(TestDatabase.census_rows(conn))
    ensure
      conn&.close
    end
  end

  # Every worker subscribed to `stream` (requests held so each lands on a free worker).
  def subscribe_all(stream)
    pids = {}
    wait_for("all 4 workers subscribed", timeout: 30, interval: 0) do
      Array.new(4) { Thread.new { get("/sub?q=#{stream}&hold=0.3") } }.map(&:value).compact.each do |sub|
        pids[sub["pid"]] = sub["result"]
      end
      pids.size >= 4
    end
    pids
  end

  def woken(pid, payload)
    path = File.join(@dir, "wakes-#{pid}.log")
    File.exist?(path) && File.readlines(path).any? { |line| JSON.parse(line)[1] == payload }
  end

  # NOTIFYed again each second until every worker has it: right after a
  # switch of connection a NOTIFY can precede a worker's LISTEN (its payload
  # is then lost by design; the catch-up wake covers durable streams).
  def expect_every_worker_woken(pids, stream, payload)
    wait_for("#{payload.inspect} in every worker", timeout: 15, interval: 0) do
      TestDatabase.notify(stream, payload, prefix: "", suffix: "")
      wait_for(nil, timeout: 1) { pids.all? { |pid| woken(pid, payload) } }
    end
  end

  before do
    skip "Debian's #{server} is not installed here (bin/setup installs it)" unless File.executable?(executable)
    skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available?
    @dir = Dir.mktmpdir("pgbus-sidecar-server")
    @port = TCPServer.new("127.0.0.1", 0).then { |socket| socket.addr[1].tap { socket.close } }
  end

  after do
    (::Process.kill("TERM", -@server) rescue nil) if @server # rubocop:disable Style/RescueModifier
    (::Process.wait(@server) rescue nil) if @server # rubocop:disable Style/RescueModifier
    (::Process.kill("KILL", -@server) rescue nil) if @server # rubocop:disable Style/RescueModifier
    [@serve, @restarted].compact.each { |serve| serve.stop.tap { serve.cleanup } }
    FileUtils.rm_rf(@dir) if @dir
  end

  it "4 workers, census 1; sidecar killed: census 4; sidecar restarted: census 1 again within 5 s, all woken" do
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    env = { "RUBYLIB" => File.join(ROOT, "lib"), "PGBUS_E2E_MODE" => "standalone", "PGBUS_E2E_STATE_DIR" => @dir,
            "PGBUS_E2E_DATABASE_URL" => PumaCluster::DATABASE_URL, "PGBUS_STREAMS_HUB_SOCKET" => @serve.socket }
    @server, log = start_server(env)
    wait_for("#{server} to serve", timeout: 60) { get("/pid") }
    stream = "sidecar_#{::Process.pid}_#{rand(1 << 30).to_s(36)}"
    subs = subscribe_all(stream)
    expect(subs.values.uniq).to eq(["done"])
    pids = subs.keys
    expect(wait_for("census 1 (the sidecar's)", timeout: 10) { census == 1 }).to be(true)
    expect_every_worker_woken(pids, stream, "via the sidecar")

    expect(@serve.stop("KILL").termsig).to eq(9) # its socket file stays behind
    expect(wait_for("census 4: every worker on its own connection", timeout: 15) { census == 4 }).to be(true)
    expect_every_worker_woken(pids, stream, "each on its own connection")

    restarted_at = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
    @restarted = ServeProcess.new(PumaCluster::DATABASE_URL, socket: @serve.socket)
    wait_for("census 1 again", timeout: 15, interval: 0.05) { census == 1 }
    back_s = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - restarted_at
    warn format("  [#{server}: 4 workers back on the restarted sidecar %.2f s after it started]", back_s)
    expect(back_s).to be < 5
    # The own connection closes at its marker, the line is logged at the hub's, a moment later.
    expect(wait_for("every worker's fail-back logged", timeout: 5) { File.read(log).scan("back on the master hub").size == 4 })
      .to be(true)
    expect_every_worker_woken(pids, stream, "via the restarted sidecar")
  end
end
