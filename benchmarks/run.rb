# frozen_string_literal: true

# rake bench  ==  ruby -Ilib benchmarks/run.rb
#
# Native MasterHub / HubClient / Listener against two baselines written for
# this benchmark (benchmarks/baselines/): per-worker ruby-pg LISTEN ("direct")
# and a plain-Ruby hub + client of pgbus 0.13.1's design ("ruby-hub").
# Workers are real forked processes; each hub runs in its own process so its
# CPU, threads and RSS are separable. The machine is shared and noisy, so every
# figure is judged as a ratio against a baseline measured in the same run,
# interleaved round by round. Prints one table, writes tmp/bench/latest.json.
#
# Env: PGBUS_HUB_TEST_DATABASE_URL (default host=/var/run/postgresql dbname=pgbus_hub_test),
#      BENCH_ROUNDS (default 2), BENCH_SAMPLES (wake probes per cell per round, default 100),
#      BENCH_ONLY=floor,wake,sub_ack,burst8,fanout32,footprint,isolation,gap,standby,scale (a subset),
#      GAP_* (benchmarks/relisten_gap.rb), BENCH_STANDBY_* (benchmarks/standby.rb),
#      BENCH_SCALE=0 (skip the busy-host figures) and BENCH_SCALE_* (benchmarks/scale.rb).

require "json"
require "pg"
require "rbconfig"
require "socket"
require "tmpdir"
require "fileutils"
require "pgbus/hub"
require_relative "baselines/direct"
require_relative "baselines/ruby_hub"
require_relative "lib/worker"
require_relative "scale"
require_relative "relisten_gap"
require_relative "standby"

module Bench
  ROOT = File.expand_path("..", __dir__)
  URL = ENV["PGBUS_HUB_TEST_DATABASE_URL"] || "host=/var/run/postgresql dbname=pgbus_hub_test"
  ROUNDS = Integer(ENV.fetch("BENCH_ROUNDS", "2"))
  SAMPLES = Integer(ENV.fetch("BENCH_SAMPLES", "100"))
  HEALTH_MS = 250
  CHAN = ->(q) { "pgmq.q_#{q}.INSERT" }
  HUB_MODES = %w[ruby-hub native-hub native-hub+ruby-client].freeze
  TIMEOUT = 30 # seconds: any single wait on a child

  module_function

  # Subscriptions answered nil (LISTEN not confirmed in time), by figure:
  # reported in the table (target 0) rather than aborting the run.
  def unconfirmed = (@unconfirmed ||= Hash.new(0))

  def now_ns = Process.clock_gettime(Process::CLOCK_MONOTONIC, :nanosecond)
  def loadavg = File.read("/proc/loadavg").split.first(3).join(" ")

  def pct(values, p)
    return nil if values.empty?

    sorted = values.sort
    sorted[[(values.size * p / 100.0).ceil - 1, 0].max]
  end

  def lat_summary(us)
    { n: us.size, p50_ms: pct(us, 50)&./(1000.0), p95_ms: pct(us, 95)&./(1000.0), p99_ms: pct(us, 99)&./(1000.0) }
  end

  def log(msg) = $stderr.puts("[bench #{Time.now.strftime('%H:%M:%S')} load #{loadavg}] #{msg}")

  def conn
    @conn = nil if @conn&.finished?
    @conn ||= PG.connect(URL)
  end

  def census
    conn.exec("select count(*) from pg_stat_activity where application_name = 'pgbus-listen'").getvalue(0, 0).to_i
  end

  # --- processes --------------------------------------------------------------

  def proc_stat_cpu_ms(pid)
    fields = File.read("/proc/#{pid}/stat").split(") ").last.split
    (fields[11].to_i + fields[12].to_i) * 1000.0 / 100 # utime + stime, CLK_TCK 100
  end

  # On-CPU ns of every live thread (/proc/<pid>/task/*/schedstat): ns resolution,
  # where /proc/<pid>/stat counts 10 ms ticks. Hub threads live for the whole cell.
  def schedstat_ms(pid)
    Dir.glob("/proc/#{pid}/task/*/schedstat").sum { |f| File.read(f).split.first.to_i rescue 0 } / 1e6
  end

  # [on-CPU ms, run-queue wait ms] summed over live threads.
  def schedstat_pair(pid)
    Dir.glob("/proc/#{pid}/task/*/schedstat").map { |f| File.read(f).split.first(2).map(&:to_i) rescue [0, 0] }
       .transpose.map { |v| v.sum / 1e6 }
  end

  # CPU the benchmark's own dispatcher stand-in (StampQueue + consumer + Recorder,
  # identical in every worker mode) spends per 10k wakes, measured in-process.
  def harness_cost
    out = {}
    { durable: nil, ephemeral: "T#{now_ns}:0:" + ("x" * 2030) }.each do |kind, payload|
      rec = BenchWorker::Recorder.new
      sq = BenchWorker::StampQueue.new(rec)
      rec.reset("h")
      n = 20_000
      cpu0 = BenchWorker.cpu_ms
      n.times { sq << Pgbus::Hub::WakeMessage.new(queue_name: "h", payload: payload&.dup) }
      rec.await(n, "all", now_ns + 10e9, 5e9)
      out[kind] = (BenchWorker.cpu_ms - cpu0) * 10_000.0 / n
    end
    out
  end

  def proc_status(pid)
    s = File.read("/proc/#{pid}/status")
    { threads: s[/^Threads:\s+(\d+)/, 1].to_i, rss_kb: s[/^VmRSS:\s+(\d+)/, 1].to_i }
  end

  class Hub
    attr_reader :pid, :mode, :socket

    # standby: the native hub's `standby: true` (benchmarks/standby.rb).
    def initialize(mode, dir, url: URL, standby: false)
      @mode = mode
      @socket = File.join(dir, "#{mode}-#{rand(1 << 30)}.sock")
      script = mode == "ruby-hub" ? "baselines/ruby_hub.rb" : "lib/native_hub_process.rb"
      @io = IO.popen([RbConfig.ruby, "-I", File.join(ROOT, "lib"), File.join(__dir__, script),
                      @socket, url, HEALTH_MS.to_s, *("standby" if standby)], "r+")
      @pid = @io.pid
      raise "#{mode} hub did not start" unless @io.wait_readable(TIMEOUT) && @io.gets&.strip == "ready"
    end

    def stats
      @io.puts "stats"
      raise "#{@mode} hub: no stats" unless @io.wait_readable(TIMEOUT)

      JSON.parse(@io.gets)
    end

    def stop
      @io.puts "quit"
      @io.close
    rescue IOError, Errno::EPIPE
      nil
    ensure
      begin
        Process.kill("KILL", @pid)
      rescue Errno::ESRCH
        nil
      end
    end
  end

  class Worker
    attr_reader :pid

    def initialize(mode, socket, queues, url: URL)
      @mode = mode
      ctl_r, @ctl = IO.pipe
      @out, out_w = IO.pipe
      @pid = fork do
        @ctl.close
        @out.close
        BenchWorker.run(mode: mode, url: url, socket: socket, queues: queues, ctl: ctl_r, out: out_w)
      end
      ctl_r.close
      out_w.close
    end

    # "ready N": N subscriptions answered nil (not confirmed in time), added to Bench.unconfirmed.
    def await_ready
      line = read.strip
      raise "worker #{@pid}: expected ready, got #{line}" unless line.start_with?("ready")

      Bench.unconfirmed["startup #{@mode}"] += line.split[1].to_i
    end

    def cmd(line)
      @ctl.puts(line)
      read
    end

    def send_only(line) = @ctl.puts(line)

    def read(timeout = TIMEOUT)
      raise "worker #{@pid}: no answer within #{timeout}s" unless @out.wait_readable(timeout)

      line = @out.gets or raise "worker #{@pid} exited"
      raise "worker #{@pid}: #{line}" if line.start_with?("error")

      line
    end

    def expect(word)
      line = read.strip
      raise "worker #{@pid}: expected #{word}, got #{line}" unless line == word
    end

    def json(line) = JSON.parse(cmd(line), symbolize_names: true)

    def stop
      @ctl.puts "quit"
    rescue IOError, Errno::EPIPE
      nil
    ensure
      begin
        Process.kill("KILL", @pid)
        Process.wait(@pid)
      rescue Errno::ESRCH, Errno::ECHILD
        nil
      end
      [@ctl, @out].each { |io| io.close unless io.closed? }
    end
  end

  def spawn_workers(mode, n, socket, queues, url: URL)
    workers = Array.new(n) { |i| Worker.new(mode, socket, queues.map { |q| q.sub("%i", i.to_s) }, url: url) }
    workers.each(&:await_ready)
    workers
  end

  # One cell: an optional hub process, N workers; yields, then tears down.
  def with_setup(mode, n, queues, url: URL)
    Dir.mktmpdir("pgbus-bench") do |dir|
      hub = HUB_MODES.include?(mode) ? Hub.new(mode, dir, url: url) : nil
      workers = []
      begin
        workers = spawn_workers(mode, n, hub&.socket, queues, url: url)
        yield hub, workers
      ensure
        workers.each(&:stop)
        hub&.stop
      end
    end
  end

  # Background NOTIFY load (a child process with its own connection): `rate`
  # NOTIFYs per second on queue `q`, until stopped (bounded at 60 s).
  def start_background(queue, rate)
    r, w = IO.pipe
    pid = fork do
      w.close
      c = PG.connect(URL)
      stop_at = now_ns + 60e9
      batch = [rate / 100, 1].max
      sql = (["BEGIN; SELECT pg_notify(#{c.escape_literal(CHAN[queue])}, 'bg'); COMMIT;"] * batch).join
      until r.wait_readable(0.01) || now_ns > stop_at
        c.exec(sql)
      end
      exit!(0)
    end
    r.close
    -> { w.close; Process.wait(pid) }
  end

  # Sends `count` timestamped NOTIFYs one transaction each, `gap` seconds apart.
  def send_probes(queue, count, gap: 0.003, pad: 0, via: conn)
    channel = CHAN[queue]
    count.times do |i|
      payload = "T#{now_ns}:#{i}:"
      payload += "x" * (pad - payload.bytesize) if pad > payload.bytesize
      via.exec_params("SELECT pg_notify($1, $2)", [channel, payload])
      sleep(gap * (0.5 + rand)) if gap.positive?
    end
  end

  # A burst: `count` NOTIFYs, one transaction each, 50 per round trip.
  # kind :ephemeral (timestamped, padded to `bytes`) or :durable (empty payload).
  def send_burst(queue, count, kind:, bytes: 200)
    channel = conn.escape_literal(CHAN[queue])
    (0...count).each_slice(50) do |slice|
      sql = slice.map do |i|
        payload = if kind == :durable
                    ""
                  else
                    p = "T#{now_ns}:#{i}:"
                    p + ("x" * [bytes - p.bytesize, 0].max)
                  end
        "BEGIN; SELECT pg_notify(#{channel}, '#{payload}'); COMMIT;"
      end.join
      conn.exec(sql)
    end
  end

  def collect(workers, want, kind: "t", timeout: 10, idle: 1.0)
    workers.each { |w| w.send_only("wait #{want} #{timeout} #{idle} #{kind}") }
    workers.map { |w| JSON.parse(w.read, symbolize_names: true) }
  end

  def mark(workers, queue) = workers.each { |w| w.cmd("mark #{queue}") }

  # --- figures ------------------------------------------------------------------

  WAKE_MODES = %w[direct ruby-hub native-hub native-listener native-hub+ruby-client].freeze
  BASIC_MODES = %w[direct ruby-hub native-hub native-listener].freeze

  def fig1_wake_latency
    cells = {}
    ROUNDS.times do |round|
      [1, 8, 16].each do |n|
        %i[idle load].each do |load|
          WAKE_MODES.rotate(round).each do |mode|
            with_setup(mode, n, %w[lat bg]) do |_hub, workers|
              stop_bg = load == :load ? start_background("bg", 300) : nil
              sleep 0.2
              mark(workers, "lat")
              send_probes("lat", SAMPLES)
              res = collect(workers, SAMPLES)
              stop_bg&.call
              (cells[[mode, n, load]] ||= []).concat(res.flat_map { |r| r[:lat_us] })
              missing = n * SAMPLES - res.sum { |r| r[:lat_us].size }
              log("wake #{mode} n=#{n} #{load} round #{round}: #{missing} missing") if missing.positive?
            end
          end
        end
      end
    end
    cells.transform_values { |us| lat_summary(us) }
  end

  # Samples per round: p99 of 2 x 25 is the maximum, one VM stall decides it;
  # the ruby-hub's ~120 ms acks keep it at 25 (reference figures are n=50).
  SUB_ACK_SAMPLES = { "ruby-hub" => 25, "native-hub" => 100 }.freeze

  # What this machine allows at best, measured the way the wake figure is
  # (timestamp before the NOTIFY is sent): a bare ruby-pg LISTEN in this
  # process, and a 1-byte Unix-socket round trip to a forked echo process.
  def fig0_floor(samples = 300)
    listener = PG.connect(URL)
    listener.exec("LISTEN pgbus_bench_floor")
    notify = Array.new(samples) do
      t0 = now_ns
      conn.exec("NOTIFY pgbus_bench_floor")
      listener.wait_for_notify(5) || raise("floor: NOTIFY not received")
      (now_ns - t0) / 1000.0
    end
    listener.close
    ours, theirs = UNIXSocket.pair
    echo = fork do
      ours.close
      while (byte = theirs.read(1))
        theirs.write(byte)
      end
      exit!(0)
    end
    theirs.close
    ping = lambda do
      t0 = now_ns
      ours.write("x")
      ours.read(1)
      (now_ns - t0) / 1000.0
    end
    round_trip = Array.new(samples * 3) { ping.call }
    # The sub-ack figure's rhythm (a random pause of up to 250 ms before each
    # sample): on this VM an idle vCPU wakes slowly, and that sets the tail.
    after_idle = Array.new(samples / 3) do
      sleep(rand * 0.25)
      ping.call
    end
    ours.close
    Process.wait(echo)
    { notify_listen: lat_summary(notify), unix_round_trip: lat_summary(round_trip),
      unix_round_trip_after_idle: lat_summary(after_idle) }
  end

  def fig2_sub_ack
    out = {}
    ROUNDS.times do |round|
      %w[ruby-hub native-hub].rotate(round).each do |mode|
        n = SUB_ACK_SAMPLES.fetch(mode)
        with_setup(mode, 2, %w[act_hold]) do |_hub, workers|
          # both workers hold act_hold; the prober unsubs/re-subs it (it stays LISTENed)
          prober = workers.last
          { new: "acknew #{n}", active: "ackact act_hold #{n}" }.each do |kind, command|
            samples = prober.json(command)
            unconfirmed[:sub_ack] += samples.count(nil)
            (out[[mode, kind]] ||= []).concat(samples.compact)
          end
        end
      end
    end
    out.transform_values { |ms| lat_summary(ms.map { |x| x * 1000.0 }) }
  end

  # Per-message latency for a burst of 2000 x 200 B to 8 workers.
  def fig3_burst8(count = 2000)
    out = {}
    waits = {}
    per_round = {}
    ROUNDS.times do |round|
      BASIC_MODES.rotate(round).each do |mode|
        with_setup(mode, 8, %w[burst]) do |hub, workers|
          mark(workers, "burst")
          s0 = hub && schedstat_pair(hub.pid)
          send_burst("burst", count, kind: :ephemeral, bytes: 200)
          res = collect(workers, count, timeout: 20)
          if hub
            cpu, wait = schedstat_pair(hub.pid).zip(s0).map { |a, b| a - b }
            (waits[mode] ||= []) << { hub_cpu_ms: cpu.round(1), hub_runqueue_wait_ms: wait.round(1), loadavg: loadavg }
          end
          (out[mode] ||= []).concat(res.flat_map { |r| r[:lat_us] })
          (per_round[mode] ||= []) << lat_summary(res.flat_map { |r| r[:lat_us] })[:p99_ms]
        end
      end
    end
    out.to_h { |mode, us| [mode, lat_summary(us).merge(p99_ms_per_round: per_round[mode], hub_sched: waits[mode])] }
  end

  # Fan-out of a burst to 32 workers: deliveries/s, hub CPU per 10k deliveries,
  # worker CPU per 10k wakes.
  def fig3_fanout32(count = 1000, workers_n = 32)
    out = {}
    ROUNDS.times do |round|
      %i[durable ephemeral].each do |kind|
        %w[direct ruby-hub native-hub].rotate(round).each do |mode|
          with_setup(mode, workers_n, %w[fan]) do |hub, workers|
            sleep 0.3
            mark(workers, "fan")
            hub_cpu0 = hub && proc_stat_cpu_ms(hub.pid)
            hub_sched0 = hub && schedstat_ms(hub.pid)
            t0 = now_ns
            send_burst("fan", count, kind: kind, bytes: 2048)
            res = collect(workers, count, kind: "all", timeout: 30, idle: 1.5)
            hub_cpu = hub && proc_stat_cpu_ms(hub.pid) - hub_cpu0
            hub_sched = hub && schedstat_ms(hub.pid) - hub_sched0
            stats = hub&.stats
            delivered = res.sum { |r| r[:n] }
            last = res.filter_map { |r| r[:last_ns] }.max || t0
            o = (out[[mode, kind]] ||= Hash.new(0))
            o[:sent] += count * workers_n
            o[:delivered] += delivered
            o[:seconds] += (last - t0) / 1e9
            o[:hub_cpu_ms_stat] += hub_cpu if hub_cpu
            o[:hub_cpu_ms] += hub_sched if hub_sched
            o[:worker_cpu_ms] += res.sum { |r| r[:cpu_ms] }
            o[:worker_user_ms] += res.sum { |r| r[:user_ms] }
            o[:worker_sys_ms] += res.sum { |r| r[:sys_ms] }
            o[:worker_ctx_switches] += res.sum { |r| r[:ctx_switches] }
            o[:dropped] += (stats && stats["dropped_durable_wakes"]).to_i
            o[:evicted] += (stats && stats["evicted_workers"]).to_i
          end
        end
      end
    end
    out.transform_values do |o|
      o.merge(deliveries_per_s: o[:delivered] / o[:seconds],
              hub_cpu_ms_per_10k_proc_stat: o[:hub_cpu_ms_stat] * 10_000.0 / o[:delivered],
              hub_cpu_ms_per_10k: o[:hub_cpu_ms].positive? ? o[:hub_cpu_ms] * 10_000.0 / o[:delivered] : nil,
              worker_cpu_ms_per_10k: o[:worker_cpu_ms] * 10_000.0 / o[:delivered],
              worker_user_sys_ms_per_10k: [o[:worker_user_ms], o[:worker_sys_ms]].map { |x| (x * 10_000.0 / o[:delivered]).round(1) },
              worker_ctx_switches_per_wake: (o[:worker_ctx_switches].to_f / o[:delivered]).round(2))
    end
  end

  def fig4_footprint
    out = {}
    BASIC_MODES.each do |mode|
      before = census
      Dir.mktmpdir("pgbus-bench") do |dir|
        hub = HUB_MODES.include?(mode) ? Hub.new(mode, dir) : nil
        workers = []
        begin
          sleep 0.3
          rows = {}
          rows[0] = proc_status(hub.pid).merge(census: census - before) if hub
          [1, 8, 32].each do |n|
            workers += Array.new(n - workers.size) { |i| Worker.new(mode, hub&.socket, ["fp", "fp_#{workers.size + i}"]) }
            workers.each { |w| w.await_ready unless w.instance_variable_get(:@ready) }
            workers.each { |w| w.instance_variable_set(:@ready, true) }
            mark(workers, "fp")
            send_probes("fp", 20, gap: 0.001)
            collect(workers, 20, timeout: 5)
            sleep 0.3
            rows[n] = { census: census - before }
            rows[n].merge!(proc_status(hub.pid)) if hub
          end
          out[mode] = rows
        ensure
          workers.each(&:stop)
          hub&.stop
        end
      end
      sleep 0.5 # let the direct backends go before the next census
    end
    out
  end

  # 8 workers; flood + probes with all running, then with worker 0 SIGSTOPped.
  def fig5_isolation(ticks = 300)
    out = {}
    %w[ruby-hub native-hub].each do |mode|
      with_setup(mode, 8, %w[iso]) do |hub, workers|
        stopped = workers.first
        others = workers.drop(1)
        phases = {}
        %i[before after].each do |phase|
          Process.kill("STOP", stopped.pid) if phase == :after
          mark(phase == :before ? workers : others, "iso")
          stats0 = hub.stats
          flood = (["BEGIN; SELECT pg_notify(#{conn.escape_literal(CHAN['iso'])}, '#{'F' * 2048}'); COMMIT;"] * 4 +
                   ["BEGIN; SELECT pg_notify(#{conn.escape_literal(CHAN['iso'])}, ''); COMMIT;"] * 4).join
          ticks.times do |i|
            conn.exec_params("SELECT pg_notify($1, $2)", [CHAN["iso"], "T#{now_ns}:#{i}:"])
            conn.exec(flood)
            sleep 0.005
          end
          res = collect(others, ticks, timeout: 15)
          stats = hub.stats
          phases[phase] = lat_summary(res.flat_map { |r| r[:lat_us] }).merge(
            dropped: stats["dropped_durable_wakes"].to_i - stats0["dropped_durable_wakes"].to_i,
            evicted: stats["evicted_workers"].to_i - stats0["evicted_workers"].to_i
          )
        end
        Process.kill("KILL", stopped.pid)
        out[mode] = phases
      end
    end
    out
  end

  # --- table ----------------------------------------------------------------------

  def fmt(x, unit = "")
    return "-" if x.nil?

    s = x.is_a?(Float) ? (x >= 100 ? format("%.0f", x) : x >= 10 ? format("%.1f", x) : format("%.3f", x)) : x.to_s
    "#{s}#{unit}"
  end

  def lat_cell(s) = s ? "#{fmt(s[:p50_ms])}/#{fmt(s[:p95_ms])}/#{fmt(s[:p99_ms])} ms (n=#{s[:n]})" : "-"

  def verdict(ok) = ok.nil? ? "info" : (ok ? "met" : "MISSED")

  def build_rows(r)
    rows = []
    add = ->(figure, mode, value, target = "", ok = nil) { rows << { figure: figure, mode: mode, value: value, target: target, status: verdict(ok) } }
    add.call("0 floor: NOTIFY -> LISTEN, bare ruby-pg", "-", lat_cell(r[:floor][:notify_listen]), "ref p50 0.141")
    add.call("0 floor: Unix-socket round trip, 1 byte", "-", lat_cell(r[:floor][:unix_round_trip]), "ref 0.025")
    add.call("0 floor: the same after 0-250 ms idle", "-", lat_cell(r[:floor][:unix_round_trip_after_idle]))
    w = r[:wake]
    [1, 8, 16].each do |n|
      %i[idle load].each do |load|
        d = w[["direct", n, load]]
        WAKE_MODES.each do |mode|
          s = w[[mode, n, load]]
          next unless s

          ratio = d && s[:p50_ms] / d[:p50_ms]
          target, ok = "", nil
          if mode == "native-hub" && d
            limit = n == 1 ? 1.3 : 1.0
            target = "p50 <= #{limit}x direct"
            ok = ratio <= limit
          end
          target = "ref 1w: 0.254/0.737 (p50/p99)" if mode == "ruby-hub" && n == 1 && load == :idle
          target = "ref 8w: 0.45/1.6" if mode == "ruby-hub" && n == 8 && load == :idle
          target = "ref 1w: 0.131/0.296" if mode == "direct" && n == 1 && load == :idle
          target = "ref 8w: 0.200/0.525" if mode == "direct" && n == 8 && load == :idle
          add.call("1 wake p50/p95/p99, #{n}w #{load}", mode, "#{lat_cell(s)}#{ratio && mode != 'direct' ? format(' = %.2fx direct', ratio) : ''}", target, ok)
        end
      end
    end
    r[:sub_ack].each do |(mode, kind), s|
      target, ok = mode == "native-hub" ? ["p99 <= 2 ms", s[:p99_ms] <= 2.0] : ["ref 121/248 (p50/p99)", nil]
      add.call("2 sub ack, #{kind} channel", mode, lat_cell(s), target, ok)
    end
    b = r[:burst8]
    b.each do |mode, s|
      target, ok = mode.start_with?("native") ? ["p99 <= direct (#{fmt(b['direct'][:p99_ms])} ms)", s[:p99_ms] <= b["direct"][:p99_ms]] : [mode == "ruby-hub" ? "ref p99 80-104" : "ref p99 1.5-14", nil]
      add.call("3 burst 2000x200B to 8w, per-msg", mode, lat_cell(s), target, ok)
    end
    f = r[:fanout32]
    %i[durable ephemeral].each do |kind|
      rh = f[["ruby-hub", kind]]
      %w[direct ruby-hub native-hub].each do |mode|
        o = f[[mode, kind]] or next
        label = kind == :durable ? "durable" : "2KB ephemeral"
        add.call("3 fan-out 32w #{label}: deliveries/s", mode,
                 "#{fmt(o[:deliveries_per_s])}/s (#{o[:delivered]}/#{o[:sent]} delivered, dropped #{o[:dropped]}, evicted #{o[:evicted]})")
        if o[:hub_cpu_ms_per_10k]
          target, ok = mode == "native-hub" ? ["<= 1/10 ruby-hub (#{fmt(rh[:hub_cpu_ms_per_10k] / 10)} ms)", o[:hub_cpu_ms_per_10k] <= rh[:hub_cpu_ms_per_10k] / 10] : ["ref 106-138", nil]
          add.call("3 hub CPU per 10k deliveries, #{label}", mode,
                   "#{fmt(o[:hub_cpu_ms_per_10k], ' ms')} (schedstat; /proc/stat ticks: #{fmt(o[:hub_cpu_ms_per_10k_proc_stat], ' ms')})", target, ok)
        end
        h = r[:harness][kind]
        net = ->(x) { x[:worker_cpu_ms_per_10k] - h }
        target, ok = mode == "native-hub" ? ["net <= 1/3 ruby client (#{fmt(net.call(rh) / 3)} ms)", net.call(o) <= net.call(rh) / 3] : [mode == "ruby-hub" ? "ref 139-165" : "", nil]
        add.call("3 worker CPU per 10k wakes, #{label}", mode,
                 "#{fmt(o[:worker_cpu_ms_per_10k], ' ms')} raw, #{fmt(net.call(o), ' ms')} net of harness (#{fmt(h, ' ms')})", target, ok)
      end
    end
    r[:footprint].each do |mode, rows_by_n|
      if rows_by_n[0]&.key?(:threads)
        th = rows_by_n.transform_values { |x| x[:threads] }
        ok = mode == "native-hub" ? (th.values.uniq.size == 1 && th.values.max <= 4) : nil
        add.call("4 master threads at 0/1/8/32w", mode, th.values.join("/"), mode == "native-hub" ? "constant, <= 4" : "ref 5 + 2/worker", ok)
        added = (rows_by_n[32][:rss_kb] - rows_by_n[0][:rss_kb]) / 1024.0
        add.call("4 master RSS at 0/1/8/32w", mode,
                 "#{rows_by_n.values.map { |x| fmt(x[:rss_kb] / 1024.0) }.join('/')} MB (+#{fmt(added)} MB at 32w)",
                 mode == "native-hub" ? "added at 32w <= 2 MB" : "", mode == "native-hub" ? added <= 2.0 : nil)
      end
      cz = [1, 8, 32].map { |n| rows_by_n[n][:census] }
      want = HUB_MODES.include?(mode) ? [1, 1, 1] : [1, 8, 32]
      add.call("4 census pgbus-listen at 1/8/32w", mode, cz.join("/"), want.join("/"), cz == want)
    end
    r[:isolation].each do |mode, ph|
      ratio = ph[:after][:p99_ms] / ph[:before][:p99_ms]
      add.call("5 slow worker: others' p99 before -> after", mode,
               "#{fmt(ph[:before][:p99_ms])} -> #{fmt(ph[:after][:p99_ms])} ms (#{format('%.2fx', ratio)}); dropped #{ph[:after][:dropped]}, evicted #{ph[:after][:evicted]}",
               mode == "native-hub" ? "<= 1.5x" : "", mode == "native-hub" ? ratio <= 1.5 : nil)
    end
    rows
  end

  def table(rows)
    cols = %i[figure mode value target status]
    widths = cols.map { |c| [c.size, *rows.map { |row| row[c].to_s.size }].max }
    line = ->(vals) { "| " + vals.each_with_index.map { |v, i| v.to_s.ljust(widths[i]) }.join(" | ") + " |" }
    [line.call(cols), "|" + widths.map { |wd| "-" * (wd + 2) }.join("|") + "|", *rows.map { |row| line.call(cols.map { |c| row[c] }) }].join("\n")
  end

  def jsonable(obj)
    case obj
    when Hash then obj.to_h { |k, v| [k.is_a?(Array) ? k.join("/") : k.to_s, jsonable(v)] }
    when Array then obj.map { |v| jsonable(v) }
    else obj
    end
  end

  def main
    started = now_ns
    machine = { nproc: Integer(`nproc`.strip), ruby: RUBY_DESCRIPTION, pg_gem: PG::VERSION,
                postgresql: conn.exec("show server_version").getvalue(0, 0), loadavg_start: loadavg,
                rounds: ROUNDS, samples_per_cell_round: SAMPLES, health_check_ms: HEALTH_MS }
    log("start: #{machine}")
    r = {}
    only = ENV["BENCH_ONLY"]&.split(",")
    run = ->(name, &blk) { next unless only.nil? || only.include?(name.to_s); r[name] = blk.call; log("#{name} done") }
    run.call(:floor) { fig0_floor }
    run.call(:wake) { fig1_wake_latency }
    run.call(:sub_ack) { fig2_sub_ack }
    run.call(:burst8) { fig3_burst8 }
    run.call(:fanout32) { fig3_fanout32 }
    r[:harness] = harness_cost
    run.call(:footprint) { fig4_footprint }
    run.call(:isolation) { fig5_isolation }
    run.call(:gap) { RelistenGap.run }
    run.call(:standby) { Standby.run }
    run.call(:scale) { Scale.run } unless ENV["BENCH_SCALE"] == "0"
    machine[:loadavg_end] = loadavg
    machine[:seconds] = ((now_ns - started) / 1e9).round(1)
    rows = only ? [] : build_rows(r)
    add = ->(*row) { rows << %i[figure mode value target status].zip(row).to_h }
    RelistenGap.rows(r[:gap], ->(*row, ok) { add.call(*row, verdict(ok)) }) if r[:gap]
    Standby.rows(r[:standby], add) if r[:standby]
    Scale.rows(r[:scale], add) if r[:scale]
    rows << { figure: "unconfirmed LISTEN answers (nil), all figures", mode: "-", value: unconfirmed.inspect,
              target: "0", status: verdict(unconfirmed.values.sum.zero?) }
    text = table(rows)
    puts "pgbus-hub benchmarks — #{machine[:nproc]} cores, load avg #{machine[:loadavg_start]} -> #{machine[:loadavg_end]}, " \
         "#{machine[:ruby]}, PostgreSQL #{machine[:postgresql]}, #{machine[:seconds]} s, " \
         "#{ROUNDS} interleaved round(s); latencies p50/p95/p99"
    puts text
    FileUtils.mkdir_p(File.join(ROOT, "tmp", "bench"))
    File.write(File.join(ROOT, "tmp", "bench", "latest.json"),
               JSON.pretty_generate({ machine: machine, results: jsonable(r), unconfirmed: unconfirmed, rows: rows }))
    puts "wrote tmp/bench/latest.json"
  end
end

Bench.main if $PROGRAM_NAME == __FILE__
