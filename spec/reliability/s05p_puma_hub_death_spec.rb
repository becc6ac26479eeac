# frozen_string_literal: true

require_relative "support/puma"

# Scenario 5 in a real Puma cluster (4 workers, preload_app!, the native hub
# in the master). The test app's master stops its hub on SIGWINCH
# (spec/support/puma_apps/config.rb: SharedHub.stop, the path a crash of the
# hub takes as far as workers can tell: their connections end); every worker
# fails over within ack_timeout, every acked subscription gets its wake, census
# becomes 4. With the master SIGSTOPped instead (a wedged hub, no EOF), a sub
# waits ack_timeout, that worker fails over, and nothing acked is lost.
RSpec.describe "reliability 5p: Puma master hub death", :reliability do
  include PumaE2E

  ack_timeout = 0.1 + 2.0 # Pgbus::Hub.listener: health_check_ms / 1000 + 2 (the app sets 100 ms)

  before { skip "no PostgreSQL at #{RelPuma.url}" unless PumaE2E.database_available? }
  after { resume_and_stop_clusters(@stopped) }

  it "hub stopped: every worker fails over within ack_timeout, nothing acked lost, census 4" do
    c, shared, pids = subscribed_hub_cluster
    assert_cluster_subs_get_wakes(c, tag: "before", pids: pids)
    views = RelPuma.views(c, pids)
    marks = views.map(&:size)
    t0 = Rel.now
    c.signal("WINCH")
    # A probe NOTIFY every 25 ms on the shared queue: the first one a worker
    # records bounds its fail-over time (hub gone -> own listener LISTENing).
    sent = {}
    first = {}
    wait_for("every worker woken by its own listener", timeout: ack_timeout + 10, interval: 0) do
      sent[n = sent.size] = Rel.now
      RelPuma.notify(shared, "probe-#{n}")
      sleep 0.025
      views.each_with_index do |v, i|
        first[v.pid] ||= v.wakes(from: marks[i]).find { |e| e["p"].to_s.start_with?("probe-") }&.fetch("t")
      end
      first.size == views.size && first.values.all?
    end
    recovered_s = first.transform_values { |t| (t - t0).round(3) }
    census_s = wait_for("census 4", timeout: 15, interval: 0.02) { c.census == 4 && Rel.now - t0 }
    expect(recovered_s.values.max).to be < ack_timeout
    expect(File.exist?(c.socket_path)).to be(false)
    c.wait_log(/failed over to a per-worker listener \(\d+ subscription/, count: 4)
    latency = assert_cluster_subs_get_wakes(c, tag: "after", pids: pids)
    # A subscription after the fail-over is served by the worker's own listener.
    fresh = c.get("/sub?q=#{shared}_new")
    expect(fresh).to include("result" => "done", "listener" => "Pgbus::Hub::FailoverListener")
    assert_cluster_subs_get_wakes(c, tag: "new", pids: [fresh["pid"]])
    expect(c.census_settles_at(4)).to eq(4)
    Rel.record("s5p_puma_hub_stop", {
                 workers: 4, ack_timeout_s: ack_timeout, first_wake_after_stop_s: recovered_s.values.sort,
                 census_4_after_s: census_s.round(3), probes_sent: sent.size,
                 acked_wake_latency_after_ms: (latency * 1000).round(2)
               })
  end

  it "master SIGSTOPped (hub wedged): a sub fails over after ack_timeout, the others keep the hub, nothing acked lost" do
    c, shared, pids = subscribed_hub_cluster
    Rel.sigstop(@stopped = c.pid) # stopped for sure before the sub below (a signal lands asynchronously)
    t0 = Rel.now
    wedged = c.get("/sub?q=#{shared}_wedged", timeout: ack_timeout + 10)
    waited = Rel.now - t0
    # NOTIFYs committed while the hub is wedged wait in its socket for it.
    pids.each { |pid| c.acked_subs(pid).each { |q| RelPuma.notify(q, "during-wedge") } }
    c.signal("CONT", c.pid)
    @stopped = nil
    expect(wedged).to include("result" => "done")
    expect(waited).to be_between(ack_timeout * 0.9, ack_timeout + 5)
    views = RelPuma.views(c, pids)
    views.each { |v| c.acked_subs(v.pid).each { |q| v.wait_wake(q, "during-wedge") } }
    # The worker that failed over comes back once the resumed hub acks its subscriptions.
    wait_for("the failed-over worker back on the hub", timeout: 15, interval: 0.05) do
      c.log.include?("back on the master hub")
    end
    expect(c.census_settles_at(1)).to eq(1)
    expect(RelPuma.live_stats(c)[:workers]).to eq(4)
    assert_cluster_subs_get_wakes(c, tag: "after", pids: pids)
    Rel.record("s5p_puma_master_sigstop", { sub_returned_after_s: waited.round(3), census_after: 1, hub_workers_after: 4 })
  end
end
