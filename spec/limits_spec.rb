# frozen_string_literal: true

require "tmpdir"
require "json"
require "open3"
require "rbconfig"
require_relative "support/database"

# The hub's limits (docs/configuration.md, "Limits"): a hub started with every configurable one
# away from its default reports those values (stats, Pgbus::Hub.stats, `pgbus-hub status`) and
# applies them, so an option parsed but never applied fails here.
RSpec.describe "the hub's limits" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  # status_interval: long enough that no periodic status frame joins the stuck worker's queue below.
  let(:configured) do
    { durable_queue_limit: 3, hard_queue_limit: 8, max_channels_per_connection: 2, max_channels: 3, status_interval: 600.0 }
  end

  def status(socket, *args)
    env = { "RUBYLIB" => File.join(ROOT, "lib"), Pgbus::Hub::DEFAULT_SOCKET_ENV => nil }
    out, st = Open3.capture2e(env, RbConfig.ruby, File.join(ROOT, "exe", "pgbus-hub"), "status", "--socket", socket, *args)
    [out, st.exitstatus]
  end

  it "reports the limits it was started with, and applies them: nacks at the channel caps, drops, then an eviction" do
    expect(configured.select { |key, value| Pgbus::Hub::DEFAULTS[key] == value }).to eq({})
    Dir.mktmpdir("pgbus-hub-limits") do |dir|
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "hub.sock"),
                                      **configured).start
      limits = hub.stats[:limits]
      expect(limits).to include(configured.transform_keys(&:to_s))
      expect(limits).to include("max_frame_bytes" => Pgbus::Hub::Protocol::MAX_FRAME_BYTES)
      expect(Pgbus::Hub.stats(socket_path: hub.socket_path)[:limits]).to eq(limits)
      wait_for("listener healthy") { hub.stats[:listener_healthy] }
      out, code = status(hub.socket_path, "--json")
      expect(code).to eq(0), out
      expect(JSON.parse(out).dig("hub", "limits")).to eq(limits)
      out, = status(hub.socket_path)
      expect(out).to include("limits: durable_queue_limit 3, hard_queue_limit 8, ")
      expect(out).to include("max_channels_per_connection 2, max_channels 3")

      # The channel caps: a connection's third channel, the host's fourth.
      reader = WirePeer.new(hub.socket_path)
      %w[lim_a lim_b].each { |queue| reader.subscribe(queue) }
      reader.send_frame("t" => "sub", "q" => "lim_c")
      expect(reader.next_non_status).to include("t" => "nack", "reason" => /max_channels_per_connection 2\)/)
      other = WirePeer.new(hub.socket_path)
      other.subscribe("lim_c")
      other.send_frame("t" => "sub", "q" => "lim_d")
      expect(other.next_non_status).to include("t" => "nack", "reason" => /max_channels 3\)/)
      other.close

      # A worker that never reads: once its socket buffer is full, its outbox fills. Durable wakes
      # first: the 4th queued is dropped (durable_queue_limit 3), long before hard_queue_limit 8.
      stuck = WirePeer.new(hub.socket_path)
      stuck.subscribe("lim_a")
      conn = TestDatabase.connect
      notify = ->(payload) { conn.exec("select pg_notify('pgmq.q_lim_a.INSERT', '#{payload}')") }
      sent = 0
      while hub.stats[:dropped_durable_wakes].zero? && hub.stats[:evicted_workers].zero? && sent < 20_000
        notify.call("")
        sent += 1
        expect(reader.next_non_status).to eq("t" => "wake", "q" => "lim_a", "p" => nil) # the hub took it in
      end
      expect(hub.stats).to include(dropped_durable_wakes: 1, evicted_workers: 0)
      # Its outbox holds 3 frames: the 6th ephemeral wake (never dropped) is the 9th, past hard_queue_limit 8.
      ephemeral = 0
      while hub.stats[:evicted_workers].zero? && ephemeral < 100
        ephemeral += 1
        notify.call("e#{ephemeral}")
        expect(reader.next_non_status).to include("p" => "e#{ephemeral}")
      end
      expect([ephemeral, hub.stats[:evicted_workers]]).to eq([6, 1])
      nil while stuck.next_frame(timeout: 5) # what its socket held, then EOF
      wait_for("the evicted worker gone") { hub.stats[:workers] == 1 }
    ensure
      conn&.close
      [reader, other, stuck].compact.each(&:close)
      hub&.stop
    end
  end
end
