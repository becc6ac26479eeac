# frozen_string_literal: true

require_relative "support/puma"

# Scenario 3 in a real Puma cluster (4 workers, preload_app!, the native hub in
# the master): a worker is kill -9'd while its background thread is still
# subscribing, then Puma forks a replacement; repeated. The hub releases the
# dead worker's refs (stats workers/channels back to what the live workers
# acked), UNLISTENs its last-ref channels (a NOTIFY on one never reaches the
# hub), census stays 1, the master does not grow, and every live worker's
# acked subscription still gets its wake. PGBUS_HUB_PUMA_KILL_ROUNDS (default 50).
RSpec.describe "reliability 3p: Puma worker kill -9 mid-subscription", :reliability do
  include PumaE2E

  rounds = Integer(ENV.fetch("PGBUS_HUB_PUMA_KILL_ROUNDS", "50"))

  before { skip "no PostgreSQL at #{RelPuma.url}" unless PumaE2E.database_available? }
  after { stop_clusters }

  it "releases each killed worker's refs, UNLISTENs its last-ref channels, census 1, acked subs keep waking (x#{rounds})" do
    c, shared, = subscribed_hub_cluster
    stream = shared.delete_suffix("_shared")
    samples = [RelPuma.master_sample(c)]
    release_ms = []
    respawn_ms = []
    orphans = []
    killed = []
    mid_acked = [] # background subs acked before the kill (of 8): < 8 = killed mid-subscription
    t_start = Rel.now
    rounds.times do |i|
      own = "#{stream}_k#{i}"
      mid = Array.new(8) { |j| "#{stream}_m#{i}_#{j}" }
      response = wait_for("a worker to serve round #{i}", timeout: 30, interval: 0.1) do
        c.get("/sub?q=#{shared},#{own}&bg=#{mid.join(',')}")
      end
      victim = response["pid"]
      expect(response["result"]).to eq("done")
      sleep(rand * 0.004) # the background subscriptions are in flight
      t0 = Rel.now
      c.signal("KILL", victim)
      killed << victim
      orphans.push(own, *mid)
      RelPuma.wait_routes_released(c, killed, what: "hub released worker #{victim}'s refs")
      release_ms << ((Rel.now - t0) * 1000).round(1)
      mid_acked << (c.acked_subs(victim) & mid).size
      wait_for("Puma re-spawned a worker for #{victim}", timeout: 30, interval: 0.02) do
        (c.worker_pids - killed).size == 4
      end
      respawn_ms << ((Rel.now - t0) * 1000).round
      next unless (i % 10) == 9 || i == rounds - 1

      expect(c.census).to eq(1)
      c.subscribe_all(shared, own: true) # the re-spawned workers subscribe as well
      assert_cluster_subs_get_wakes(c, tag: "round-#{i}")
      samples << RelPuma.master_sample(c)
    end
    kill_phase_s = Rel.now - t_start
    # The re-spawned workers subscribe too; then every acked sub wakes, and
    # none of the killed workers' own channels reaches the hub any more.
    c.subscribe_all(shared, own: true)
    before = RelPuma.live_stats(c)[:wakes_received]
    orphans.each { |q| RelPuma.notify(q, "orphan") }
    acked_queues = RelPuma.acked(c).values.flatten.uniq
    latency = assert_cluster_subs_get_wakes(c, tag: "final")
    expect(RelPuma.live_stats(c)[:wakes_received] - before).to eq(acked_queues.size)
    final = RelPuma.live_stats(c)
    expect(final).to include(workers: 4, channels: acked_queues.size, evicted_workers: 0)
    expect(c.census_settles_at(1)).to eq(1)
    assert_no_growth(samples)
    Rel.record("s3p_puma_kill9", {
                 rounds: rounds, kill_phase_s: kill_phase_s.round(1), orphan_channels: orphans.size,
                 killed_mid_subscription: mid_acked.count { |n| n < 8 }, mid_acked_before_kill: mid_acked.tally.sort.to_h,
                 release_ms_p50: Rel.percentile(release_ms, 50), release_ms_max: release_ms.max,
                 respawn_ms_p50: Rel.percentile(respawn_ms, 50), respawn_ms_max: respawn_ms.max,
                 final_wake_latency_ms: (latency * 1000).round(2), hub: final.slice(:workers, :channels, :reconnects),
                 foreign_reconnect_retries: @foreign_reconnect_retries || 0,
                 master: samples.map { |s| s.values_at(:fds, :threads, :rss_kb) }
               })
  end
end
