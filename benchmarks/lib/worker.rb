# frozen_string_literal: true

# A benchmark worker: a forked process that listens in one of four modes and
# answers line commands from the coordinator (benchmarks/run.rb) on a pipe.
#
#   direct           benchmarks/baselines/direct.rb (ruby-pg, one connection per worker)
#   ruby-hub         RubyHubBaseline::Client (plain Ruby) to the plain-Ruby hub
#   native-hub       Pgbus::Hub::HubClient to the native MasterHub
#   native-listener  Pgbus::Hub::Listener (native, one connection per worker)
#   native-hub+ruby-client  diagnostic: the plain-Ruby client against the native MasterHub
#
# Wake latency is taken where the issue asks: the moment the WakeMessage is
# pushed into the worker's dispatch queue (StampQueue#<<), against the
# CLOCK_MONOTONIC timestamp the sender put in the payload ("T<ns>:<seq>:...").
# A consumer thread then pops it, as pgbus's dispatcher would.
module BenchWorker
  module_function

  def now_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  def cpu_ms = Process.clock_gettime(Process::CLOCK_PROCESS_CPUTIME_ID, :float_millisecond)

  # Voluntary + involuntary context switches of every live thread of this process.
  def ctx_switches
    Dir.glob("/proc/self/task/*/status").sum do |f|
      File.read(f).scan(/^(?:non)?voluntary_ctxt_switches:\s+(\d+)/).sum { |(n)| n.to_i }
    rescue Errno::ENOENT
      0
    end
  end

  # Records arrivals; thread-safe under a mutex shared with the control loop.
  class Recorder
    attr_reader :lock

    def initialize
      @lock = Mutex.new
      @cond = ConditionVariable.new
      @want = nil
      reset(nil)
    end

    # Blocks until `want` arrivals of `kind`, the deadline, or `idle` ns without one.
    def await(want, kind, deadline, idle)
      @lock.synchronize do
        @want = [want, kind]
        loop do
          got = kind == "t" ? @lats.size : @count
          now = BenchWorker.now_ns
          break if got >= want || now > deadline || (@last && now - @last > idle)

          @cond.wait(@lock, 0.05)
        end
        @want = nil
      end
    end

    def reset(queue)
      @lock.synchronize do
        @queue = queue
        @count = 0
        @lats = []
        @first = @last = nil
        @cpu0 = BenchWorker.cpu_ms
        @times0 = Process.times
        @ctx0 = BenchWorker.ctx_switches
      end
    end

    def record(stamp, wake)
      @lock.synchronize do
        return unless @queue == "*" || wake.queue_name == @queue

        @count += 1
        @first ||= stamp
        @last = stamp
        payload = wake.payload
        if payload && payload.getbyte(0) == 84 # "T"
          sent = payload[1, payload.index(":") - 1].to_i
          @lats << (stamp - sent) / 1000.0
        end
        @cond.signal if @want && (@want[1] == "t" ? @lats.size : @count) >= @want[0]
      end
    end

    def snapshot
      @lock.synchronize do
        t = Process.times
        { n: @count, lat_us: @lats, first_ns: @first, last_ns: @last, cpu_ms: BenchWorker.cpu_ms - @cpu0,
          user_ms: (t.utime - @times0.utime) * 1000, sys_ms: (t.stime - @times0.stime) * 1000,
          ctx_switches: BenchWorker.ctx_switches - @ctx0 }
      end
    end

  end

  # The dispatch queue handed to every listener: stamps on <<, then a consumer
  # thread drains it.
  class StampQueue
    def initialize(recorder)
      @queue = Queue.new
      @consumer = Thread.new do
        while (item = @queue.pop)
          recorder.record(item[0], item[1])
        end
      end
    end

    def <<(wake)
      @queue << [BenchWorker.now_ns, wake]
      self
    end
    alias push <<

    def size = @queue.size
  end

  def build(mode, url, socket, queue)
    case mode
    when "direct"
      DirectBaseline::Listener.new(url: url, dispatch_queue: queue, wake_class: Pgbus::Hub::WakeMessage).start
    when "ruby-hub", "native-hub+ruby-client"
      RubyHubBaseline::Client.new(socket_path: socket, dispatch_queue: queue).connect
    when "native-hub"
      Pgbus::Hub::HubClient.new(socket_path: socket, dispatch_queue: queue).connect
    when "native-listener"
      Pgbus::Hub::Listener.new(connection: url, dispatch_queue: queue).start
    else raise ArgumentError, mode
    end
  end

  # ms the sub took to be acked; nil (counted in @unconfirmed) when
  # ensure_listening answered nil, i.e. the LISTEN was not confirmed in time:
  # the run reports how many instead of stopping at the first.
  def timed_sub(listener, queue)
    t0 = now_ns
    result = listener.ensure_listening(queue)
    ms = (now_ns - t0) / 1e6
    return ms if result == :done
    raise "ensure_listening(#{queue}) returned #{result.inspect}" unless result.nil?

    @unconfirmed += 1
    # What the listener knew when it gave up: the clue to why, in the bench's log.
    stats = listener.respond_to?(:stats) ? listener.stats : {}
    warn "[bench worker #{Process.pid}] ensure_listening(#{queue}) answered nil after #{ms.round(1)} ms; stats #{stats.inspect}"
    nil
  end

  # Subscribes every queue: through the listener's batch call where it has
  # one (the direct baseline: one wake-up of its thread, not one per queue).
  def subscribe_all(listener, queues)
    if listener.respond_to?(:ensure_listening_all)
      @unconfirmed += listener.ensure_listening_all(queues).count(nil)
    else
      queues.each { |q| timed_sub(listener, q) }
    end
  end

  # `rate` new-channel subs (each then unsubscribed) per second for `seconds`,
  # started at a random phase: the ack time of each.
  def churn(listener, rate, seconds)
    interval_ns = 1e9 / rate
    t_end = now_ns + (seconds * 1e9)
    next_at = now_ns + (rand * interval_ns)
    samples = []
    while now_ns < t_end
      pause = (next_at - now_ns) / 1e9
      sleep(pause) if pause.positive?
      next_at += interval_ns
      q = "churn_#{Process.pid}_#{samples.size}"
      samples << timed_sub(listener, q)
      listener.remove_listening(q)
    end
    samples
  end

  # Entry point in the forked child. Never returns (exit!).
  def run(mode:, url:, socket:, queues:, ctl:, out:)
    srand(Process.pid)
    out.sync = true
    @unconfirmed = 0
    recorder = Recorder.new
    listener = build(mode, url, socket, StampQueue.new(recorder))
    subscribe_all(listener, queues)
    out.puts "ready #{@unconfirmed}"
    while (line = ctl.gets)
      cmd, *args = line.split
      case cmd
      when "mark" # mark QUEUE|*  (* counts every queue's wakes)
        recorder.reset(args[0])
        out.puts "ok"
      when "subn" # subn PREFIX COUNT: subscribes PREFIX0 .. PREFIX<COUNT-1>
        t0 = now_ns
        subscribe_all(listener, Array.new(Integer(args[1])) { |i| "#{args[0]}#{i}" })
        out.puts JSON.generate(seconds: (now_ns - t0) / 1e9)
      when "churn" # churn RATE SECONDS
        out.puts JSON.generate(churn(listener, Float(args[0]), Float(args[1])))
      when "unconfirmed"
        out.puts @unconfirmed.to_s
      when "wait" # wait N TIMEOUT_S IDLE_S KIND(t|all)
        recorder.await(Integer(args[0]), args[3], now_ns + (Float(args[1]) * 1e9), Float(args[2]) * 1e9)
        out.puts JSON.generate(recorder.snapshot)
      when "acknew", "ackact" # acknew N | ackact QUEUE N
        n = Integer(args[-1])
        samples = Array.new(n) do |i|
          sleep(rand * 0.25) # de-phase from the hub's health-check cycle
          q = cmd == "acknew" ? "acknew_#{Process.pid}_#{i}" : args[0]
          ms = timed_sub(listener, q)
          listener.remove_listening(q) if listener.respond_to?(:remove_listening)
          ms
        end
        out.puts JSON.generate(samples)
      when "quit" then break
      end
    end
    exit!(0)
  rescue StandardError => e
    out.puts "error #{e.class}: #{e.message}"
    exit!(1)
  end
end
