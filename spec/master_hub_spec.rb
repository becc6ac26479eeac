# frozen_string_literal: true

require "socket"
require "tmpdir"
require "logger"
require "stringio"
require_relative "support/database"

RSpec.describe Pgbus::Hub::MasterHub do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    Dir.mktmpdir("pgbus-hub-spec") do |dir|
      @dir = dir
      example.run
    ensure
      @hubs&.each(&:stop)
    end
  end

  def start_hub(**options)
    hub = described_class.new(connection: TestDatabase.url, socket_path: File.join(@dir, "hub.sock"),
                              health_check_ms: 100, status_interval: 0.2, **options).start
    (@hubs ||= []) << hub
    hub
  end

  it "rejects unknown and missing options, naming the valid ones" do
    expect { described_class.new(socket_path: "x") }.to raise_error(ArgumentError, /missing.*:connection/)
    expect { described_class.new(connection: "x", socket_path: "y", bogus: 1) }
      .to raise_error(ArgumentError, /unknown option\(s\) :bogus \(valid: :connection, :socket_path/)
    expect { described_class.new(connection: "x", socket_path: "y", hard_queue_limit: 0) }
      .to raise_error(ArgumentError, /hard_queue_limit must be a positive Integer/)
    expect { described_class.new(connection: 42, socket_path: File.join(@dir, "t.sock")).start }
      .to raise_error(TypeError, /connection: must be a String/)
  end

  it "raises Pgbus::Hub::Error with the reason when it cannot bind" do
    path = File.join(@dir, "file")
    File.write(path, "x")
    hub = described_class.new(connection: TestDatabase.url, socket_path: path)
    expect { hub.start }.to raise_error(Pgbus::Hub::Error, /not a socket/)
    long = described_class.new(connection: TestDatabase.url, socket_path: File.join(@dir, "x" * 120))
    expect { long.start }.to raise_error(Pgbus::Hub::Error, /bytes/)
  end

  it "acks a sub after LISTEN, delivers durable and ephemeral wakes, and reports stats" do
    hub = start_hub
    expect(hub).to be_running
    expect(File.stat(hub.socket_path).mode & 0o777).to eq(0o600)
    peer = WirePeer.new(hub.socket_path)
    expect(peer.next_frame).to include("t" => "status")
    peer.subscribe("pgbus_chat")
    TestDatabase.notify("pgbus_chat")
    expect(peer.next_non_status).to eq({ "t" => "wake", "q" => "pgbus_chat", "p" => nil })
    TestDatabase.notify("pgbus_chat", "<turbo-stream>hi</turbo-stream>")
    expect(peer.next_non_status).to eq({ "t" => "wake", "q" => "pgbus_chat", "p" => "<turbo-stream>hi</turbo-stream>" })
    stats = hub.stats
    expect(stats).to include(workers: 1, channels: 1, listener_healthy: true, threads: 1)
    expect(stats.keys).to include(:reconnects, :wakes_received, :frames_sent, :dropped_durable_wakes,
                                  :evicted_workers, :rejected_peers)
    peer.close
  end

  it "keeps ONE pgbus-listen connection for 16 clients and releases refs on disconnect" do
    before = TestDatabase.census
    hub = start_hub
    peers = Array.new(16) { WirePeer.new(hub.socket_path) }
    peers.each_with_index { |peer, i| peer.subscribe("q_shared"); peer.subscribe("q_own_#{i}") }
    expect(TestDatabase.census - before).to eq(1)
    TestDatabase.notify("q_shared", "all")
    peers.each { |peer| expect(peer.next_non_status).to include("q" => "q_shared", "p" => "all") }
    peers.each(&:close)
    wait_for("refs released") { hub.stats[:workers].zero? && hub.stats[:channels].zero? }
  end

  it "stop closes clients, unlinks the socket, closes PostgreSQL, and is idempotent" do
    before = TestDatabase.census
    hub = start_hub
    peer = WirePeer.new(hub.socket_path)
    peer.subscribe("bye")
    wait_for("listen connection") { TestDatabase.census == before + 1 }
    expect(hub.stop).to equal(hub)
    expect(hub.stop).to equal(hub)
    expect(hub).not_to be_running
    expect(File.exist?(hub.socket_path)).to be(false)
    expect(peer.next_non_status).to be_nil
    wait_for("listen connection closed") { TestDatabase.census == before }
  end

  it "is inert in a forked child: stop there leaves the parent's hub serving" do
    hub = start_hub
    peer = WirePeer.new(hub.socket_path)
    peer.subscribe("forked")
    pid = fork do
      ok = !hub.running?
      hub.stop
      exit!(ok ? 0 : 1)
    end
    Process.wait(pid)
    expect($?.exitstatus).to eq(0)
    expect(hub).to be_running
    TestDatabase.notify("forked", "still here")
    expect(peer.next_non_status).to include("p" => "still here")
  end

  it "forwards native log lines to the Ruby logger from a Ruby thread" do
    out = StringIO.new
    hub = start_hub(logger: Logger.new(out))
    peer = WirePeer.new(hub.socket_path)
    peer.send_frame({ "t" => "bogus" })
    wait_for("log line") { out.string.include?("unknown frame") }
    hub.stop
    expect(out.string).to include("master hub listening at #{hub.socket_path}")
    expect(out.string).to include("stopped")
  end
end
