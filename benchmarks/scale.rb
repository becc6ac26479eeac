# frozen_string_literal: true

# The busy-host figures of `rake bench` (the `scale` key of its JSON), each on a
# private cluster per PostgreSQL release, because a LISTENing backend's cost per
# notification changed in PostgreSQL 19 (a shared channel hash, only interested
# backends signalled) and 256 direct connections need max_connections raised:
#
#   (a) fan256    one NOTIFY fanned to 256 workers: until the LAST worker has it
#   (b) channels  NOTIFY/s received and the LISTENing backends' CPU with 1k/10k/50k
#                 channels LISTENed, split over 8 workers (hub: one backend holds them all)
#   (c) relisten  the hub's backend terminated: time to re-LISTEN 10k/50k channels,
#                 the catch-up wakes, a live wake during them; and one connection
#                 LISTENing N channels in batches of B (why the engine's batch size)
#   (d) churn     32 workers subscribing new channels (each then unsubscribed) at
#                 1,000 subs/s in all for 30 s: ack p50/p99, hub and backend CPU
#
# Releases: BENCH_SCALE_RELEASES (default "15,19"); the host's binaries where
# Debian bookworm has them, else those of bin/chroot's suite (17 trixie, 18/19 sid).
# The cluster's postmaster runs inside that chroot; everything else on the host,
# over 127.0.0.1. Needs root (initdb as postgres, chroot).
module Bench
  module Scale
    RELEASES = ENV.fetch("BENCH_SCALE_RELEASES", "15,19").split(",")
    FAN_WORKERS = Integer(ENV.fetch("BENCH_SCALE_WORKERS", "256"))
    FAN_SAMPLES = Integer(ENV.fetch("BENCH_SCALE_SAMPLES", "40"))
    CHANNEL_COUNTS = ENV.fetch("BENCH_SCALE_CHANNELS", "1000,10000,50000").split(",").map { |n| Integer(n) }
    NOTIFIES = Integer(ENV.fetch("BENCH_SCALE_NOTIFIES", "20000"))
    SPLIT = 8 # workers sharing the channels in (b)/(c)
    RELISTEN_BATCHES = [1, 100, 500, 5000].freeze
    CHURN_WORKERS = 32
    CHURN_RATE = Integer(ENV.fetch("BENCH_SCALE_CHURN_RATE", "1000")) # subs/s over all workers
    CHURN_SECONDS = Integer(ENV.fetch("BENCH_SCALE_CHURN_SECONDS", "30"))
    MODES = %w[direct native-hub].freeze

    module_function

    # A private cluster of one release for the length of a block; its
    # postmaster's lifetime is that of a shell (on the host or in bin/chroot)
    # that stops it when the benchmark closes its stdin.
    class Server
      SUITES = { "17" => "trixie", "18" => "sid", "19" => "sid" }.freeze

      attr_reader :url, :version

      def self.open(release)
        Dir.mktmpdir("pgbus-bench-pg#{release}") do |dir|
          server = new(release, dir)
          begin
            yield server
          ensure
            server.close
          end
        end
      end

      def initialize(release, dir)
        bin = "/usr/lib/postgresql/#{release}/bin"
        chroot = File.executable?(File.join(bin, "postgres")) ? [] : [File.join(ROOT, "bin", "chroot"), SUITES.fetch(release)]
        port = 56_000 + rand(4000)
        data = File.join(dir, "data")
        script = <<~SH
          set -eu
          chown postgres #{dir}
          as_pg() { runuser -u postgres -- "$@"; }
          as_pg #{bin}/initdb -D #{data} -A trust -U root -E UTF8 --no-sync >#{dir}/initdb.log
          printf '%s\\n' "listen_addresses = '127.0.0.1'" "port = #{port}" "unix_socket_directories = '#{dir}'" \\
            "max_connections = 700" "fsync = off" "shared_buffers = 128MB" >>#{data}/postgresql.conf
          as_pg #{bin}/pg_ctl -D #{data} -l #{dir}/server.log -w -t 60 start >/dev/null
          echo ready
          cat >/dev/null
          as_pg #{bin}/pg_ctl -D #{data} -m immediate -w stop >/dev/null
        SH
        @io = IO.popen({ "PGBUS_HUB_CHROOT_BIND" => dir }, [*chroot, "bash", "-c", script], "r+")
        until (line = @io.gets).nil? || line.strip == "ready"; end
        raise "PostgreSQL #{release} did not start (#{dir}/server.log)" if line.nil?

        @url = "host=127.0.0.1 port=#{port} dbname=postgres user=root sslmode=disable"
        @conn = PG.connect(@url)
        @version = @conn.exec("show server_version").getvalue(0, 0)
      end

      def exec(...) = @conn.exec(...)
      def exec_params(...) = @conn.exec_params(...)
      def escape_literal(...) = @conn.escape_literal(...)

      # Backend pids of the connections that LISTEN (application_name pgbus-listen).
      def listen_backends
        exec("select pid from pg_stat_activity where application_name = 'pgbus-listen'").column_values(0).map(&:to_i)
      end

      def close
        @conn&.close
        @io.close_write
        @io.read
        @io.close
      end
    end

    def run
      RELEASES.to_h do |release|
        Server.open(release) do |server|
          Bench.log("scale: PostgreSQL #{server.version}")
          figures = { fan256: -> { fan256(server) }, channels: -> { channels(server) },
                      relisten_batches: -> { relisten_batches(server) }, churn: -> { churn(server) } }
          [release, figures.transform_values { |figure| attempt(figure) }.merge(version: server.version)]
        end
      end
    end

    # A figure that fails is reported as its error; the others still run.
    def attempt(figure)
      figure.call
    rescue StandardError => e
      Bench.log("scale: #{e.class}: #{e.message}")
      { error: "#{e.class}: #{e.message}" }
    end

    # (a) Per probe, the latency of the last of the workers to have it.
    def fan256(server)
      MODES.to_h do |mode|
        Bench.with_setup(mode, FAN_WORKERS, %w[fan], url: server.url) do |_hub, workers|
          sleep 0.5
          Bench.mark(workers, "fan")
          Bench.send_probes("fan", FAN_SAMPLES, gap: 0.05, via: server)
          res = Bench.collect(workers, FAN_SAMPLES, timeout: 30, idle: 3)
          complete = res.map { |r| r[:lat_us] }.select { |lats| lats.size == FAN_SAMPLES }
          last = complete.empty? ? [] : complete.transpose.map(&:max)
          missing = FAN_WORKERS * FAN_SAMPLES - res.sum { |r| r[:lat_us].size }
          [mode, Bench.lat_summary(last).merge(missing: missing, census: server.listen_backends.size)]
        end
      end
    end

    # (b) and, for the hub at >= 10k channels, (c) in the same setup.
    def channels(server)
      CHANNEL_COUNTS.to_h do |total|
        per_worker = total / SPLIT
        cells = MODES.to_h do |mode|
          Bench.with_setup(mode, SPLIT, [], url: server.url) do |hub, workers|
            workers.each { |w| w.send_only("subn c#{w.pid}_ #{per_worker}") }
            subscribe_s = workers.map { |w| JSON.parse(w.read)["seconds"] }.max
            cell = throughput(server, workers, per_worker).merge(subscribe_s: subscribe_s.round(2))
            cell[:relisten] = relisten(server, hub, workers, per_worker) if hub && total >= 10_000
            [mode, cell]
          end
        end
        [total, cells]
      end
    end

    # NOTIFIES notifications (payload "x"), 500 per transaction, round-robin
    # over every worker's channels (so no two in a transaction are alike).
    def throughput(server, workers, per_worker)
      channels = workers.flat_map { |w| Array.new(per_worker) { |j| CHAN["c#{w.pid}_#{j}"] } }
      order = Array.new(NOTIFIES) { |k| channels[(k % SPLIT * per_worker) + (k / SPLIT % per_worker)] }
      backends = server.listen_backends
      Bench.mark(workers, "*")
      cpu0 = backends.sum { |pid| Bench.schedstat_ms(pid) }
      t0 = Bench.now_ns
      order.each_slice(500) do |slice|
        server.exec_params("SELECT pg_notify(c, 'x') FROM unnest($1::text[]) AS c", [PG::TextEncoder::Array.new.encode(slice)])
      end
      sent_s = (Bench.now_ns - t0) / 1e9
      res = Bench.collect(workers, NOTIFIES / SPLIT, kind: "all", timeout: 120, idle: 5)
      cpu = backends.sum { |pid| Bench.schedstat_ms(pid) } - cpu0
      delivered = res.sum { |r| r[:n] }
      last = res.filter_map { |r| r[:last_ns] }.max || Bench.now_ns
      { backends: backends.size, sent: NOTIFIES, delivered: delivered, sent_s: sent_s.round(3),
        received_per_s: (delivered / ((last - t0) / 1e9)).round, backend_cpu_ms_per_10k: (cpu * 10_000.0 / NOTIFIES).round(1) }
    end

    # (c) pg_terminate_backend on the hub's connection; the hub reconnects at
    # once (its first retry is immediate). Timed: until its LISTEN set is live
    # again (stats: reconnected and healthy), and until every worker has its
    # catch-up wakes; meanwhile 20 stamped wakes on a live queue.
    def relisten(server, hub, workers, per_worker)
      before = hub.stats
      Bench.mark(workers, "*")
      t0 = Bench.now_ns
      server.exec("select pg_terminate_backend(#{Integer(before.fetch('backend_pid'))})")
      relisten_s = nil
      deadline = t0 + 120e9
      until relisten_s || Bench.now_ns > deadline
        stats = hub.stats
        relisten_s = (Bench.now_ns - t0) / 1e9 if stats["reconnects"] > before["reconnects"] && stats["listener_healthy"]
        sleep 0.002
      end
      live_queue = "c#{workers.first.pid}_0"
      Bench.send_probes(live_queue, 20, gap: 0.005, via: server)
      workers.each_with_index { |w, i| w.send_only("wait #{per_worker + (i.zero? ? 20 : 0)} 120 5 all") }
      res = workers.map { |w| JSON.parse(w.read, symbolize_names: true) }
      last = res.filter_map { |r| r[:last_ns] }.max || Bench.now_ns
      { relisten_s: relisten_s&.round(3), catch_up_wakes: res.sum { |r| r[:n] } - 20,
        catch_up_done_s: ((last - t0) / 1e9).round(3), live_wake_during_catch_up: Bench.lat_summary(res.first[:lat_us]) }
    end

    # One fresh connection LISTENing N channels, B statements per simple query.
    def relisten_batches(server)
      CHANNEL_COUNTS.select { |n| n >= 10_000 }.to_h do |total|
        [total, RELISTEN_BATCHES.to_h do |batch|
          conn = PG.connect(server.url)
          t0 = Bench.now_ns
          Array.new(total) { |i| %(LISTEN "batch_#{i}";) }.each_slice(batch) { |slice| conn.exec(slice.join) }
          seconds = (Bench.now_ns - t0) / 1e9
          conn.close
          [batch, seconds.round(3)]
        end]
      end
    end

    # (d) Acks while CHURN_WORKERS workers subscribe and unsubscribe new channels.
    def churn(server)
      Bench.with_setup("native-hub", CHURN_WORKERS, %w[churn_hold], url: server.url) do |hub, workers|
        backend = server.listen_backends
        hub0 = Bench.schedstat_ms(hub.pid)
        pg0 = backend.sum { |pid| Bench.schedstat_ms(pid) }
        workers.each { |w| w.send_only("churn #{CHURN_RATE.to_f / CHURN_WORKERS} #{CHURN_SECONDS}") }
        samples = workers.flat_map { |w| JSON.parse(w.read(CHURN_SECONDS + TIMEOUT)) }
        hub_cpu = Bench.schedstat_ms(hub.pid) - hub0
        pg_cpu = backend.sum { |pid| Bench.schedstat_ms(pid) } - pg0
        Bench.unconfirmed[:churn] += samples.count(nil)
        acked = samples.compact
        Bench.lat_summary(acked.map { |ms| ms * 1000.0 }).merge(
          subs_per_s: (acked.size / CHURN_SECONDS.to_f).round, hub_cpu_pct: (hub_cpu / (CHURN_SECONDS * 10.0)).round(1),
          backend_cpu_pct: (pg_cpu / (CHURN_SECONDS * 10.0)).round(1), census: server.listen_backends.size,
          unconfirmed: samples.count(nil)
        )
      end
    end

    def ratio(value, base) = value && base&.positive? ? format("%.2fx", value / base) : "-"

    def rows(scale, add)
      scale.each do |release, r|
        pg = "PG #{r[:version][/^[\d.]+(rc\d+)?/]}"
        r.each do |figure, value|
          add.call("S #{pg}: #{figure}", "-", value[:error], "", false) if value.is_a?(Hash) && value[:error]
        end
        r = r.reject { |_, value| value.is_a?(Hash) && value[:error] }
        direct = r.dig(:fan256, "direct")
        r.fetch(:fan256, {}).each do |mode, s|
          add.call("S(a) #{pg}: 1 NOTIFY -> last of #{FAN_WORKERS}w", mode,
                   "#{Bench.lat_cell(s)}, missing #{s[:missing]}, census #{s[:census]}" \
                   "#{mode == 'direct' ? '' : " = #{ratio(s[:p50_ms], direct[:p50_ms])} direct (p50)"}")
        end
        r.fetch(:channels, {}).each do |total, cells|
          base = cells["direct"]
          cells.each do |mode, c|
            add.call("S(b) #{pg}: #{total} channels, NOTIFY/s received", mode,
                     "#{c[:received_per_s]}/s (#{c[:delivered]}/#{c[:sent]}; #{c[:backends]} backend(s) " \
                     "#{c[:backend_cpu_ms_per_10k]} ms CPU per 10k; subscribed in #{c[:subscribe_s]} s)" \
                     "#{mode == 'direct' ? '' : " = #{ratio(c[:received_per_s].to_f, base[:received_per_s])} direct"}")
            next unless (rl = c[:relisten])

            add.call("S(c) #{pg}: re-LISTEN #{total} after pg_terminate_backend", mode,
                     "#{rl[:relisten_s]} s; #{rl[:catch_up_wakes]} catch-up wakes delivered by #{rl[:catch_up_done_s]} s; " \
                     "a live wake meanwhile #{Bench.lat_cell(rl[:live_wake_during_catch_up])}")
          end
        end
        r.fetch(:relisten_batches, {}).each do |total, by_batch|
          add.call("S(c) #{pg}: one connection LISTENs #{total}", "ruby-pg",
                   by_batch.map { |batch, s| "#{s} s in batches of #{batch}" }.join(", "))
        end
        next unless (c = r[:churn])

        add.call("S(d) #{pg}: #{CHURN_WORKERS}w churn #{CHURN_RATE} subs/s, #{CHURN_SECONDS} s", "native-hub",
                 "ack #{Bench.lat_cell(c)}; #{c[:subs_per_s]} subs/s done; hub CPU #{c[:hub_cpu_pct]}%, " \
                 "backend CPU #{c[:backend_cpu_pct]}%; census #{c[:census]}")
      end
    end
  end
end
