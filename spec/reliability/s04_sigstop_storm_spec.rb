# frozen_string_literal: true

require_relative "support/helpers"

# Scenario 4 without Puma: a forked worker process SIGSTOPped while an
# ephemeral storm runs. It is evicted at hard_queue_limit; the others lose
# nothing and keep their latency; PostgreSQL's NOTIFY queue stays drained;
# on SIGCONT the stopped worker fails over and gets new wakes locally.
RSpec.describe "reliability 4: SIGSTOPped worker during an ephemeral storm", :reliability do
  def probe(workers, queue, tag)
    marks = workers.map(&:size)
    t0 = Rel.now
    Rel.notify(queue, tag)
    workers.each_with_index.map { |w, i| w.wait_wake(queue, tag, from: marks[i])["t"] - t0 }.max
  end

  it "evicts it, keeps the others whole and fast, and it fails over on SIGCONT" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir) # pgbus's limits: durable 256, hard 1024
      healthy = Array.new(3) { RelWorker.new(hub.socket_path) }
      victim = RelWorker.new(hub.socket_path)
      (healthy + [victim]).each { |w| w.sub("storm") }
      healthy.each { |w| w.sub("lat") }
      baseline = Array.new(100) { |i| probe(healthy, "lat", "base-#{i}") }
      victim.signal("STOP")
      storm_conn = TestDatabase.connect(Rel.url)
      payload = "s" * 4000
      sent = 0
      usage = []
      storm_lat = []
      until hub.stats[:evicted_workers] == 1 || sent > 6000
        20.times { Rel.notify("storm", "#{sent += 1}:#{payload}", conn: storm_conn) }
        usage << Rel.queue_usage
        storm_lat << probe(healthy, "lat", "storm-#{sent}")
      end
      evicted_after = sent
      expect(hub.stats[:evicted_workers]).to eq(1)
      200.times { Rel.notify("storm", "#{sent += 1}:#{payload}", conn: storm_conn) }
      usage << Rel.queue_usage
      # No ephemeral payload lost by the hub for a worker that was not evicted.
      healthy.each do |w|
        w.wait_wake("storm", "#{sent}:#{payload}", timeout: 30)
        seqs = w.wakes("storm").map { |e| e["p"].to_i }
        expect(seqs).to eq((1..sent).to_a)
      end
      expect(usage.max).to be < 0.01 # the hub never stopped draining PostgreSQL
      expect(Rel.census).to eq(1)
      t_cont = Rel.now
      victim.signal("CONT")
      victim.wait_event("fail-over", timeout: 15) { |e| e["ev"] == "failed_over" }
      failover_s = Rel.now - t_cont
      wait_for("victim's local listener delivers", timeout: 15, interval: 0.2) do
        Rel.notify("storm", "after failover")
        victim.find_event { |e| e["ev"] == "wake" && e["p"] == "after failover" }
      end
      expect(Rel.census).to eq(2) # the hub + the victim's fallback
      assert_acked_subs_get_wakes(healthy.to_h { |w| [w, %w[storm lat]] }.merge(victim => %w[storm]))
      ratio = Rel.percentile(storm_lat, 99) / Rel.percentile(baseline, 99)
      Rel.record("s4_sigstop_storm", {
                   notifies_until_evicted: evicted_after, victim_received_before_eviction: victim.wakes("storm").size,
                   baseline_p99_ms: (Rel.percentile(baseline, 99) * 1000).round(2),
                   storm_p99_ms: (Rel.percentile(storm_lat, 99) * 1000).round(2), p99_ratio: ratio.round(2),
                   max_queue_usage: usage.max, sigcont_to_failover_s: failover_s.round(3),
                   dropped_durable_wakes: hub.stats[:dropped_durable_wakes]
                 })
      storm_conn.close
      (healthy + [victim]).each(&:stop)
      hub.stop
    end
  end
end
