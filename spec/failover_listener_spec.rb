# frozen_string_literal: true

require "tmpdir"
require "logger"
require "stringio"
require_relative "support/database"
require_relative "support/hub_process"

RSpec.describe Pgbus::Hub::FailoverListener do
  # A local listener with pgbus's Listener surface, recording calls (the
  # contract's unit behaviours); the end-to-end case below uses the real one.
  class RecordingListener
    attr_reader :calls

    def initialize
      @calls = []
    end

    def ensure_listening(queue)
      @calls << [:ensure, queue]
      :done
    end

    def remove_listening(queue)
      @calls << [:remove, queue]
    end

    def stop
      @calls << [:stop]
    end
  end

  class DeadHub
    attr_reader :calls

    def initialize(dead: false)
      @dead = dead
      @calls = []
    end

    def kill!
      @dead = true
    end

    def ensure_listening(queue)
      @calls << [:ensure, queue]
      raise Pgbus::Hub::HubUnavailableError, "dead" if @dead

      :done
    end

    def remove_listening(queue)
      @calls << [:remove, queue]
    end

    def stop
      @calls << [:stop]
    end
  end

  it "delegates to the hub until it fails, then replays only still-recorded subs on ONE local listener" do
    hub = DeadHub.new
    built = []
    failover = described_class.new(hub_client: hub, local_listener_factory: -> { RecordingListener.new.tap { |l| built << l } })
    expect(failover.ensure_listening("a")).to eq(:done)
    expect(failover.ensure_listening("b")).to eq(:done)
    failover.remove_listening("b")
    expect(hub.calls).to eq([[:ensure, "a"], [:ensure, "b"], [:remove, "b"]])
    failover.fail_over!
    failover.fail_over!
    expect(built.size).to eq(1)
    expect(built.first.calls).to eq([[:ensure, "a"]])
    expect(failover.ensure_listening("c")).to eq(:done)
    expect(built.first.calls.last).to eq([:ensure, "c"])
    failover.stop
    expect(built.first.calls.last).to eq([:stop])
  end

  it "reports the threads of the hub client and, once failed over, of the local listener; stop stops both" do
    threaded = Struct.new(:threads, :stopped) do
      def stop
        self.stopped = true
        threads.clear
      end

      def ensure_listening(_queue) = :done
    end
    hub_thread = Thread.new { sleep }
    local_thread = Thread.new { sleep }
    hub = threaded.new([hub_thread])
    local = threaded.new([local_thread])
    failover = described_class.new(hub_client: hub, local_listener_factory: -> { local })
    expect(failover.threads).to eq([hub_thread])
    failover.fail_over!
    expect(failover.threads).to contain_exactly(hub_thread, local_thread)
    failover.stop
    expect([hub.stopped, local.stopped]).to eq([true, true])
    expect(failover.threads).to eq([])
  ensure
    [hub_thread, local_thread].each { |t| t&.kill&.join }
  end

  it "completes a sub locally when the hub fails synchronously" do
    hub = DeadHub.new(dead: true)
    local = RecordingListener.new
    failover = described_class.new(hub_client: hub, local_listener_factory: -> { local })
    expect(failover.ensure_listening("x")).to eq(:done)
    expect(local.calls).to eq([[:ensure, "x"], [:ensure, "x"]]) # replay + the retried call
  end

  it "stays degraded (nil, logged) when the local listener cannot be built; never raises" do
    out = StringIO.new
    failover = described_class.new(hub_client: DeadHub.new(dead: true),
                                   local_listener_factory: -> { raise PG::ConnectionBad, "down" },
                                   logger: Logger.new(out))
    expect(failover.ensure_listening("x")).to be_nil
    expect(failover.ensure_listening("y")).to be_nil
    expect(out.string).to include("fallback listener failed to build (PG::ConnectionBad: down)")
  end

  it "loses no sub recorded concurrently with the swap" do
    hub = DeadHub.new
    local = RecordingListener.new
    slow_factory = lambda do
      sleep 0.05
      local
    end
    failover = described_class.new(hub_client: hub, local_listener_factory: slow_factory)
    hub.kill!
    threads = Array.new(8) { |i| Thread.new { failover.ensure_listening("q#{i}") } }
    expect(threads.map(&:value)).to all(eq(:done))
    expect(local.calls.map(&:last).uniq.sort).to eq(Array.new(8) { |i| "q#{i}" }.sort)
  end
end
