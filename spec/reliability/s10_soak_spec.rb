# frozen_string_literal: true

require_relative "support/helpers"

# Scenario 10: a bounded soak. Workers connect, subscribe, are killed (-9) or
# stop; the hub's backend is terminated now and then. Default 180 s; the
# issue's 20-minute run: PGBUS_HUB_SOAK_SECONDS=1200 rspec spec/reliability/s10_soak_spec.rb
RSpec.describe "reliability 10: soak", :reliability do
  seconds = Float(ENV.fetch("PGBUS_HUB_SOAK_SECONDS", "180"))

  it "churns for #{seconds.to_i} s with no fd/thread/RSS growth and no lost acked subscription" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      anchor = RelWorker.new(hub.socket_path)
      anchor.sub("soak_anchor")
      anchor.sub("soak_pool_0")
      rng = Random.new(10)
      series = []
      counts = Hash.new(0)
      t0 = Rel.now
      next_sample = t0
      churn = lambda do
        until Rel.now - t0 > seconds
          batch = Array.new(3) { RelWorker.new(hub.socket_path) }
          subs = batch.to_h { |w| [w, Array.new(3) { "soak_pool_#{rng.rand(40)}" }.uniq] }
          marks = batch.to_h { |w| [w, w.size] }
          # ensure_listening's answer: :done once the hub's LISTEN runs; nil when the hub answered it
          # by the outage rule (a reconnect under way, caused or not by this soak: its health
          # check is 100 ms on shared cores), which promises the catch-up wake, not the payload.
          answered = subs.to_h { |w, qs| [w, qs.partition { |q| w.sub(q)["result"] == ":done" }] }
          confirmed = answered.transform_values(&:first)
          # Invariant 1 for everyone currently confirmed, every round.
          assert_acked_subs_get_wakes(confirmed.merge(anchor => %w[soak_anchor soak_pool_0]), tag: "round-#{counts[:rounds]}")
          answered.each do |w, (_, outage)|
            outage.each do |q|
              w.wait_event("#{q}'s wake after an outage-rule sub", from: marks[w]) { |e| e["ev"] == "wake" && e["q"] == q }
              counts[:outage_rule_subs] += 1
            end
          end
          batch.each do |w|
            case rng.rand(3)
            when 0 then w.kill9.then { counts[:kill9] += 1 }
            when 1 then w.stop.then { counts[:stopped] += 1 }
            else
              w.sub_async("soak_mid_#{rng.rand(1000)}") # killed mid-subscription
              w.kill9
              counts[:kill9_mid_sub] += 1
            end
          end
          if (counts[:rounds] % 25) == 24
            reconnects = hub.stats[:reconnects]
            Rel.terminate_listen_backends
            counts[:terminations] += 1
            # The reconnect counted, not only healthy: read right after the terminate, healthy is
            # still the old connection's (the hub has not seen the backend go yet).
            wait_for("reconnected after terminate") { hub.stats.then { |st| st[:reconnects] > reconnects && st[:listener_healthy] } }
          end
          counts[:rounds] += 1
          sleep 0.1 # modest: other engineers share these 2 cores
          wait_for("churned workers released") { hub.stats[:workers] == 1 }
          next unless Rel.now >= next_sample

          series << hub.proc_sample.merge(t: (Rel.now - t0).round, channels: hub.stats[:channels], census: Rel.census)
          next_sample += [seconds / 12, 5].max
        end
      end
      begin
        churn.call
      rescue RuntimeError, RSpec::Expectations::ExpectationNotMetError => e
        # The hub's log goes with the temp dir: keep its end with the failure.
        raise e.class, "#{e.message}\nhub log (last 40 lines):\n#{hub.log.lines.last(40).join}"
      end
      series << hub.proc_sample.merge(t: (Rel.now - t0).round, channels: hub.stats[:channels], census: Rel.census)
      expect(hub.stats).to include(workers: 1, channels: 2)
      expect(Rel.census).to eq(1)
      expect(anchor.failed_over?).to be(false)
      # Growth: the first sample is warm-up; compare the second with the last.
      assert_no_growth(series, fd_slack: 2, thread_slack: 0, rss_slack_kb: 4096)
      Rel.record("s10_soak", { seconds: seconds, counts: counts, series: series, stats: hub.stats.slice(:reconnects, :evicted_workers) })
      anchor.stop
      hub.stop
    end
  end
end
