# frozen_string_literal: true

require_relative "../support/puma_apps/e2e_helpers"

# The hub listens before the first worker forks. A client hammers a 4-worker
# cluster from the moment Puma is spawned (what a rolling restart behind a
# load balancer does); once every worker has answered a subscription: census 1
# and the hub reports 4 workers. Ten boots: both pgbus shapes, both plugin
# files, puma.rb with and without `require "pgbus"`, no plugin at all; then
# the same across a hot restart (USR2), a phased restart (USR1: no
# preload_app!, the hub configured in puma.rb) and fork_worker reforks (URG).
RSpec.describe "reliability 12p: start-up hammer", :reliability do
  include PumaE2E

  BOOTS = [
    { mode: :standalone },
    { mode: :pgbus, shape: "v382", order: :ours_first },
    { mode: :pgbus, shape: "v382", order: :pgbus_first },
    { mode: :pgbus, shape: "v382", order: :pgbus_first, puma_rb_requires: "pgbus" },
    { mode: :pgbus, shape: "v382", order: :pgbus_first, eager: true, plugins: "pgbus_streams,pgbus_hub" },
    { mode: :pgbus, shape: "v382", plugins: "" },
    { mode: :pgbus, shape: "pre382", order: :ours_first },
    { mode: :pgbus, shape: "pre382", order: :pgbus_first },
    { mode: :pgbus, shape: "pre382", order: :pgbus_first, puma_rb_requires: "pgbus" },
    { mode: :pgbus, shape: "pre382", order: :pgbus_first, plugins: "pgbus_hub" }
  ].freeze

  before { skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available? }
  after { stop_clusters }

  def now = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  # Six client threads subscribe without pause until `count` workers (pids
  # not in `old`) answered; bounded at 60 s. Returns {pid => response}.
  def hammer(c, stream, count: 4, old: [])
    seen = {}
    lock = Mutex.new
    deadline = now + 60
    Array.new(6) do
      Thread.new do
        until lock.synchronize { seen.size >= count } || now > deadline
          r = c.get("/sub?q=#{stream}&hold=0.02")
          lock.synchronize { seen[r["pid"]] ||= r } if r && !old.include?(r["pid"])
        end
      end
    end.each(&:join)
    expect(seen.size).to eq(count), "only #{seen.size}/#{count} workers answered\n#{c.log[-3000..]}"
    seen
  end

  def expect_one_hub(c, workers: 4)
    expect(c.census_settles_at(1)).to eq(1)
    c.wait_for("the hub to report #{workers} workers", timeout: 10) { c.hub_info&.dig("stats", "workers") == workers }
  end

  BOOTS.each_with_index do |options, boot|
    it "boot #{boot + 1}/10 under a hammer from the first second: census 1, 4 workers on the hub — #{options}" do
      c = cluster(wait: false, **options)
      subs = hammer(c, unique_stream)
      # bin/trixie runs this on a Puma it did not install (8.x, 7.x from source): prove which one ran.
      expect(c.log).to include("Puma version: #{ENV['PGBUS_E2E_PUMA_VERSION']}") if ENV["PGBUS_E2E_PUMA_VERSION"]
      expect(subs.values.map { |s| s["result"] }.uniq).to eq(["done"])
      expect_one_hub(c)
      expect(c.log).not_to include("master hub not reachable")
    end
  end

  it "USR2 (hot restart) under a hammer: census 1, 4 workers on the new hub" do
    c = cluster(wait: false, mode: :pgbus, shape: "v382", order: :pgbus_first)
    stream = unique_stream
    old = hammer(c, stream).keys
    expect_one_hub(c)
    c.signal("USR2")
    hammer(c, stream, old: old)
    expect_one_hub(c)
    expect(c.log).not_to include("master hub not reachable")
  end

  it "USR1 (phased restart, hub configured in puma.rb) under a hammer: census 1, 4 workers" do
    c = cluster(wait: false, mode: :standalone, preload: false, env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1" })
    stream = unique_stream
    old = hammer(c, stream).keys
    expect_one_hub(c)
    c.signal("USR1")
    hammer(c, stream, old: old)
    c.wait_log(/Worker \d \(PID: \d+\) booted.*phase: 1/, count: 4, timeout: 60)
    expect_one_hub(c)
  end

  it "fork_worker reforks (URG) under a hammer: census 1, 4 workers after each" do
    c = cluster(wait: false, mode: :standalone, fork_worker: true, preload: false,
                env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1" })
    stream = unique_stream
    pids = hammer(c, stream).keys
    expect_one_hub(c)
    2.times do |round|
      c.signal("URG")
      c.wait_log(/Worker [1-3] \(PID: \d+\) booted.*phase: #{round + 1}/, count: 3, timeout: 60)
      pids = hammer(c, stream, count: 3, old: pids).keys + pids # worker 0 stays
      expect_one_hub(c)
    end
  end
end
