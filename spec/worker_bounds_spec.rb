# frozen_string_literal: true

require "rbconfig"
require_relative "support/database"

# A worker's own path is bounded or coalesced (docs/configuration.md, "Limits",
# worker_payload_limit): a worker on its own connection whose dispatch queue does not drain
# keeps at most worker_payload_limit payload wakes and one durable wake per queue, drops and
# counts the rest exactly, and its memory stays flat however long the flood.
RSpec.describe "a worker whose dispatch queue is blocked" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  it "keeps worker_payload_limit payloads and one durable wake per queue, drops and counts the rest, RSS flat" do
    limit = Pgbus::Hub::WORKER_PAYLOAD_LIMIT
    floods = 15_000
    queue = "wb_#{Process.pid}"
    script = File.join(__dir__, "support/worker_flood.rb")
    rubylib = [File.join(ROOT, "lib"), *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR)
    out = IO.popen({ "RUBYLIB" => rubylib }, [RbConfig.ruby, script, queue, floods.to_s, "3"], "rb", &:read)
    expect(Process.last_status).to be_success
    report = Marshal.load(out) # rubocop:disable Security/MarshalLoad -- our own child's output

    # "first" was in the pump's hands; then the first `limit` payloads of the first flood, in
    # order; every later one dropped (the second flood entirely: nothing was taken meanwhile).
    payloads = report[:delivered].select { |q, _| q == queue }.map(&:last)
    expect(payloads).to eq(["first", *(1..limit).map { |i| "0:#{i}" }])
    expect(report[:dropped]).to eq((2 * floods) - limit)
    expect(report[:events].sum { |event| event[:dropped] }).to eq(report[:dropped])
    expect(report[:events].first).to include(queue: queue, wake: :payload, connection: nil, pid: Integer)
    # 10 durable NOTIFYs per queue while blocked: one wake each.
    durable = report[:delivered].reject { |q, _| q == queue }
    expect(durable).to eq(%W[#{queue}_d0 #{queue}_d1 #{queue}_d2].map { |q| [q, nil] })
    # 15,000 more 4 kB payloads cost nothing once the limit is reached (unbounded: ~60 MB more).
    first, second = report[:rss_kb]
    warn "worker flood: RSS #{first} kB after the first #{floods} payloads, #{second} kB after the second; " \
         "#{report[:dropped]} dropped"
    expect(second - first).to be < 8 * 1024
  end
end
