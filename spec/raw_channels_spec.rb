# frozen_string_literal: true

require "timeout"
require_relative "support/database"

# Raw channels (what the ActionCable adapter LISTENs on): Pgbus::Hub.channel_key
# names a channel LISTENed verbatim, through the hub or a worker's own Listener.
RSpec.describe "raw channels" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  let(:channel) { "cable_spec:#{Process.pid}:#{rand(1_000_000)}" }
  let(:key) { Pgbus::Hub.channel_key(channel) }

  def next_wake(queue)
    Timeout.timeout(5) { queue.pop }
  end

  def notify_raw(payload)
    TestDatabase.with { |conn| conn.exec_params("select pg_notify($1, $2)", [channel, payload]) }
  end

  it "delivers verbatim payloads (empty stays empty, large ones read from their table) through the hub" do
    Dir.mktmpdir("pgbus-hub-raw") do |dir|
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "hub.sock")).start
      wakes = Queue.new
      client = Pgbus::Hub::HubClient.new(socket_path: hub.socket_path, dispatch_queue: wakes).connect
      expect(client.ensure_listening(key)).to eq(:done)
      notify_raw("<p>hi</p>")
      notify_raw("")
      large = "y" * 100_000
      id = TestDatabase.with do |conn|
        conn.exec("set client_min_messages to warning") # CREATE ... IF NOT EXISTS notices
        conn.exec(Pgbus::Hub::LARGE_PAYLOAD_DDL)
        conn.exec_params(Pgbus::Hub::LARGE_PAYLOAD_INSERT, [large]).getvalue(0, 0)
      end
      notify_raw("#{Pgbus::Hub::LARGE_PAYLOAD_MARK}#{id}")
      expect([next_wake(wakes), next_wake(wakes), next_wake(wakes)].map { |w| [w.queue_name, w.payload] })
        .to eq([[key, "<p>hi</p>"], [key, ""], [key, large]])
      client.stop
      hub.stop
    end
  end

  it "LISTENs verbatim on a worker's own Listener too" do
    wakes = Queue.new
    listener = Pgbus::Hub::Listener.new(connection: TestDatabase.url, dispatch_queue: wakes).start
    expect(listener.ensure_listening(key)).to eq(:done)
    notify_raw("direct")
    wake = next_wake(wakes)
    expect([wake.queue_name, wake.payload]).to eq([key, "direct"])
    listener.stop
  end
end
