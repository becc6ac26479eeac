# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"

# A busy host, in a real Puma cluster:
# - a durable broadcast committed while the hub's connection is down reaches
#   nobody (its NOTIFY has no listener); once the hub LISTENs again, with no
#   further traffic, it wakes every subscribed worker for every queue so each
#   re-reads what was committed meanwhile (catch-up);
# - an app that bounds its dispatch queue (pgbus's streams_dispatch_queue_limit)
#   and stops draining it blocks the worker's pump thread: subs must still be
#   acked, the worker must stay on the hub (census 1), and every wake must
#   arrive once the app drains again.
RSpec.describe "a busy host", :puma do
  include PumaE2E

  before { skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available? }
  after { stop_clusters }

  it "wakes all 4 workers for a queue broadcast to while the hub could not connect, within 1 s of its re-LISTEN" do
    c = cluster(mode: :standalone)
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    pids = c.subscribe_all(stream).keys
    expect(c.census_settles_at(1)).to eq(1)
    hub_backend = c.hub_info.dig("stats", "backend_pid")
    expect(hub_backend).to be_a(Integer)

    admin = PG.connect(PumaCluster::DATABASE_URL) # opened before the hold: it outlives it
    database = admin.quote_ident(admin.exec("select current_database()").getvalue(0, 0))
    control = PG.connect("#{PumaCluster::DATABASE_URL} dbname=postgres") # a database may not close itself
    begin
      # Hold the hub off: this run's database takes no new connection, then its backend goes.
      control.exec("alter database #{database} allow_connections false")
      admin.exec_params("select pg_terminate_backend($1)", [hub_backend])
      c.wait_for("the hub to see its connection gone", timeout: 10) { c.hub_info.dig("stats", "listener_healthy") == false }
      admin.exec_params("select pg_notify($1, '')", [stream]) # the broadcast nobody hears
      sleep 0.5
      expect(pids.select { |pid| c.wakes(pid).include?([stream, nil]) }).to be_empty
    ensure
      control.exec("alter database #{database} allow_connections true")
    end

    c.wait_for("the hub to LISTEN again", timeout: 30) do
      c.hub_info["stats"].then { |s| s["listener_healthy"] && s["reconnects"] >= 1 && s["backend_pid"] != hub_backend }
    end
    # The re-LISTEN's moment on the workers' clock (their wake records are CLOCK_MONOTONIC).
    relistened_at = c.hub_info.dig("stats", "healthy_since") - (Process.clock_gettime(Process::CLOCK_REALTIME) - monotonic)
    woken_at = lambda do |pid|
      c.wake_records(pid).first.find { |queue, payload, _t| queue == stream && payload.nil? }&.last
    end
    c.wait_for("every worker woken for #{stream}", timeout: 5) { pids.all?(&woken_at) }
    delays = pids.to_h { |pid| [pid, (woken_at.call(pid) - relistened_at).round(3)] }
    expect(delays.values).to all(be <= 1.0), "seconds from the re-LISTEN to each worker's wake: #{delays}"
    puts "  [catch-up: #{pids.size} workers woken #{delays.values.minmax.join('–')} s after the hub's re-LISTEN]"
    expect(c.census_settles_at(1)).to eq(1)
    expect(c.log).to include("queues woken to re-read what was committed meanwhile")
  ensure
    admin&.close
    control&.close
  end

  it "answers 10 new subs while its full dispatch queue blocks the pump for 5 s, stays on the hub, loses no wake" do
    c = cluster(mode: :standalone, env: { "PGBUS_E2E_DISPATCH_LIMIT" => "1" })
    c.wait_log(/master hub listening at/)
    stream = unique_stream
    c.subscribe_all(stream)
    expect(c.census_settles_at(1)).to eq(1)

    fresh = Array.new(10) { |i| "#{stream}_n#{i}" }
    stall_ends = monotonic + 5
    # One worker stops draining for 5 s and, 1 s in, subscribes 10 new queues.
    stalled = c.get("/sub?q=#{stream}&stall=5&bg=#{fresh.join(',')}&bg_after=1")["pid"]
    # Its queue (1 slot) fills with the first wake; its pump blocks on the second.
    %w[s0 s1 s2].each { |payload| notify(stream, payload) }
    answered = lambda do
      c.records_of("subs", stalled, 0).first.select { |queue, *| fresh.include?(queue) }
    end
    c.wait_for("the stalled worker's 10 subs answered", timeout: 10) { answered.call.size == 10 }
    rows = answered.call
    expect(rows.map { |row| row[1] }).to all(eq("done"))
    expect(rows.map(&:last).max).to be < stall_ends # all answered while the app still did not drain
    expect(c.wakes(stalled)).not_to include([stream, "s1"]) # the pump was still blocked then
    expect(c.census_settles_at(1)).to eq(1) # nobody failed over to a connection of its own

    c.wait_for("the stalled worker's wakes once it drains", timeout: 15) do
      %w[s0 s1 s2].all? { |payload| c.wakes(stalled).include?([stream, payload]) }
    end
    expect(c.wakes(stalled).select { |queue, _| queue == stream }.map(&:last).compact).to eq(%w[s0 s1 s2])
    acks_ms = rows.map { |row| (row[2] * 1000).round(2) }
    puts "  [stalled worker: 10 subs acked while its dispatch queue was full: #{acks_ms.sort.join(", ")} ms; census 1]"
  end
end
