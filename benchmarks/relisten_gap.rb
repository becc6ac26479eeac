# frozen_string_literal: true

# The re-LISTEN gap (the `gap` key of `rake bench`'s JSON; docs/soak.md "The
# re-LISTEN gap"): NOTIFYs committed between a LISTEN backend's end and its
# successor's LISTEN commit reach nobody (PostgreSQL skips, for a new
# listener, what was committed before it LISTENed). Measured as notifications
# lost at a known rate: a publisher process NOTIFYs numbered payloads every
# GAP_TICK_MS on its own connection (no proxy), two listener processes take
# them, and each listener's LISTEN backend is pg_terminate_backend'ed
# GAP_TERMINATIONS times, in turns:
#
#   plain            ruby-pg: connect, LISTEN, wait_for_notify; on an error
#                    connect again at once and LISTEN (what Rails' postgresql
#                    adapter and any plain client do): the baseline
#   native-listener  Pgbus::Hub::Listener (the engine every hub runs)
#
# Numbers missing per termination at the publisher's measured rate = ms of
# gap; judged as the native listener's median over the plain client's, both
# from the same run (the median: on a shared machine one reconnect in forty
# can wait tens of ms for a CPU, whoever makes it).
#
# Env: GAP_TERMINATIONS (per listener, default 40), GAP_TICK_MS (default 1).
module Bench
  module RelistenGap
    TERMINATIONS = Integer(ENV.fetch("GAP_TERMINATIONS", "40"))
    TICK = Float(ENV.fetch("GAP_TICK_MS", "1")) / 1000
    SETTLE = 0.3 # s after a termination before the next one: a reconnect takes milliseconds
    MODES = %w[plain native-listener].freeze

    # A dispatch queue keeping each wake's payload as a number.
    class Numbers
      def initialize(got) = @got = got

      def <<(wake)
        @got << Integer(wake.payload)
        self
      end
      alias push <<
    end

    module_function

    TAG = Process.pid # the benchmark's, shared by its children

    def channel = "pgbus_bench_gap_#{TAG}"
    def application_name(mode) = "pgbus-bench-gap-#{mode}-#{TAG}"
    def with_name(mode) = "#{URL} application_name=#{application_name(mode)}"

    # A child process; `body` gets its control pipe's read end and its output's write end.
    def child(&body)
      ctl_r, ctl = IO.pipe
      out, out_w = IO.pipe
      pid = fork do
        ctl.close
        out.close
        body.call(ctl_r, out_w)
        exit!(0)
      end
      ctl_r.close
      out_w.close
      { pid: pid, ctl: ctl, out: out }
    end

    def answer(proc_, timeout = TIMEOUT)
      raise "gap: child #{proc_[:pid]} gave no answer within #{timeout}s" unless proc_[:out].wait_readable(timeout)

      proc_[:out].gets or raise "gap: child #{proc_[:pid]} exited"
    end

    def reap(proc_)
      [proc_[:ctl], proc_[:out]].each { |io| io.close unless io.closed? }
      Process.kill("KILL", proc_[:pid])
      Process.wait(proc_[:pid])
    rescue Errno::ESRCH, Errno::ECHILD
      nil
    end

    # Writes "ready" once it LISTENs, then the numbers it got (JSON) when its control pipe says stop.
    def listener(mode)
      child do |ctl, out|
        got = []
        if mode == "plain"
          plain(with_name(mode), got, ctl, out)
        else
          hub = Pgbus::Hub::Listener.new(connection: with_name(mode), dispatch_queue: Numbers.new(got)).start
          raise "native listener: LISTEN not confirmed" unless hub.ensure_listening("\0#{channel}") == :done

          out.puts "ready"
          ctl.gets
          hub.stop
        end
        sleep 0.2 # the pump's last batch
        out.puts JSON.generate(got)
      end
    end

    def plain(url, got, ctl, out)
      stop = false
      Thread.new do
        ctl.gets
        stop = true
      end
      ready = false
      until stop
        begin
          conn = PG.connect(url)
          conn.exec("LISTEN #{channel}")
          unless ready
            out.puts "ready"
            ready = true
          end
          conn.wait_for_notify(0.1) { |_, _, payload| got << Integer(payload) } until stop
        rescue PG::Error
          nil # connect again at once
        ensure
          conn&.close unless conn&.finished?
        end
      end
    end

    # NOTIFYs `n` every TICK (its own connection, commits without fsync: the
    # rate is the clock's, not the disk's); on stop, "count seconds".
    def publisher
      child do |ctl, out|
        conn = PG.connect(URL)
        conn.exec("SET synchronous_commit = off")
        t0 = Bench.now_ns
        n = 0
        until ctl.wait_readable(0)
          conn.exec("NOTIFY #{channel}, '#{n}'")
          n += 1
          pause = t0 + (n * TICK * 1e9) - Bench.now_ns
          sleep(pause / 1e9) if pause.positive?
        end
        out.puts "#{n} #{(Bench.now_ns - t0) / 1e9}"
      end
    end

    # The pid of the one backend named for `mode`, once it is not `old` (waits for the reconnect).
    def backend(mode, old = nil)
      deadline = Bench.now_ns + (TIMEOUT * 1e9)
      loop do
        pids = Bench.conn.exec_params("SELECT pid FROM pg_stat_activity WHERE application_name = $1",
                                      [application_name(mode)]).column_values(0).map(&:to_i)
        return pids.first if pids.size == 1 && pids.first != old
        raise "gap: no backend for #{mode} (#{pids.inspect})" if Bench.now_ns > deadline

        sleep 0.01
      end
    end

    # Missing numbers between the first and the last it got, as runs (one per lost window).
    def runs(got)
      sorted = got.uniq.sort
      sorted.each_cons(2).filter_map { |a, b| b - a - 1 if b - a > 1 }
    end

    def run
      listeners = MODES.to_h { |mode| [mode, listener(mode)] }
      listeners.each_value { |l| answer(l) }
      pub = publisher
      sleep 0.5
      pids = MODES.to_h { |mode| [mode, backend(mode)] }
      TERMINATIONS.times do |round|
        MODES.rotate(round).each do |mode|
          Bench.conn.exec_params("SELECT pg_terminate_backend($1)", [pids[mode]])
          sleep SETTLE
          pids[mode] = backend(mode, pids[mode])
        end
      end
      sleep SETTLE
      pub[:ctl].puts "stop"
      sent, seconds = answer(pub).split.then { |n, s| [Integer(n), Float(s)] }
      reap(pub)
      sleep 0.2
      per_ms = sent / (seconds * 1000)
      out = { sent: sent, per_ms: per_ms.round(3), terminations: TERMINATIONS }
      listeners.each do |mode, l|
        l[:ctl].puts "stop"
        got = JSON.parse(answer(l))
        reap(l)
        lost = runs(got)
        # A termination that lost nothing left no window: it counts as 0.
        per_termination = lost + Array.new([TERMINATIONS - lost.size, 0].max, 0)
        total = lost.sum + (sent - 1 - got.max.to_i) # a loss at the very end counts too
        out[mode] = { received: got.uniq.size, windows: lost.size, lost: total, lost_runs: lost.sort,
                      median: Bench.pct(per_termination, 50), mean: (total.to_f / TERMINATIONS).round(2),
                      median_ms: (Bench.pct(per_termination, 50) / per_ms).round(1) }
      end
      plain = out["plain"][:median]
      out[:ratio] = plain.zero? ? nil : (out["native-listener"][:median].to_f / plain).round(2)
      out
    ensure
      [*listeners&.values, pub].compact.each { |p| reap(p) }
    end

    def rows(gap, add)
      MODES.each do |mode|
        g = gap[mode]
        add.call("6 re-LISTEN gap: NOTIFYs lost per backend termination", mode,
                 "median #{g[:median]} at #{gap[:per_ms]}/ms = #{g[:median_ms]} ms, mean #{g[:mean]} " \
                 "(#{g[:lost]} lost in #{g[:windows]} windows, #{gap[:terminations]} terminations)" \
                 "#{mode == 'plain' || gap[:ratio].nil? ? '' : format(' = %.2fx plain', gap[:ratio])}",
                 mode == "plain" ? "" : "median <= 1.0x plain", mode == "plain" || gap[:ratio].nil? ? nil : gap[:ratio] <= 1.0)
      end
    end
  end
end
