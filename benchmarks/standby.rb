# frozen_string_literal: true

# What the standby costs (issue 57 item 3; the `standby` key of `rake bench`'s
# JSON; docs/performance.md "Standby"): a native MasterHub in its own process
# (benchmarks/lib/native_hub_process.rb) without and with `standby: true`,
# interleaved round by round, each serving the same BENCH_STANDBY_WORKERS
# forked HubClient workers subscribed to one queue of this run's own channel.
# In each cell, once the hub is up (with standby: once the standby is aligned):
#
#   idle     the hub's LISTEN backends' CPU over BENCH_STANDBY_IDLE_S with no
#            NOTIFY (the health checks: 1 connection or 2)
#   wake     BENCH_STANDBY_SAMPLES timestamped NOTIFYs ~3 ms apart: NOTIFY to
#            the worker's dispatch queue, as the `wake` figure
#   cpu      BENCH_STANDBY_NOTIFIES NOTIFYs (one transaction each, BENCH_STANDBY_BATCH
#            per round trip, paced at BENCH_STANDBY_RATE/s, synchronous_commit off) until
#            every worker has them: utime+stime (/proc/<pid>/stat, 10 ms ticks)
#            and on-CPU ns (/proc/<pid>/task/*/schedstat) of the hub's LISTEN
#            backends (1, or 2 with the standby), of the NOTIFYing backend and
#            of the hub process, per 10k NOTIFYs
#
# The hub's backends are the pg_stat_activity rows whose client port is one
# of the hub process's own TCP sockets (so no other session's pgbus-listen
# backend is counted); over a Unix socket, the pgbus-listen backends that
# appeared with the hub. Each with-standby figure is a ratio to the
# one-connection figure of the same run.
#
# Env: BENCH_STANDBY_ROUNDS (default 4), _WORKERS (8), _NOTIFIES (10000),
#      _RATE (2000 NOTIFYs/s), _BATCH (1: a round trip per NOTIFY, so that the
#      LISTEN backends wake once per NOTIFY however the CPUs are shared; 50 per
#      round trip, as the burst figures send, leaves to the scheduler how many
#      each wake-up reads: the per-NOTIFY CPU then moves 5x with the load),
#      _SAMPLES (200 per cell), _IDLE_S (2).
module Bench
  module Standby
    ROUNDS = Integer(ENV.fetch("BENCH_STANDBY_ROUNDS", "4"))
    WORKERS = Integer(ENV.fetch("BENCH_STANDBY_WORKERS", "8"))
    NOTIFIES = Integer(ENV.fetch("BENCH_STANDBY_NOTIFIES", "10000"))
    RATE = Float(ENV.fetch("BENCH_STANDBY_RATE", "2000"))
    SAMPLES = Integer(ENV.fetch("BENCH_STANDBY_SAMPLES", "200"))
    IDLE_S = Float(ENV.fetch("BENCH_STANDBY_IDLE_S", "2"))
    BATCH = Integer(ENV.fetch("BENCH_STANDBY_BATCH", "1"))
    MODES = %w[one standby].freeze
    ALIGN_TIMEOUT = 10 # s

    module_function

    # This run's own queue (channel pgmq.q_<queue>.INSERT).
    def queue = (@queue ||= "bench_standby_#{Process.pid}_#{rand(1 << 30)}")

    # Local ports of the TCP sockets process `pid` holds.
    def tcp_ports(pid)
      inodes = Dir.glob("/proc/#{pid}/fd/*").filter_map do |fd|
        File.readlink(fd)[/\Asocket:\[(\d+)\]\z/, 1]
      rescue Errno::ENOENT
        nil
      end
      %w[tcp tcp6].flat_map { |t| File.readlines("/proc/#{pid}/net/#{t}").drop(1) }.filter_map do |line|
        f = line.split
        f[1].split(":").last.to_i(16) if inodes.include?(f[9])
      end
    end

    # [pid, application_name] of the hub's backends.
    def backends(hub, before)
      ports = tcp_ports(hub.pid)
      rows = if ports.empty?
               Bench.conn.exec("SELECT pid, application_name FROM pg_stat_activity WHERE application_name = 'pgbus-listen'")
                    .values.reject { |pid, _| before.include?(pid.to_i) }
             else
               Bench.conn.exec_params("SELECT pid, application_name FROM pg_stat_activity " \
                                      "WHERE client_port = ANY($1::int[]) AND backend_type = 'client backend'",
                                      ["{#{ports.join(',')}}"]).values
             end
      rows.map { |pid, name| [pid.to_i, name] }.sort
    end

    # Waits (bounded) until the hub has its connections up (with standby: aligned),
    # its backends are found and include the serving one. Seconds taken, or nil.
    def settle(hub, standby, before)
      t0 = Bench.now_ns
      deadline = t0 + (ALIGN_TIMEOUT * 1e9)
      want = standby ? 2 : 1
      loop do
        s = hub.stats
        found = backends(hub, before)
        up = s["listener_healthy"] && s["listen_connections"] == want && (!standby || s["standby_aligned"])
        if up && found.size == want && found.any? { |pid, _| pid == s["backend_pid"] }
          return [(Bench.now_ns - t0) / 1e9, found, s]
        end
        return [nil, found, s] if Bench.now_ns > deadline

        sleep 0.02
      end
    end

    # { pid => [stat ms, schedstat ms] }; nil for a process that is gone.
    def cpu(pids) = pids.to_h { |pid| [pid, (File.exist?("/proc/#{pid}/stat") ? [Bench.proc_stat_cpu_ms(pid), Bench.schedstat_ms(pid)] : nil)] }

    def delta(after, before)
      return nil if after.values.any?(&:nil?) || before.values.any?(&:nil?)

      after.keys.map { |pid| after[pid].zip(before[pid]).map { |a, b| a - b } }.transpose.map(&:sum)
    end

    # NOTIFYs `count` on `channel`, one transaction each, BATCH per round trip, at `rate`/s.
    def send_paced(via, count, rate)
      literal = via.escape_literal(CHAN[queue])
      t0 = Bench.now_ns
      sent = 0
      while sent < count
        n = [BATCH, count - sent].min
        via.exec(Array.new(n) { |i| "BEGIN; SELECT pg_notify(#{literal}, 'T#{Bench.now_ns}:#{sent + i}:'); COMMIT;" }.join)
        sent += n
        pause = t0 + (sent * 1e9 / rate) - Bench.now_ns
        sleep(pause / 1e9) if pause.positive?
      end
      (Bench.now_ns - t0) / 1e9
    end

    def cell(mode, notifier, notifier_pid, odd)
      standby = mode == "standby"
      before = Bench.conn.exec("SELECT pid FROM pg_stat_activity WHERE application_name = 'pgbus-listen'")
                    .column_values(0).map(&:to_i)
      Dir.mktmpdir("pgbus-bench") do |dir|
        hub = Hub.new("native-hub", dir, standby: standby)
        workers = []
        begin
          workers = Bench.spawn_workers("native-hub", WORKERS, hub.socket, [queue])
          align_s, found, stats0 = settle(hub, standby, before)
          odd << "#{mode}: not settled in #{ALIGN_TIMEOUT} s (backends #{found.inspect}, stats #{stats0.slice('listen_connections', 'standby_aligned', 'backend_pid')})" unless align_s
          pids = found.map(&:first)
          sleep 0.5 # past the workers' subscriptions and the first health checks
          c0 = cpu(pids)
          sleep IDLE_S
          idle = delta(cpu(pids), c0)

          Bench.mark(workers, queue)
          Bench.send_probes(queue, SAMPLES, via: notifier)
          lat = Bench.collect(workers, SAMPLES).flat_map { |r| r[:lat_us] }
          odd << "#{mode}: wake #{WORKERS * SAMPLES - lat.size} probes missing" if lat.size < WORKERS * SAMPLES

          Bench.mark(workers, queue)
          b0 = cpu(pids)
          n0 = cpu([notifier_pid])
          h0 = [Bench.proc_stat_cpu_ms(hub.pid), Bench.schedstat_ms(hub.pid)]
          send_s = send_paced(notifier, NOTIFIES, RATE)
          res = Bench.collect(workers, NOTIFIES, kind: "all", timeout: 20, idle: 2.0)
          b1 = cpu(pids)
          backend = delta(b1, b0)
          # schedstat ms of the serving backend, then the standby's
          split = [pids.partition { |pid| pid == stats0["backend_pid"] }].flatten.map { |pid| b1[pid] && b0[pid] && (b1[pid][1] - b0[pid][1]).round(1) }
          notify = delta(cpu([notifier_pid]), n0)
          hub_cpu = [Bench.proc_stat_cpu_ms(hub.pid), Bench.schedstat_ms(hub.pid)].zip(h0).map { |a, b| a - b }
          stats = hub.stats
          after = backends(hub, before).map(&:first)
          odd << "#{mode}: the hub's backends changed during the cell: #{pids.inspect} -> #{after.inspect}" unless after == pids
          %w[standby_promotions reconnects dropped_durable_wakes evicted_workers].each do |k|
            d = stats[k].to_i - stats0[k].to_i
            odd << "#{mode}: #{k} +#{d} during the cell" if d.positive?
          end
          delivered = res.sum { |r| r[:n] }
          odd << "#{mode}: #{delivered}/#{WORKERS * NOTIFIES} delivered" if delivered < WORKERS * NOTIFIES
          { align_s: align_s, backends: found, idle_ms: idle, lat_us: lat, send_s: send_s,
            backend_ms: backend, serving_standby_ms: split, notifier_ms: notify, hub_ms: hub_cpu, delivered: delivered, loadavg: Bench.loadavg }
        ensure
          workers.each(&:stop)
          hub.stop
        end
      end
    end

    def run
      notifier = PG.connect(URL)
      notifier.exec("SET synchronous_commit = off")
      notifier_pid = notifier.exec("SELECT pg_backend_pid()").getvalue(0, 0).to_i
      odd = []
      cells = Hash.new { |h, k| h[k] = [] }
      ROUNDS.times do |round|
        MODES.rotate(round).each do |mode|
          cells[mode] << cell(mode, notifier, notifier_pid, odd)
          Bench.log("standby #{mode} round #{round}: backends #{cells[mode].last[:backends].inspect}, " \
                    "backend CPU #{cells[mode].last[:backend_ms].inspect} ms, aligned in #{cells[mode].last[:align_s].inspect} s")
        end
      end
      summarize(cells, odd)
    ensure
      notifier&.close
    end

    # Sums over rounds, per 10k NOTIFYs; [stat ms, schedstat ms] pairs.
    def summarize(cells, odd)
      per10k = ->(list, key) { list.map { |c| c[key] }.then { |v| v.any?(&:nil?) ? nil : v.transpose.map { |x| (x.sum * 10_000.0 / (NOTIFIES * v.size)).round(2) } } }
      modes = cells.to_h do |mode, list|
        [mode, { backends: list.map { |c| c[:backends].size }, align_s: list.map { |c| c[:align_s]&.round(3) },
                 backend_ms_per_10k: per10k.call(list, :backend_ms), notifier_ms_per_10k: per10k.call(list, :notifier_ms),
                 hub_ms_per_10k: per10k.call(list, :hub_ms),
                 backend_ms_per_10k_by_round: list.map { |c| c[:backend_ms]&.map { |x| (x * 10_000.0 / NOTIFIES).round(2) } },
                 serving_standby_schedstat_ms_by_round: list.map { |c| c[:serving_standby_ms] },
                 idle_backend_ms_per_s: list.map { |c| c[:idle_ms] }.then { |v| v.any?(&:nil?) ? nil : v.transpose.map { |x| (x.sum / (IDLE_S * v.size)).round(2) } },
                 send_s: list.map { |c| c[:send_s].round(2) }, delivered: list.sum { |c| c[:delivered] },
                 loadavg: list.map { |c| c[:loadavg] }, wake: Bench.lat_summary(list.flat_map { |c| c[:lat_us] }) }]
      end
      ratio = ->(a, b) { a && b && b.positive? ? (a / b).round(2) : nil }
      one, sb = modes.values_at("one", "standby")
      ratios = {
        backend_cpu: one[:backend_ms_per_10k]&.zip(sb[:backend_ms_per_10k] || [])&.map { |a, b| ratio.call(b, a) },
        notifier_cpu: one[:notifier_ms_per_10k]&.zip(sb[:notifier_ms_per_10k] || [])&.map { |a, b| ratio.call(b, a) },
        hub_cpu: one[:hub_ms_per_10k].zip(sb[:hub_ms_per_10k]).map { |a, b| ratio.call(b, a) },
        wake_p50: ratio.call(sb[:wake][:p50_ms], one[:wake][:p50_ms]),
        wake_p99: ratio.call(sb[:wake][:p99_ms], one[:wake][:p99_ms]),
        # schedstat, the cells of one round against each other: the spread
        by_round: %i[backend_ms hub_ms notifier_ms].to_h do |key|
          [key, cells["one"].zip(cells["standby"]).map { |a, b| a[key] && b[key] && ratio.call(b[key][1], a[key][1]) }]
        end
      }
      { workers: WORKERS, notifies: NOTIFIES, rate: RATE, batch: BATCH, rounds: ROUNDS, samples: SAMPLES, idle_s: IDLE_S,
        queue: queue, modes: modes, ratios: ratios, odd: odd }
    end

    def rows(r, add)
      pair = ->(v) { v ? "#{Bench.fmt(v[0], ' ms')} (ticks), #{Bench.fmt(v[1], ' ms')} (schedstat)" : "-" }
      times = ->(v) { v ? format(" = %s x one (ticks/schedstat)", v.map { |x| x ? format("%.2f", x) : "-" }.join("/")) : "" }
      fig = "7 standby (#{r[:workers]}w, #{r[:notifies]} NOTIFYs at #{r[:rate].round}/s, #{r[:batch]}/trip, #{r[:rounds]} rounds)"
      MODES.each do |mode|
        m = r[:modes][mode]
        is_sb = mode == "standby"
        add.call("#{fig}: LISTEN backends' CPU per 10k", mode,
                 "#{pair.call(m[:backend_ms_per_10k])}, #{m[:backends].uniq.join('/')} backend(s)#{is_sb ? times.call(r[:ratios][:backend_cpu]) : ''}",
                 "", Bench.verdict(nil))
        add.call("#{fig}: hub process CPU per 10k", mode, "#{pair.call(m[:hub_ms_per_10k])}#{is_sb ? times.call(r[:ratios][:hub_cpu]) : ''}", "", Bench.verdict(nil))
        add.call("#{fig}: NOTIFYing backend CPU per 10k", mode, "#{pair.call(m[:notifier_ms_per_10k])}#{is_sb ? times.call(r[:ratios][:notifier_cpu]) : ''}", "", Bench.verdict(nil))
        add.call("#{fig}: wake p50/p95/p99", mode,
                 "#{Bench.lat_cell(m[:wake])}#{is_sb ? format(' = %.2fx / %.2fx one (p50/p99)', r[:ratios][:wake_p50], r[:ratios][:wake_p99]) : ''}",
                 "", Bench.verdict(nil))
        add.call("#{fig}: idle LISTEN backends' CPU per s", mode, pair.call(m[:idle_backend_ms_per_s]), "", Bench.verdict(nil))
        if is_sb
          add.call("#{fig}: serving / standby backend CPU by round", mode,
                   m[:serving_standby_schedstat_ms_by_round].map { |v| v.join(" / ") }.join(", ") + " ms (schedstat)", "", Bench.verdict(nil))
        end
        want = is_sb ? 2 : 1
        add.call("#{fig}: backends found, settled in", mode, "#{m[:backends].join('/')}, #{m[:align_s].map { |s| s ? "#{s} s" : 'never' }.join('/')}",
                 "#{want} each round", Bench.verdict(m[:backends].all?(want) && m[:align_s].none?(&:nil?)))
      end
      add.call("#{fig}: standby/one by round (schedstat)", "standby",
               r[:ratios][:by_round].map { |k, v| "#{k.to_s.delete_suffix('_ms')} #{v.map { |x| x ? format('%.2f', x) : '-' }.join('/')} (median #{Bench.fmt(Bench.pct(v.compact, 50))})" }.join(", "),
               "", Bench.verdict(nil))
      add.call("#{fig}: anything odd", "-", r[:odd].empty? ? "none" : r[:odd].join("; "), "none", Bench.verdict(r[:odd].empty?))
    end
  end
end
