# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"

# Real Puma clusters in the other modes: scope :process, single mode, no
# preload_app!, a hub that dies, kill -9 of a worker, hot restart (USR2, and
# USR1 under preload_app!, which Puma 5.6 turns into a hot restart), phased
# restart without preload (standalone configured in the master), fork_worker.
RSpec.describe "Puma modes", :puma do
  include PumaE2E

  before { skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available? }
  after { stop_clusters }

  SHAPES = [{ mode: :standalone }, { mode: :pgbus, shape: "pre382" }, { mode: :pgbus, shape: "v382" }].freeze

  SHAPES.each do |shape|
    it "scope :process: no hub, one connection per worker (census 4) — #{shape}" do
      c = cluster(**shape, scope: :process)
      stream = unique_stream
      subs = c.subscribe_all(stream)
      expect(subs.values.map { |s| s["listener"] }.uniq).not_to include("Pgbus::Hub::FailoverListener")
      # the scope was set in the app, after the plugin armed: the master exports no socket for a hub it never starts
      expect(subs.values.map { |s| s["socket"] }.uniq).to eq([nil])
      expect(c.log).to include("listen scope :process: no master hub")
      expect(c.census_settles_at(4)).to eq(4)
      expect_wake_everywhere(c, subs.keys, stream, "p")
      expect(c.hub_info).to include("running" => false)
    end

    it "stop the hub: every worker fails over (census 4), acked subscriptions keep waking — #{shape}" do
      c = cluster(**shape)
      c.wait_log(/master hub listening at/)
      stream = unique_stream
      subs = c.subscribe_all(stream)
      expect(c.census_settles_at(1)).to eq(1)
      c.signal("WINCH") # the test app's master stops the native hub
      expect(c.census_settles_at(4)).to eq(4)
      expect(File.exist?(c.socket_path)).to be(false)
      expect_wake_everywhere(c, subs.keys, stream, "after failover")
      # each worker's FailoverListener moves at the hub's marker: nothing to fall back from
      expect(c.log.scan(/moved to a per-worker listener at the hub's marker \(1 subscription/).size).to eq(4)
      expect(c.log).not_to include("falling back to a per-worker listener")
      expect(c.log).to include("handed 4 worker(s) over at their markers")
    end
  end

  [{ mode: :standalone }, { mode: :pgbus, shape: "v382" }].each do |shape|
    it "workers 0 (single mode): no hub, the process uses its own listener (census 1) — #{shape}" do
      c = cluster(**shape, workers: 0)
      stream = unique_stream
      sub = c.get("/sub?q=#{stream}")
      expect(sub["listener"]).not_to eq("Pgbus::Hub::FailoverListener")
      expect(c.census_settles_at(1)).to eq(1)
      expect(c.log).to include("single mode: no master hub")
      expect_wake_everywhere(c, [sub["pid"]], stream, "single")
    end
  end

  [{ mode: :standalone }, { mode: :pgbus, shape: "pre382" }, { mode: :pgbus, shape: "v382" }].each do |shape|
    it "no preload_app!: WARN as workers fork, what it waits for; workers fall back (census 4) — #{shape}" do
      c = cluster(**shape, preload: false)
      c.wait_log(/WARN \[pgbus-hub\] no hub configuration as workers fork \(no preload_app!\? configure pgbus or Pgbus::Hub in puma.rb\)/)
      stream = unique_stream
      c.subscribe_all(stream)
      expect(c.log).to include("master hub not reachable")
      expect(c.census_settles_at(4)).to eq(4)
      expect(File.exist?(c.socket_path)).to be(false)
    end
  end

  it "kill -9 of a worker: the hub releases its refs, Puma replaces it, census stays 1" do
    c = cluster(mode: :standalone)
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    subs = c.subscribe_all(stream)
    expect(c.hub_info["stats"]).to include("workers" => 4)
    victim = subs.keys.first
    c.signal("KILL", victim)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
    sleep 0.1 until c.hub_info["stats"]["workers"] == 3 || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
    expect(c.hub_info["stats"]).to include("workers" => 3, "channels" => 1)
    c.wait_log(/Worker \d \(PID: \d+\) booted/, count: 5)
    subs = c.subscribe_all(stream)
    expect(subs.keys).not_to include(victim)
    expect(c.hub_info["stats"]).to include("workers" => 4, "channels" => 1)
    expect(c.census_settles_at(1)).to eq(1)
    expect_wake_everywhere(c, subs.keys, stream, "after kill -9")
  end

  { "USR2" => { mode: :pgbus, shape: "v382" }, "USR1" => { mode: :pgbus, shape: "pre382" } }.each do |sig, shape|
    it "#{sig} with preload_app! = hot restart: hub stopped before exec, rebound at the same path, census back to 1 — #{shape}" do
      c = cluster(**shape)
      c.wait_log(/master hub listening at/)
      stream = unique_stream
      c.subscribe_all(stream)
      expect(c.census_settles_at(1)).to eq(1)
      first_uptime = c.hub_info["stats"]["uptime"]
      c.signal(sig)
      c.wait_log(/hot restart: stopping the master hub/)
      c.wait_log(/master hub listening at/, count: 2 * c.log.scan(/master hub listening at/).size, timeout: 30)
      c.wait_log(/Worker \d \(PID: \d+\) booted/, count: 8, timeout: 30)
      subs = c.subscribe_all(stream)
      listener = shape[:shape] == "v382" ? "Pgbus::Web::Streamer::FailoverListener" : "Pgbus::Hub::FailoverListener"
      expect(subs.values.map { |s| s["listener"] }.uniq).to eq([listener])
      expect(c.census_settles_at(1)).to eq(1)
      expect(c.hub_info["stats"]["uptime"]).to be < first_uptime + 5
      expect(File.socket?(c.socket_path)).to be(true)
      expect(Dir.glob(File.join(Dir.tmpdir, "pgbus-streams-hub-#{c.pid}.sock*")).size).to eq(1)
      expect_wake_everywhere(c, subs.keys, stream, "after hot restart")
    end
  end

  it "phased restart (USR1, no preload, hub configured in the master): the hub and its connection survive" do
    c = cluster(mode: :standalone, preload: false, env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1" })
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    old = c.subscribe_all(stream)
    expect(c.census_settles_at(1)).to eq(1)
    c.signal("USR1")
    c.wait_log(/Worker \d \(PID: \d+\) booted.*phase: 1/, count: 4, timeout: 60)
    subs = c.subscribe_all(stream)
    expect(subs.keys & old.keys).to be_empty
    expect(c.census_settles_at(1)).to eq(1)
    expect(c.log.scan(/master hub listening at/).size).to eq(1) # once: the hub outlives the phased restart
    expect(c.hub_info["stats"]).to include("workers" => 4, "reconnects" => 0)
    expect_wake_everywhere(c, subs.keys, stream, "after phased restart")
  end

  # What URG replaces under preload_app! differs by version: Puma 5.6 replaces
  # worker 0 only; Puma 6+ re-forks workers 1..3 from worker 0 (phase 1).
  it "fork_worker + preload_app!: census 1; URG (a refork, whichever workers this Puma replaces) keeps it at 1" do
    c = cluster(mode: :standalone, fork_worker: true)
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    c.subscribe_all(stream)
    expect(c.census_settles_at(1)).to eq(1)
    c.signal("URG")
    c.wait_for("the refork's workers to boot", timeout: 30) do
      c.log.scan(/Worker 0 \(PID: \d+\) booted/).size >= 2 ||
        c.log.scan(/Worker [1-3] \(PID: \d+\) booted.*phase: 1/).size >= 3
    end
    subs = c.subscribe_all(stream)
    expect(subs.values.map { |s| s["listener"] }.uniq).to eq(["Pgbus::Hub::FailoverListener"])
    expect(c.census_settles_at(1)).to eq(1)
    expect(c.hub_info["stats"]).to include("workers" => 4)
    expect_wake_everywhere(c, subs.keys, stream, "fork_worker")
  end

  it "fork_worker refork (URG, hub configured in the master): workers 1..3 re-forked, census back to 1, one socket" do
    c = cluster(mode: :standalone, fork_worker: true, preload: false, env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1" })
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    c.subscribe_all(stream)
    expect(c.census_settles_at(1)).to eq(1)
    c.signal("URG")
    c.wait_log(/Worker [1-3] \(PID: \d+\) booted.*phase: 1/, count: 3, timeout: 30)
    subs = c.subscribe_all(stream)
    expect(subs.values.map { |s| s["listener"] }.uniq).to eq(["Pgbus::Hub::FailoverListener"])
    expect(c.census_settles_at(1)).to eq(1)
    expect(Dir.glob(File.join(Dir.tmpdir, "pgbus-streams-hub-#{c.pid}.sock*")).size).to eq(1)
    expect_wake_everywhere(c, subs.keys, stream, "refork")
  end
end
