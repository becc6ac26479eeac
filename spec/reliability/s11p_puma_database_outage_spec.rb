# frozen_string_literal: true

require_relative "support/puma"

# A database outage is not a hub failure. A 4-worker Puma cluster (the native
# hub in the master) on a private PostgreSQL cluster; the server is stopped for
# 10 s while requests keep subscribing new queues, then started again:
# - no worker leaves the hub (no fail-over, so no per-worker connection that it
#   would keep for hours after the outage): census back to 1 within 5 s;
# - a request that subscribes during the outage returns promptly (p99 < 100 ms)
#   with the "not listening yet" result (nil), not after ack_timeout;
# - every worker gets the next NOTIFY, including on queues first subscribed
#   during the outage (the hub kept them and LISTENed them on reconnect).
RSpec.describe "reliability 11p: database outage under a Puma cluster", :reliability do
  include PumaE2E

  outage_seconds = 10

  before { skip "no PostgreSQL binaries for a private cluster" unless PrivateCluster.available? }

  after do
    stop_clusters
    @pg&.destroy
  end

  def pg_census(pg)
    conn = pg.connect
    Census::Count.new(conn.exec("select pid, client_port, backend_start from pg_stat_activity " \
                                "where application_name = 'pgbus-listen' order by pid").to_a)
  ensure
    conn&.close
  end

  def pg_notify(pg, channel, payload)
    conn = pg.connect
    conn.exec_params("select pg_notify($1, $2)", [channel, payload])
  ensure
    conn&.close
  end

  # NOTIFYs until every pid recorded a wake for it (a NOTIFY sent while the hub
  # is still re-LISTENing is lost by design: re-sent every 0.5 s, bounded).
  def wake_everywhere(cluster, pg, pids, queue, payload)
    missing = pids
    20.times do
      pg_notify(pg, queue, payload)
      sleep 0.5
      missing = pids.reject { |pid| cluster.wakes(pid).include?([queue, payload]) }
      return [] if missing.empty?
    end
    missing
  end

  it "keeps every worker on the hub through a #{outage_seconds} s outage; census 1 within 5 s after; requests stay fast" do
    @pg = PrivateCluster.new
    @pg.start
    c = cluster(mode: :standalone, env: { "PGBUS_E2E_DATABASE_URL" => @pg.url })
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    subs = c.subscribe_all(stream)
    expect(subs.values.map { |s| s["listener"] }.uniq).to eq(["Pgbus::Hub::FailoverListener"])
    wait_for("census 1 before the outage") { pg_census(@pg) == 1 }

    @pg.stop
    outage_started = Rel.now
    latencies = []
    results = []
    during = []
    while Rel.now - outage_started < outage_seconds
      queue = "#{stream}_during_#{during.size}"
      t0 = Rel.now
      response = c.get("/sub?q=#{queue}")
      latencies << (Rel.now - t0)
      during << queue
      results << response["result"]
      sleep 0.05
    end
    @pg.start
    back_at = Rel.now
    wait_for("census 1 after the outage", timeout: 30, interval: 0.05) { (pg_census(@pg) rescue nil) == 1 } # rubocop:disable Style/RescueModifier
    census_after_s = Rel.now - back_at

    p99_ms = Rel.percentile(latencies, 99) * 1000
    expect(results).to include(nil) # "not listening yet" while the database was down
    expect(p99_ms).to be < 100
    expect(census_after_s).to be < 5
    expect(c.log).not_to match(/falling back to a per-worker listener|failed over to a per-worker listener/)

    pids = c.worker_pids
    expect(wake_everywhere(c, @pg, subs.keys, stream, "after-outage")).to be_empty
    # A queue first subscribed during the outage reaches whichever worker subscribed it.
    late = during.first
    subscriber = pids.find { |pid| c.acked_subs(pid).include?(late) || c.records_of("subs", pid, 0).first.any? { |q, *| q == late } }
    expect(wake_everywhere(c, @pg, [subscriber], late, "late")).to be_empty
    expect(pg_census(@pg)).to eq(1)

    Rel.record("11p", { requests: latencies.size, unconfirmed: results.count(nil),
                        request_p50_ms: (Rel.percentile(latencies, 50) * 1000).round(1), request_p99_ms: p99_ms.round(1),
                        request_max_ms: (latencies.max * 1000).round(1), census_1_after_s: census_after_s.round(3) })
  end
end
