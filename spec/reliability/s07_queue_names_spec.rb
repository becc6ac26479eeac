# frozen_string_literal: true

require "logger"
require "stringio"
require_relative "support/helpers"

# Scenario 7: hostile and boundary queue names. No SQL injection (the hub's
# connection is never broken by a name, and the exact channel is LISTENed),
# no silent cross-talk, a clear error where a name cannot work.
RSpec.describe "reliability 7: queue names", reliability: :fast do
  prefix_suffix = "pgmq.q_".bytesize + ".INSERT".bytesize # 14
  working = [
    'dq"uote', "sq'uote", "semi;colon", '";select pg_terminate_backend(pg_backend_pid())--', # 49 bytes: fits
    "';select pg_terminate_backend(pg_backend_pid())--", 'a";LISTEN "b', "with space", "  lead and trail  ",
    "ünïcødé ✓ 日本", "UPPER_lower", "back\\slash", "n" * (63 - prefix_suffix), # channel of exactly 63 bytes
    "#{'é' * 24}x" # 49 bytes in 25 characters: 63-byte channel
  ].freeze
  refused = {
    "" => /empty queue name/,
    "n" * (64 - prefix_suffix) => /64 bytes/,
    "n" * (200 - prefix_suffix) => /200 bytes/,
    "é" * 25 => /64 bytes/, # 25 characters, 50 bytes: over the limit in BYTES
    "nul\0byte" => /NUL/
  }.freeze
  # Two names PostgreSQL would truncate to the same 63-byte identifier.
  twins = ["#{'t' * 60}_one", "#{'t' * 60}_two"].freeze

  it "LISTENs exactly the named channel for every working name, with no cross-talk and no injection" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      worker = RelWorker.new(hub.socket_path)
      other = RelWorker.new(hub.socket_path)
      other.sub("bystander")
      working.each { |name| expect(worker.sub(name)["result"]).to eq(":done"), name.inspect }
      mark = other.size
      tag = "names-#{rand(1 << 30)}"
      working.each { |name| Rel.notify(name, tag) }
      working.each { |name| expect(worker.wait_wake(name, tag)["q"]).to eq(name) }
      # Each NOTIFY woke exactly its own queue, once.
      working.each { |name| expect(worker.wakes(name).count { |e| e["p"] == tag }).to eq(1), name.inspect }
      expect(other.wakes("bystander", from: mark)).to be_empty
      stats = hub.stats
      expect(stats[:reconnects]).to eq(0) # no name ever ran as SQL
      expect(stats[:channels]).to eq(working.size + 1)
      expect(Rel.census).to eq(1)
      [worker, other].each(&:stop)
      hub.stop
    end
  end

  it "refuses names that cannot work with one outcome: nil, each name logged once at ERROR, hub client or Listener" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      out = StringIO.new
      logger = Logger.new(out)
      client = Pgbus::Hub::HubClient.new(socket_path: hub.socket_path, dispatch_queue: Queue.new, logger: logger).connect
      local = Pgbus::Hub::Listener.new(connection: Rel.url, dispatch_queue: Queue.new, logger: logger).start
      names = refused.to_a + twins.map { |t| [t, /bytes; PostgreSQL truncates/] }
      2.times do
        names.each do |name, _|
          expect(client.ensure_listening(name)).to be_nil, name.inspect
          expect(local.ensure_listening(name)).to be_nil, name.inspect
        end
      end
      wait_for("each refusal logged") { out.string.lines.grep(/ERROR/).size >= names.size * 2 }
      errors = out.string.lines.grep(/ERROR/)
      expect(errors.size).to eq(names.size * 2) # once per name and listener, not per call
      names.each { |_, message| expect(errors.grep(message).size).to be >= 2 }
      expect(client).not_to be_dead # a refused name does not cost the worker its hub
      expect(client.ensure_listening("still_fine")).to eq(:done)
      stats = hub.stats
      expect(stats).to include(channels: 1, reconnects: 0, listener_healthy: true)
      client.stop
      local.stop
      hub.stop
    end
  end

  it "a FailoverListener worker logs and returns nil for a refused name, and keeps serving" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      worker = RelWorker.new(hub.socket_path)
      expect(worker.sub(twins[0])["result"]).to eq("nil")
      expect(worker.sub("")["result"]).to eq("nil")
      expect(worker.failed_over?).to be(false)
      worker.sub("after_refusal")
      assert_acked_subs_get_wakes({ worker => %w[after_refusal] })
      worker.stop
      hub.stop
    end
  end
end
