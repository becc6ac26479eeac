# frozen_string_literal: true

require_relative "support/helpers"

# Scenario 1: pg_terminate_backend on the hub's LISTEN connection, 20 times.
RSpec.describe "reliability 1: hub's LISTEN backend terminated x20", reliability: :fast do
  it "reconnects and re-LISTENs every time; workers see healthy false then true; nothing acked is lost" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      workers = Array.new(2) { RelWorker.new(hub.socket_path) }
      subs = { workers[0] => %w[t_a t_shared], workers[1] => %w[t_b t_shared] }
      subs.each { |w, qs| qs.each { |q| expect(w.sub(q)["result"]).to eq(":done") } }
      # A wire-level peer sees every status frame (a HubClient only keeps the last).
      peer = WirePeer.new(hub.socket_path)
      peer.subscribe("t_wire")
      wait_for("census 1") { Rel.census == 1 }
      samples = [hub.proc_sample]
      recoveries = []
      20.times do |round|
        t0 = Rel.now
        expect(Rel.terminate_listen_backends).to eq(1)
        seen = []
        until seen.include?(false) && seen.last == true
          frame = peer.next_frame(timeout: 10)
          raise "hub closed the wire peer in round #{round}" unless frame

          seen << frame["healthy"] if frame["t"] == "status"
        end
        recoveries << ((Rel.now - t0) * 1000).round(1)
        # Invariant 1 (+ the wire peer): NOTIFYs committed after recovery reach every acked sub.
        assert_acked_subs_get_wakes(subs, tag: "round-#{round}")
        Rel.notify("t_wire", "w#{round}")
        frame = peer.next_non_status
        frame = peer.next_non_status while frame && frame["p"] != "w#{round}"
        expect(frame).to include("q" => "t_wire", "p" => "w#{round}")
        expect(Rel.census).to eq(1)
        samples << hub.proc_sample
      end
      stats = hub.stats
      expect(stats[:reconnects]).to be >= 20
      expect(stats[:listener_healthy]).to be(true)
      expect(workers.none?(&:failed_over?)).to be(true) # a PostgreSQL blip is not a hub failure
      assert_no_growth(samples)
      Rel.record("s1_terminate_x20", { recovery_ms_p50: Rel.percentile(recoveries, 50),
                                       recovery_ms_max: recoveries.max, reconnects: stats[:reconnects],
                                       master_first: samples[1], master_last: samples.last })
      peer.close
      workers.each(&:stop)
      hub.stop
    end
  end
end
