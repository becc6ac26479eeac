# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"

# An app that bounds its dispatch queue (pgbus's streams_dispatch_queue_limit)
# and stops draining it: the worker's pump thread blocks pushing a wake. Subs
# must still be acked (each reads the hub's answer itself), the worker must stay
# on the hub (census 1), and every wake must arrive once the app drains again.
RSpec.describe "a Puma worker whose app stops draining its wakes", :puma do
  include PumaE2E

  before { skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available? }
  after { stop_clusters }

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

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
