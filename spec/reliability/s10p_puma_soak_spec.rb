# frozen_string_literal: true

require_relative "support/puma"

# Scenario 10 in a real Puma cluster: a soak with the hub configured in
# puma.rb and no preload_app! (the configuration whose phased restarts keep the
# hub), 4 workers. Each round: workers without subscriptions subscribe, every
# acked subscription of every live worker gets its wake, census is 1, then a
# worker is kill -9'd mid-subscription and Puma boots a replacement; every
# PHASE_EVERY seconds a phased restart (USR1) replaces all four. The master's
# fds, threads and RSS (/proc/<master>) must not grow; the hub keeps its
# PostgreSQL connection throughout. Default 100 s; the issue's 20 minutes:
# PGBUS_HUB_PUMA_SOAK_SECONDS=1200 rspec --tag reliability spec/reliability/s10p_puma_soak_spec.rb
RSpec.describe "reliability 10p: Puma cluster soak", :reliability do
  include PumaE2E

  seconds = Float(ENV.fetch("PGBUS_HUB_PUMA_SOAK_SECONDS", "100"))
  phase_every = Float(ENV.fetch("PGBUS_HUB_PUMA_SOAK_PHASE_EVERY", "20"))

  before { skip "no PostgreSQL at #{RelPuma.url}" unless PumaE2E.database_available? }
  after { stop_clusters }

  it "churns workers (kill -9 mid-subscription, phased restarts) for #{seconds.to_i} s: nothing acked lost, census 1, no master growth" do
    c = cluster(**RelPuma.options(preload: false, env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1" }))
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    shared = "#{stream}_shared"
    rng = Random.new(10)
    counts = Hash.new(0)
    series = []
    phased_s = []
    killed = []
    sample = lambda do |t|
      stats = RelPuma.live_stats(c)
      series << RelPuma.master_sample(c).merge(t: t.round, workers: stats[:workers], channels: stats[:channels],
                                               census: c.census)
    end
    t0 = Rel.now
    next_sample = t0
    next_phase = t0 + phase_every
    until Rel.now - t0 > seconds
      if Rel.now >= next_phase
        phase = counts[:phased_restarts] += 1
        t_phase = Rel.now
        old_phase = c.worker_pids
        c.signal("USR1")
        c.wait_log(/booted in [\d.]+s, phase: #{phase}$/, count: 4, timeout: 90)
        wait_for("the old phase's workers gone", timeout: 30, interval: 0.05) do
          c.worker_pids.size == 4 && (c.worker_pids & old_phase).empty?
        end
        phased_s << (Rel.now - t_phase).round(2)
        next_phase = Rel.now + phase_every
      end
      if c.worker_pids.any? { |pid| c.acked_subs(pid).empty? }
        c.subscribe_all(shared, own: true)
        counts[:subscribe_rounds] += 1
      end
      RelPuma.wait_routes_released(c, killed, what: "hub routes = the live workers' acks")
      assert_cluster_subs_get_wakes(c, tag: "round-#{counts[:rounds]}")
      expect(c.census).to eq(1)
      mid = Array.new(6) { |j| "#{stream}_m#{counts[:rounds]}_#{j}" }
      victim = wait_for("a worker to serve", timeout: 30, interval: 0.1) { c.get("/sub?q=#{shared}&bg=#{mid.join(',')}") }["pid"]
      sleep(rng.rand * 0.004)
      c.signal("KILL", victim)
      killed << victim
      counts[:kill9] += 1
      RelPuma.wait_routes_released(c, killed, what: "hub released worker #{victim}'s refs")
      wait_for("Puma replaced worker #{victim}", timeout: 30, interval: 0.02) { (c.worker_pids - killed).size == 4 }
      counts[:rounds] += 1
      sleep 0.2 # modest: other engineers share these 2 cores
      next unless Rel.now >= next_sample

      sample.call(Rel.now - t0)
      next_sample += [seconds / 12, 5].max
    end
    c.subscribe_all(shared, own: true)
    assert_cluster_subs_get_wakes(c, tag: "final")
    sample.call(Rel.now - t0)
    expect(c.census_settles_at(1)).to eq(1)
    stats = RelPuma.live_stats(c)
    expect(stats).to include(workers: 4, evicted_workers: 0, listener_restarts: 0)
    expect(c.log.scan(/master hub listening at/).size).to eq(1) # one hub, never restarted
    expect(c.log.scan(/master hub started before fork/).size).to eq(1)
    # Growth: the first quarter of the run is warm-up (the master's Ruby heap
    # still settles, ~2 KB/s even idle); compare the next sample with the last.
    assert_no_growth(series.drop(series.size / 4), fd_slack: 2, thread_slack: 0, rss_slack_kb: 4096)
    Rel.record("s10p_puma_soak", {
                 seconds: seconds, counts: counts, phased_restart_s: phased_s,
                 hub: stats.slice(:reconnects, :channels, :wakes_received, :frames_sent, :uptime),
                 foreign_reconnect_retries: @foreign_reconnect_retries || 0,
                 series: series
               })
  end
end
