# frozen_string_literal: true

# Shared machinery of the reliability suite (issue 8): a hub in its own
# process (the "master", measured through /proc), forked worker processes
# running the real HubClient + FailoverListener + Listener, a throwaway private
# PostgreSQL cluster, and the invariant checks every scenario ends with.
require "json"
require "socket"
require "tmpdir"
require "fileutils"
require "rbconfig"
require "timeout"
require_relative "../../support/database"
require_relative "../../support/private_cluster"

module Rel
  module_function

  LIB = File.expand_path("../../../lib", __dir__)
  RUNNER = File.expand_path("hub_runner.rb", __dir__)
  # Ruby 4.1 (ruby-head) lets each of its 12 object heaps grow to 2.5 MB of slots before it
  # collects (4.0: 10,000 slots each). The hub process makes garbage slowly (stats Hashes, log
  # lines), so its RSS climbs for minutes (+4 MB in 140 s) before it levels off: Ruby's heap
  # sizing, not a leak, and near the soak's slack (docs/compatibility.md, "ruby-head's RSS"). With
  # 400 KB a heap its RSS settles in seconds and the growth checks see what the gem leaks. Rubies
  # before 4.1 ignore the variable; 2621440 gives ruby-head its own sizing back.
  HUB_ENV = { "RUBY_GC_HEAP_INIT_BYTES" => ENV.fetch("RUBY_GC_HEAP_INIT_BYTES", "409600") }.freeze
  # A database of its own on the shared server, so the census counts only our
  # hubs' backends (other engineers' hubs use pgbus_hub_test concurrently).
  DB = ENV.fetch("PGBUS_HUB_RELIABILITY_DB", "pgbus_hub_reliability")

  # Slow scenarios run only under `--tag reliability` or PGBUS_HUB_RELIABILITY=1.
  def slow_requested?
    RSpec.configuration.inclusion_filter.rules.key?(:reliability) || ENV["PGBUS_HUB_RELIABILITY"] == "1"
  end

  def now
    Process.clock_gettime(Process::CLOCK_MONOTONIC)
  end

  # The hub and worker processes the running scenario started (with_tmpdir kills them).
  def started = (@started ||= [])

  # SIGSTOP is delivered asynchronously: returns once the process is stopped.
  def sigstop(pid)
    Process.kill("STOP", pid)
    wait_for("process #{pid} stopped", interval: 0.001) { File.read("/proc/#{pid}/stat")[/\) (\w)/, 1] == "T" }
  end

  def url
    @url ||= TestDatabase.keywords(dbname: DB)
  end

  def ensure_database!
    return if @db_ready

    TestDatabase.with do |conn|
      exists = conn.exec_params("select 1 from pg_database where datname = $1", [DB]).ntuples == 1
      conn.exec("create database #{conn.quote_ident(DB)}") unless exists
    end
    @db_ready = true
  rescue TestDatabase.error_class => e # created meanwhile by a parallel run
    raise unless e.message.include?("already exists")

    @db_ready = true
  end

  def sql
    @sql = nil if @sql&.finished? || @sql_pid != Process.pid
    @sql_pid = Process.pid
    @sql ||= TestDatabase.connect(url)
  end

  def notify(queue, payload = "", conn: sql, prefix: "pgmq.q_", suffix: ".INSERT")
    conn.exec_params("select pg_notify($1, $2)", ["#{prefix}#{queue}#{suffix}", payload])
  end

  # pgbus-listen backends of OUR database (the census): a Census::Count, inspected with their owners.
  def census(conn: sql, db: DB)
    Census::Count.new(conn.exec_params("select pid, client_port, backend_start from pg_stat_activity " \
                                       "where application_name = 'pgbus-listen' and datname = $1 order by pid",
                                       [db]).to_a)
  end

  def queue_usage(conn: sql)
    conn.exec("select pg_notification_queue_usage()").getvalue(0, 0).to_f
  end

  def terminate_listen_backends(conn: sql, db: DB)
    conn.exec_params("select count(pg_terminate_backend(pid)) from pg_stat_activity " \
                     "where application_name = 'pgbus-listen' and datname = $1", [db]).getvalue(0, 0).to_i
  end

  # /proc figures of one process (the master hub's).
  def proc_sample(pid)
    status = File.read("/proc/#{pid}/status")
    { fds: Dir.children("/proc/#{pid}/fd").size,
      threads: status[/^Threads:\s+(\d+)/, 1].to_i,
      rss_kb: status[/^VmRSS:\s+(\d+)/, 1].to_i }
  end

  def percentile(samples, pct)
    sorted = samples.sort
    return nil if sorted.empty?

    sorted[[(sorted.size * pct / 100.0).ceil - 1, 0].max]
  end

  # The notes file figures are collected into (printed at the end of the run).
  def record(scenario, figures)
    (@figures ||= {})[scenario] = figures
    warn "[reliability] #{scenario}: #{JSON.generate(figures)}"
  end

  def figures
    @figures || {}
  end
end

# A MasterHub in its own process (spec/reliability/support/hub_runner.rb),
# driven over stdin/stdout: `stats`, `stop`. Its stderr (the hub's log) goes to a file.
class RelHub
  attr_reader :pid, :socket_path, :log_path

  def initialize(dir, url: Rel.url, name: "hub", **options)
    @socket_path = File.join(dir, "#{name}.sock")
    @log_path = File.join(dir, "#{name}.log")
    opts = { connection: url, socket_path: @socket_path, health_check_ms: 100, status_interval: 0.2 }.merge(options)
    @in_r, @in = IO.pipe
    @out, out_w = IO.pipe
    @pid = Process.spawn(Rel::HUB_ENV, RbConfig.ruby, "-I", Rel::LIB, Rel::RUNNER, JSON.generate(opts),
                         in: @in_r, out: out_w, err: @log_path)
    @in_r.close
    out_w.close
    Rel.started << self
    line = Timeout.timeout(20) { @out.gets }
    raise "hub process did not start: #{line.inspect} #{log}" unless line&.strip == "ready"
  end

  def stats
    @in.puts("stats")
    JSON.parse(Timeout.timeout(10) { @out.gets }, symbolize_names: true)
  end

  def proc_sample
    Rel.proc_sample(@pid)
  end

  def log
    File.exist?(@log_path) ? File.read(@log_path) : ""
  end

  def alive?
    !@pid.nil?
  end

  def kill(signal = "KILL")
    return unless @pid

    Process.kill(signal, @pid)
    Process.wait(@pid)
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  ensure
    @pid = nil
  end

  def stop
    return unless @pid

    @in.puts("stop")
    Timeout.timeout(10) { Process.wait(@pid) }
    @pid = nil
  rescue Errno::EPIPE, Timeout::Error, Errno::ECHILD
    kill
  ensure
    [@in, @out].each { |io| io.close unless io.closed? }
  end
end

# A forked worker process running the worker's stack for real: the native
# FailoverListener (hub client, then its own connection). Commands go down a pipe; events (JSON lines:
# ready, sub results, wakes with a CLOCK_MONOTONIC stamp, failure/fail-over)
# come back up another and are buffered by a reader thread.
class RelWorker
  attr_reader :pid, :events

  def initialize(socket_path, url: Rel.url, ack_timeout: 2.0, connect: true)
    cmd_r, @cmd = IO.pipe
    @rep, rep_w = IO.pipe
    @pid = fork do
      @cmd.close
      @rep.close
      RelWorker.child(socket_path, url, ack_timeout, connect, cmd_r, rep_w)
    end
    Rel.started << self
    cmd_r.close
    rep_w.close
    @events = []
    @lock = Mutex.new
    @cond = ConditionVariable.new
    @reader = Thread.new do
      while (line = @rep.gets)
        event = JSON.parse(line)
        @lock.synchronize do
          @events << event
          @cond.broadcast
        end
      end
    rescue IOError
      nil
    end
    wait_event("ready", timeout: 15) { |e| e["ev"] == "ready" || e["ev"] == "error" }
  end

  def self.child(socket_path, url, ack_timeout, connect, cmd_r, rep_w)
    lock = Mutex.new
    emit = ->(event) { lock.synchronize { rep_w.write("#{JSON.generate(event)}\n") } }
    queue = Queue.new
    # ack_timeout is the hub client's: pgbus's formula, health check + 2 s.
    options = { connection: url, dispatch_queue: queue, health_check_ms: [((ack_timeout - 2.0) * 1000).round, 100].max }
    impl = connect ? Pgbus::Hub::FailoverListener.new(socket_path: socket_path, **options) : Pgbus::Hub::Listener.new(**options)
    impl.start
    if connect # the fail-over, as soon as the listener reports it
      Thread.new do
        sleep 0.002 until impl.failed_over?
        emit.call({ "ev" => "failed_over", "t" => Rel.now, "ok" => true })
      end
    end
    Thread.new do
      loop do
        wake = queue.pop
        payload = wake.payload
        payload = payload.b.unpack1("H*") if payload && !payload.valid_encoding?
        emit.call({ "ev" => "wake", "q" => wake.queue_name, "p" => payload, "t" => Rel.now })
      end
    end
    emit.call({ "ev" => "ready", "pid" => Process.pid })
    while (line = cmd_r.gets)
      cmd = JSON.parse(line)
      case cmd["op"]
      when "sub"
        begin
          result = impl.ensure_listening(cmd["q"])
          emit.call({ "ev" => "sub", "q" => cmd["q"], "result" => result.inspect, "t" => Rel.now,
                      "failed_over" => impl.respond_to?(:failed_over?) && impl.failed_over? })
        rescue StandardError => e
          emit.call({ "ev" => "sub", "q" => cmd["q"], "result" => "error", "error" => "#{e.class}: #{e.message}" })
        end
      when "unsub"
        impl.remove_listening(cmd["q"])
        emit.call({ "ev" => "unsub", "q" => cmd["q"] })
      when "state"
        emit.call({ "ev" => "state", "failed_over" => impl.respond_to?(:failed_over?) && impl.failed_over? })
      when "exit"
        impl.stop
        break
      end
    end
    exit!(0)
  rescue StandardError => e
    emit&.call({ "ev" => "error", "why" => "#{e.class}: #{e.message}" })
    exit!(1)
  end

  def send_cmd(cmd)
    @cmd.puts(JSON.generate(cmd))
  rescue Errno::EPIPE, IOError
    nil
  end

  # Subscribes and waits for the result; returns the sub event.
  def sub(queue, timeout: 15)
    mark = size
    send_cmd({ "op" => "sub", "q" => queue })
    wait_event("sub #{queue}", timeout: timeout, from: mark) { |e| e["ev"] == "sub" && e["q"] == queue }
  end

  def sub_async(queue)
    send_cmd({ "op" => "sub", "q" => queue })
  end

  def size
    @lock.synchronize { @events.size }
  end

  def wait_event(what, timeout: 10, from: 0)
    deadline = Rel.now + timeout
    @lock.synchronize do
      loop do
        found = @events[from..]&.find { |e| yield(e) }
        return found if found

        left = deadline - Rel.now
        raise "worker #{@pid}: timed out waiting for #{what} (last events: #{@events.last(5).inspect})" if left <= 0

        @cond.wait(@lock, left)
      end
    end
  end

  def find_event(from: 0, &block)
    @lock.synchronize { @events[from..]&.find(&block) }
  end

  def wakes(queue, from: 0)
    @lock.synchronize { @events[from..].select { |e| e["ev"] == "wake" && e["q"] == queue } }
  end

  def wait_wake(queue, payload, timeout: 10, from: 0)
    wait_event("wake #{queue} #{payload.to_s[0, 40].inspect}", timeout: timeout, from: from) do |e|
      e["ev"] == "wake" && e["q"] == queue && e["p"] == payload
    end
  end

  def failed_over?
    !find_event { |e| e["ev"] == "failed_over" }.nil?
  end

  def signal(sig)
    Process.kill(sig, @pid)
  rescue Errno::ESRCH
    nil
  end

  def kill9
    signal("KILL")
    reap
  end

  def reap
    Process.wait(@pid)
  rescue Errno::ECHILD
    nil
  ensure
    @stopped = true
    close_pipes
  end

  # with_tmpdir's cleanup.
  def kill = (kill9 unless @stopped)

  def stop
    return if @stopped

    @stopped = true
    send_cmd({ "op" => "exit" })
    Timeout.timeout(5) { Process.wait(@pid) }
  rescue Timeout::Error
    signal("KILL")
    Process.wait(@pid) rescue nil # rubocop:disable Style/RescueModifier
  rescue Errno::ECHILD
    nil
  ensure
    close_pipes
  end

  def close_pipes
    @cmd.close unless @cmd.closed?
    @reader.join(2)
    @rep.close unless @rep.closed?
  end
end

module RelInvariants
  # Invariant 1: every acked subscription gets a wake for a NOTIFY committed
  # after the ack. `subs` = { worker => [queues] }. Returns the max latency (s).
  def assert_acked_subs_get_wakes(subs, tag: "check-#{rand(1_000_000)}", timeout: 10, notify: ->(q, p) { Rel.notify(q, p) })
    marks = subs.to_h { |worker, _| [worker, worker.size] }
    t0 = Rel.now
    subs.values.flatten.uniq.each { |queue| notify.call(queue, tag) }
    worst = 0.0
    subs.each do |worker, queues|
      queues.each do |queue|
        event = worker.wait_wake(queue, tag, timeout: timeout, from: marks[worker])
        worst = [worst, event["t"] - t0].max
      end
    end
    worst
  end

  # Invariant 4: master fds/threads/RSS do not grow across repetitions.
  # `samples` are proc_sample hashes taken after each repetition (first = warm-up).
  def assert_no_growth(samples, fd_slack: 3, thread_slack: 1, rss_slack_kb: 8192)
    first = samples[1] || samples[0]
    last = samples.last
    expect(last[:fds]).to be <= first[:fds] + fd_slack, "fds grew: #{samples.map { |s| s[:fds] }}"
    expect(last[:threads]).to be <= first[:threads] + thread_slack, "threads grew: #{samples.map { |s| s[:threads] }}"
    expect(last[:rss_kb]).to be <= first[:rss_kb] + rss_slack_kb, "RSS grew: #{samples.map { |s| s[:rss_kb] }}"
  end

  # A scenario's temp dir; every hub and worker process it started is
  # killed at its end, passed or failed, so none outlives it into the next census.
  def with_tmpdir
    Dir.mktmpdir("pgbus-rel") do |dir|
      File.chmod(0o755, dir)
      yield dir
    ensure
      Rel.started.pop.kill while Rel.started.any?
    end
  end
end

RSpec.configure do |config|
  config.include RelInvariants, :reliability
  config.before(:each, :reliability) do |example|
    # Until the Rakefile/.rspec wiring excludes them, a plain `rspec` would run
    # the slow scenarios (minutes, incl. the soak): they run only when asked for.
    slow = example.metadata[:reliability] != :fast
    skip "slow reliability scenario: run with `rspec --tag reliability` (rake reliability)" if slow && !Rel.slow_requested?
    skip "no PostgreSQL" unless TestDatabase.available?
    Rel.ensure_database!
  end
  config.after(:suite) do
    next if Rel.figures.empty?

    path = ENV.fetch("PGBUS_HUB_REL_FIGURES") { File.join(Dir.tmpdir, "pgbus-hub-reliability-figures.json") }
    File.write(path, JSON.pretty_generate(Rel.figures))
  end
end
