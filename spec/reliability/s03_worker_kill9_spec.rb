# frozen_string_literal: true

require_relative "support/helpers"

# Scenario 3: worker processes kill -9'd mid-subscription, 50 times.
RSpec.describe "reliability 3: worker kill -9 mid-subscription x50", :reliability do
  rounds = Integer(ENV.fetch("PGBUS_HUB_REL_KILL_ROUNDS", "50"))

  it "releases the dead worker's refs (channels back to the survivors'), UNLISTENs last refs, nothing acked lost" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      survivor = RelWorker.new(hub.socket_path)
      survivor.sub("k_shared")
      baseline = hub.stats
      expect(baseline).to include(workers: 1, channels: 1)
      samples = [hub.proc_sample]
      release_ms = []
      rounds.times do |i|
        victim = RelWorker.new(hub.socket_path)
        victim.sub("k_shared")
        victim.sub("k_own_#{i}")
        # Mid-subscription: subs in flight (some not yet acked) when SIGKILL lands.
        5.times { |j| victim.sub_async("k_mid_#{i}_#{j}") }
        victim.sub_async("k_shared")
        sleep(rand * 0.003)
        t0 = Rel.now
        victim.kill9
        wait_for("refs of victim #{i} released", timeout: 10) do
          s = hub.stats
          s[:workers] == 1 && s[:channels] == 1
        end
        release_ms << ((Rel.now - t0) * 1000).round(1)
        samples << hub.proc_sample if (i % 10).zero? || i == rounds - 1
      end
      # Every last-ref channel was UNLISTENed: a NOTIFY on one reaches nobody
      # (the hub ignores it) and the survivor still gets its shared queue.
      before = hub.stats[:wakes_received]
      Rel.notify("k_own_0", "orphan")
      expect(assert_acked_subs_get_wakes({ survivor => %w[k_shared] })).to be < 5
      expect(hub.stats[:wakes_received]).to eq(before + 1) # only k_shared's NOTIFY reached the hub
      expect(Rel.census).to eq(1)
      assert_no_growth(samples)
      Rel.record("s3_kill9", { rounds: rounds, release_ms_p50: Rel.percentile(release_ms, 50),
                               release_ms_max: release_ms.max, master: samples.values_at(1, -1) })
      survivor.stop
      hub.stop
    end
  end
end
