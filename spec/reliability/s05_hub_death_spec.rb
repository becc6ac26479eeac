# frozen_string_literal: true

require_relative "support/helpers"

# Scenario 5 (without Puma): the master hub's process dies (SIGKILL), or is
# wedged (SIGSTOP) so subs go unacked. Every worker fails over within
# ack_timeout; nothing committed after its fail-over is lost.
RSpec.describe "reliability 5: hub process death", reliability: :fast do
  ack_timeout = 2.0

  it "SIGKILL: every worker fails over within ack_timeout and keeps every acked subscription" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      workers = Array.new(4) { RelWorker.new(hub.socket_path, ack_timeout: ack_timeout) }
      subs = workers.each_with_index.to_h { |w, i| [w, ["h_shared", "h_own_#{i}"]] }
      subs.each { |w, qs| qs.each { |q| expect(w.sub(q)["result"]).to eq(":done") } }
      assert_acked_subs_get_wakes(subs, tag: "before")
      expect(Rel.census).to eq(1)
      t0 = Rel.now
      hub.kill("KILL")
      failovers = workers.map { |w| w.wait_event("failed over", timeout: ack_timeout + 5) { |e| e["ev"] == "failed_over" } }
      fail_over_s = failovers.map { |e| (e["t"] - t0).round(3) }
      expect(failovers.map { |e| e["ok"] }).to all(be(true))
      expect(fail_over_s.max).to be < ack_timeout
      expect(Rel.census).to eq(4) # N during a fallback
      latency = assert_acked_subs_get_wakes(subs, tag: "after")
      # New subscriptions after the fail-over go to the local listener.
      expect(workers[0].sub("h_new")["result"]).to eq(":done")
      assert_acked_subs_get_wakes({ workers[0] => %w[h_new] }, tag: "new")
      Rel.record("s5_hub_sigkill", { workers: 4, fail_over_s: fail_over_s, wake_after_s: latency.round(4),
                                     census_during_fallback: 4 })
      workers.each(&:stop)
      wait_for("fallback listeners closed") { Rel.census.zero? }
    end
  end

  it "SIGSTOP (no ack): the waiting sub fails over after ack_timeout and is retried locally" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      worker = RelWorker.new(hub.socket_path, ack_timeout: ack_timeout)
      worker.sub("h_acked")
      Rel.sigstop(hub.pid)
      begin
        t0 = Rel.now
        event = worker.sub("h_unacked", timeout: ack_timeout + 10)
        waited = Rel.now - t0
        expect(event).to include("result" => ":done", "failed_over" => true)
        expect(waited).to be_between(ack_timeout * 0.9, ack_timeout + 3)
        assert_acked_subs_get_wakes({ worker => %w[h_acked h_unacked] })
        Rel.record("s5_hub_sigstop", { sub_returned_after_s: waited.round(3) })
      ensure
        Process.kill("CONT", hub.pid)
      end
      worker.stop
      hub.stop
    end
  end
end
