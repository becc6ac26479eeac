# frozen_string_literal: true

require "tmpdir"
require "logger"
require "stringio"
require_relative "support/database"
require_relative "support/hub_process"
require_relative "support/ruby_hub_peer"

RSpec.describe Pgbus::Hub::HubClient do
  around do |example|
    Dir.mktmpdir("pgbus-hub-client") do |dir|
      @dir = dir
      example.run
    ensure
      @cleanup&.reverse_each(&:call)
    end
  end

  def later(&block)
    (@cleanup ||= []) << block
  end

  def pop(queue, timeout: 5)
    Timeout.timeout(timeout) { queue.pop }
  end

  def client(socket_path, **options)
    c = described_class.new(socket_path: socket_path, dispatch_queue: options.delete(:queue) || Queue.new, **options)
    later { c.stop }
    c
  end

  it "is reachable where pgbus expects its error class" do
    expect(described_class::HubUnavailableError).to equal(Pgbus::Hub::HubUnavailableError)
    expect(Pgbus::Hub::HubUnavailableError.ancestors).to include(Pgbus::Hub::Error, StandardError)
  end

  it "raises HubUnavailableError when no hub is there" do
    path = File.join(@dir, "missing.sock")
    expect { client(path).connect }
      .to raise_error(Pgbus::Hub::HubUnavailableError, /\Acannot reach master hub at #{Regexp.escape(path)}: /)
    expect { client(File.join(@dir, "x" * 120)).connect }.to raise_error(Pgbus::Hub::HubUnavailableError, /cannot reach/)
  end

  context "against a pure-Ruby hub loop (wire compatibility)" do
    it "subscribes, receives wakes as WakeMessages, writes exact unsub frames" do
      stub = RubyHubStub.new(File.join(@dir, "ruby.sock"))
      later { stub.close }
      queue = Queue.new
      c = client(File.join(@dir, "ruby.sock"), queue: queue).connect
      expect(c.ensure_listening("pgbus_chat")).to eq(:done)
      expect(pop(stub.received)).to eq({ "t" => "sub", "q" => "pgbus_chat" })
      stub.wake("pgbus_chat")
      stub.wake("pgbus_chat", "<p>é</p>")
      expect(pop(queue)).to have_attributes(queue_name: "pgbus_chat", payload: nil)
      expect(pop(queue)).to have_attributes(queue_name: "pgbus_chat", payload: "<p>é</p>")
      expect(c.remove_listening("pgbus_chat")).to be_nil
      expect(pop(stub.received)).to eq({ "t" => "unsub", "q" => "pgbus_chat" })
      expect(c).to be_hub_healthy
      expect(c).not_to be_dead
    end

    it "times out without an ack: raises, marks dead, fires on_failure once" do
      stub = RubyHubStub.new(File.join(@dir, "mute.sock"), ack: false)
      later { stub.close }
      failures = Queue.new
      c = client(File.join(@dir, "mute.sock"), ack_timeout: 0.3, on_failure: -> { failures << :failed }).connect
      expect { c.ensure_listening("q") }.to raise_error(Pgbus::Hub::HubUnavailableError, /ack/i)
      expect(c).to be_dead
      expect(c).not_to be_hub_healthy
      expect { c.ensure_listening("q2") }.to raise_error(Pgbus::Hub::HubUnavailableError)
      expect(pop(failures)).to eq(:failed)
      sleep 0.2
      expect(failures.size).to eq(0)
      expect(c.remove_listening("q")).to be_nil
    end
  end

  it "stop releases a blocked ensure_listening at once, without on_failure" do
    stub = RubyHubStub.new(File.join(@dir, "slow.sock"), ack: false)
    later { stub.close }
    called = false
    c = client(File.join(@dir, "slow.sock"), ack_timeout: 30, on_failure: -> { called = true }).connect
    waiter = Thread.new { c.ensure_listening("never") }
    waiter.report_on_exception = false # its HubUnavailableError is the expected outcome, read below
    sleep 0.1
    started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    c.stop
    expect { waiter.value }.to raise_error(Pgbus::Hub::HubUnavailableError, /stopped/)
    expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 3
    expect(called).to be(false)
  end

  it "can be stopped from its own on_failure (on its pump thread): stopped, nothing raised, no thread left" do
    stub = RubyHubStub.new(File.join(@dir, "closing.sock"), ack: false)
    later { stub.close }
    outcome = Queue.new
    c = nil
    c = client(File.join(@dir, "closing.sock"), ack_timeout: 0.3, on_failure: lambda {
      outcome << begin
        c.stop
        :stopped
      rescue Exception => e # rubocop:disable Lint/RescueException -- ThreadError is what this guards against
        e
      end
    }).connect
    expect { c.ensure_listening("q") }.to raise_error(Pgbus::Hub::HubUnavailableError, /ack/i)
    expect(pop(outcome)).to eq(:stopped)
    wait_for(nil, timeout: 5) { c.threads.empty? }
    expect(c.threads).to eq([])
  end

  it "its pump thread can be killed while blocked in native code" do
    stub = RubyHubStub.new(File.join(@dir, "kill.sock"))
    later { stub.close }
    c = client(File.join(@dir, "kill.sock")).connect
    pump = c.instance_variable_get(:@pump)
    sleep 0.05
    pump.kill
    expect(pump.join(2)).to equal(pump)
  end

  context "against our MasterHub in another process" do
    before { skip "no PostgreSQL" unless TestDatabase.available? }

    let(:socket_path) { File.join(@dir, "hub.sock") }
    let!(:hub) { HubProcess.new(socket_path).tap { |h| later { h.stop } } }

    # pgbus bounds its dispatch queue (streams_dispatch_queue_limit): while the app
    # does not drain it, the pump thread blocks in `<<`. Each sub then reads the
    # hub's answer itself, past ack_timeout, and no wake is lost.
    it "acks new subs while a full dispatch queue blocks the pump for longer than ack_timeout, and loses no wake" do
      queue = SizedQueue.new(1)
      failed = false
      c = client(socket_path, queue: queue, ack_timeout: 1.0, on_failure: -> { failed = true }).connect
      expect(c.ensure_listening("stall")).to eq(:done)
      3.times { |i| TestDatabase.notify("stall", "s#{i}") }
      # The first wake fills the queue; the pump blocks pushing the second.
      wait_for("the pump blocked on the full queue") { queue.size == 1 && queue.num_waiting == 1 }
      stalled_at = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      results = Array.new(10) do |i|
        sleep 0.2
        c.ensure_listening("stall_new_#{i}")
      end
      expect(results).to all(eq(:done))
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - stalled_at).to be > 1.0 # longer than ack_timeout
      expect(queue.num_waiting).to eq(1) # still blocked: nobody popped
      expect(failed).to be(false)
      expect(c).not_to be_dead
      TestDatabase.notify("stall_new_9", "after")
      expect(Array.new(4) { pop(queue) }.map { |w| [w.queue_name, w.payload] })
        .to eq([%w[stall s0], %w[stall s1], %w[stall s2], %w[stall_new_9 after]])
    end

    it "delivers durable and ephemeral wakes in order" do
      queue = Queue.new
      c = client(socket_path, queue: queue).connect
      expect(c.ensure_listening("orders")).to eq(:done)
      TestDatabase.notify("orders")
      5.times { |i| TestDatabase.notify("orders", "m#{i}") }
      durable = pop(queue)
      expect(durable).to be_a(Pgbus::Hub::WakeMessage)
      expect(durable.payload).to be_nil
      expect(Array.new(5) { pop(queue).payload }).to eq(%w[m0 m1 m2 m3 m4])
    rescue Timeout::Error
      raise "wake did not arrive"
    end

    # The pump thread reads the socket itself (no native reader thread), so
    # acks depend on it getting the GVL back between batches. Busy Ruby
    # threads plus a wake storm must still leave every ack well inside
    # ack_timeout, and lose no wake.
    it "acks every sub while busy Ruby threads hold the GVL and a wake storm flows" do
      queue = Queue.new
      failed = false
      c = client(socket_path, queue: queue, on_failure: -> { failed = true }).connect
      expect(c.ensure_listening("storm")).to eq(:done)
      stop_at = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 3
      busy = Array.new(2) do
        Thread.new { nil while Process.clock_gettime(Process::CLOCK_MONOTONIC) < stop_at }
      end
      storm = Thread.new do
        TestDatabase.with do |conn|
          5.times do
            conn.exec("select pg_notify('pgmq.q_storm.INSERT', 'x' || i) from generate_series(1, 400) i")
          end
        end
      end
      acks = Array.new(20) do |i|
        t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        expect(c.ensure_listening("busy_#{i}")).to eq(:done)
        Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
      end
      [storm, *busy].each(&:join)
      received = 0
      Timeout.timeout(10) { (received += 1 if queue.pop.queue_name == "storm") while received < 2000 }
      expect(failed).to be(false)
      expect(c).not_to be_dead
      # The figure for benchmarking notes, on request only (the normal run stays quiet).
      warn format("  [acks under GVL contention + storm: max %.1f ms over 20 subs]", acks.max * 1000) if ENV["PGBUS_HUB_FIGURES"]
    end

    it "reports its live threads (pump, log drain) for pgbus's leak check; [] after stop" do
      c = client(socket_path, logger: Logger.new(StringIO.new)).connect
      expect(c.threads.map(&:name)).to contain_exactly("pgbus-hub client pump", "pgbus-hub client log")
      expect(c.threads).to all(be_alive)
      c.stop
      expect(c.threads).to eq([])
    end

    it "fires on_failure once and releases a waiter when the hub is SIGKILLed" do
      failures = Queue.new
      c = client(socket_path, on_failure: -> { failures << Thread.current }).connect
      c.ensure_listening("k")
      hub.kill("KILL")
      expect(pop(failures)).not_to equal(Thread.main) # a Ruby thread, not the caller's
      expect(c).to be_dead
      expect { c.ensure_listening("k2") }.to raise_error(Pgbus::Hub::HubUnavailableError)
    end

    it "stop returns promptly with a pump blocked and is idempotent; no on_failure" do
      called = false
      c = client(socket_path, on_failure: -> { called = true }).connect
      c.ensure_listening("s")
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      expect(c.stop).to equal(c)
      expect(c.stop).to equal(c)
      expect(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).to be < 3
      expect(called).to be(false)
      expect(c).to be_dead
    end

    it "is inert in a forked child and a fresh client there works" do
      queue = Queue.new
      c = client(socket_path, queue: queue).connect
      c.ensure_listening("parent")
      rd, wr = IO.pipe
      pid = fork do
        rd.close
        ok = c.dead?
        begin
          c.ensure_listening("x")
          ok = false
        rescue Pgbus::Hub::HubUnavailableError
          nil
        end
        c.stop
        fresh = described_class.new(socket_path: socket_path, dispatch_queue: Queue.new).connect
        ok &&= fresh.ensure_listening("child") == :done
        fresh.stop
        wr.write(ok ? "ok" : "bad")
        exit!(0)
      end
      wr.close
      Process.wait(pid)
      expect(rd.read).to eq("ok")
      TestDatabase.notify("parent", "still")
      expect(pop(queue).payload).to eq("still")
    end

    it "leaks no fds or threads over 1000 connect/stop cycles" do
      fds = -> { Dir.children("/proc/self/fd").size }
      threads = -> { File.read("/proc/self/status")[/^Threads:\s+(\d+)/, 1].to_i }
      warm = client(socket_path).connect
      warm.stop
      before = { fds: fds.call, threads: threads.call, ruby_threads: Thread.list.size }
      1000.times { described_class.new(socket_path: socket_path, dispatch_queue: Queue.new).connect.stop }
      # Ruby keeps an exited thread's native thread cached for reuse for a few
      # seconds (3 s in 3.3), so OS threads may need that long to settle.
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
      sleep 0.1 until threads.call <= before[:threads] || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
      after = { fds: fds.call, threads: threads.call, ruby_threads: Thread.list.size }
      expect(after.to_a).to all(satisfy { |key, count| count <= before[key] })
    end
  end
end
