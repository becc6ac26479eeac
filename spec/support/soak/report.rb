# frozen_string_literal: true

module Soak
  # Accounts for every message at every client, per fault window (from the
  # fault to the next one; the first also from the start), and prints both
  # adapters side by side.
  class Report
    IN_FLIGHT = 0.25
    def initialize(apps, pubs:, fires:, samples:, snapshots:, t0:, finish:, stop_times:, publish_errors:, settings:)
      @apps = apps
      @pubs = pubs
      @fires = fires
      @samples = samples
      @snapshots = snapshots
      @t0 = t0
      @finish = finish
      @stop_times = stop_times
      @publish_errors = publish_errors
      @settings = settings
      # A message published just before a fault is still in flight at it: it counts for that fault.
      @starts = fires.map { |f| f[:at] - IN_FLIGHT }
      @starts[0] = t0 unless @starts.empty?
    end

    def build
      windows = @fires.each_with_index.map do |fire, i|
        { fault: fire[:name], at: (fire[:at] - @t0).round(1), detail: fire[:detail], took: fire[:took], apps: {} }
      end
      @apps.each do |app|
        messages = messages(app)
        windows.each_with_index do |window, i|
          window[:apps][app.adapter] = messages[i].merge(census(app, i)).merge(processes(app, i))
        end
      end
      { settings: @settings.to_h, duration_s: (@finish - @t0).round(1), windows: windows,
        totals: @apps.to_h { |app| [app.adapter, totals(app, windows)] } }
    end

    # Which window a time falls in (nil: outside the measured span).
    def window_of(at)
      return nil if at < @t0 || at >= @finish

      (@starts.bsearch_index { |s| s > at } || @starts.size) - 1
    end

    def messages(app)
      pubs = (@pubs[app.adapter] || {}).select { |_, (t, _)| window_of(t) }
      per = Array.new(@fires.size) do
        { published: 0, lost_connected: Hash.new(0), lost_disconnected: 0, duplicates: Hash.new(0),
          out_of_order: Hash.new(0), lost_examples: [], lost_span: [], latencies: [] }
      end
      pubs.each_value { |t, _| per[window_of(t)][:published] += 1 }
      app.clients.each do |client|
        kind = client.name[%r{/(cable|stream)}, 1]
        arrivals = client.arrivals
        counts = Hash.new(0)
        max_seen = {}
        arrivals.each do |seq, at, session|
          pub = pubs[seq] or next
          w = per[window_of(pub[0])]
          counts[seq] += 1
          w[:duplicates][kind] += 1 if counts[seq] > 1
          w[:out_of_order][kind] += 1 if max_seen[session] && seq < max_seen[session]
          max_seen[session] = [max_seen[session] || 0, seq].max
          w[:latencies] << at - pub[0]
        end
        sessions = client.sessions
        pubs.each do |seq, (t, committed)|
          next if counts.key?(seq)

          w = per[window_of(t)]
          connected = sessions.find { |s| s.confirmed_at <= t && (s.ended_at.nil? || committed + GRACE <= s.ended_at) }
          if connected
            w[:lost_connected][kind] += 1
            if w[:lost_examples].size < 5
              index = sessions.index(connected)
              got = arrivals.select { |_, _, session| session == index }.map(&:first)
              neighbours = [got.select { |g| g < seq }.max, got.select { |g| g > seq }.min]
              w[:lost_examples] << [client.name, seq, connected.pid, t, connected.confirmed_at, neighbours]
            end
            w[:lost_span] = [[w[:lost_span][0], t].compact.min, [w[:lost_span][1], t].compact.max]
          else
            # In flight when the client's connection ended: counted where that disconnect happened.
            cut = sessions.find { |s| s.confirmed_at <= t && s.ended_at && s.ended_at >= t }
            per[(cut && window_of(cut.ended_at)) || window_of(t)][:lost_disconnected] += 1
          end
        end
      end
      per.each_with_index.map do |w, i|
        lat = w.delete(:latencies).sort
        # With each: when its session was confirmed (after the fault) and the seqs it got either side.
        w[:lost_examples].map! do |name, seq, pid, t, confirmed, neighbours|
          { client: name, seq: seq, worker: pid, after_fault_s: (t - @fires[i][:at]).round(2),
            confirmed_after_fault_s: (confirmed - @fires[i][:at]).round(3), got_either_side: neighbours }
        end
        span = w[:lost_span].map { |t| (t - @fires[i][:at]).round(2) }
        w.merge(lost_connected: w[:lost_connected].to_h, duplicates: w[:duplicates].to_h, out_of_order: w[:out_of_order].to_h,
                lost_span_s: span, latency_ms: { p50: ms(pct(lat, 50)), p99: ms(pct(lat, 99)), max: ms(lat.last) })
      end
    end

    # LISTEN backends of the app's database (the census) around fault i. Settled:
    # the hub's 1 (2 with a standby); for Rails' adapter, at least one per worker serving a
    # client (its listener is built on a worker's first subscription).
    def census(app, i)
      from = @starts[i]
      to = @starts[i + 1] || @finish
      fire = @fires[i][:at]
      counts = @samples.filter_map { |at, apps| [at, apps ? apps[app.adapter].size : 0, apps&.fetch(app.adapter)] if at >= from && at < to }
      before = @samples.select { |at, _| at < fire }.last
      before_pids = before&.last&.fetch(app.adapter, []) || []
      after_fire = counts.select { |at, _, _| at >= fire }
      sessions = app.clients.flat_map(&:sessions)
      settled = lambda do |at, n|
        next n == app.listen_connections if app.hub?

        n >= sessions.select { |s| s.confirmed_at <= at && (s.ended_at.nil? || s.ended_at > at) }.map(&:pid).uniq.size
      end
      off = after_fire.reject { |at, n, _| settled.call(at, n) }
      settle = if after_fire.empty? || !settled.call(*after_fire.last[0, 2]) then nil
               elsif off.empty? then 0.0
               else (off.last[0] + SAMPLE_SECONDS - fire).round(2)
               end
      longest = 0.0
      run_start = nil
      after_fire.each do |at, n, _|
        if n.zero?
          run_start ||= at
          longest = [longest, at - run_start + SAMPLE_SECONDS].max
        else
          run_start = nil
        end
      end
      new_backends = counts.flat_map { |_, _, pids| pids || [] }.uniq - before_pids
      changes = after_fire.chunk_while { |a, b| a[1] == b[1] }.map { |run| [(run[0][0] - fire).round(1), run[0][1]] }
      { census: { before: before && (before[1] ? before_pids.size : 0), peak: counts.map { |c| c[1] }.max,
                  after: counts.last&.[](1), expected: app.hub? ? app.listen_connections.to_s : "1/serving worker", settle_s: settle,
                  changes: changes.first(20) },
        no_listen_max_s: longest.round(2), new_listen_backends: new_backends.size }
    end

    def processes(app, i)
      before = @snapshots[i][:apps][app.adapter]
      after = @snapshots[i + 1][:apps][app.adapter]
      stat = ->(s, key) { s && (s[:stats] || {}).transform_keys(&:to_s)[key] }
      was = stat.call(before, "reconnects")
      now = stat.call(after, "reconnects")
      # A hot restart (USR2) replaces the hub in the same pid: its counters start again.
      new_hub = app.hub? && stat.call(before, "uptime").to_f > stat.call(after, "uptime").to_f
      reconnects = now && was && (new_hub ? now : now - was)
      # Serving connections lost while a standby stood by (SOAK_STANDBY): it served on.
      promoted = [stat.call(before, "standby_promotions"), stat.call(after, "standby_promotions")]
      promotions = (new_hub ? promoted[1] : promoted[1] - promoted[0]) if promoted.all?
      { reconnects: app.hub? ? reconnects : nil, new_hub: new_hub, standby_promotions: promotions,
        worker_restarts: (after[:workers] - before[:workers]).size,
        rss_max_mb: [before, after].map { |s| ((s[:procs].map { |p| p[1] }.max || 0) / 1024.0).round(1) },
        fds_total: [before, after].map { |s| s[:procs].sum { |p| p[2] } } }
    end

    def totals(app, windows)
      rows = windows.map { |w| w[:apps][app.adapter] }
      { published: rows.sum { |r| r[:published] }, clients: app.clients.size,
        lost_connected: rows.sum { |r| r[:lost_connected].values.sum }, lost_disconnected: rows.sum { |r| r[:lost_disconnected] },
        duplicates: rows.sum { |r| r[:duplicates].values.sum }, out_of_order: rows.sum { |r| r[:out_of_order].values.sum },
        publish_errors: @publish_errors[app.adapter], reconnects_by_client: app.clients.sum { |c| [c.sessions.size - 1, 0].max },
        rss_max_mb: [rows.first[:rss_max_mb][0], rows.last[:rss_max_mb][1]],
        fds_total: [rows.first[:fds_total][0], rows.last[:fds_total][1]],
        stop_s: @stop_times.dig(app.adapter, 0), stopped_cleanly: @stop_times.dig(app.adapter, 1) }
    end

    def pct(sorted, p) = sorted.empty? ? nil : sorted[[(sorted.size * p / 100.0).ceil - 1, 0].max]
    def ms(seconds) = seconds && (seconds * 1000).round(1)

    # --- printing ---

    def self.split(counts) = counts.empty? ? "0" : "#{counts.values.sum} (#{counts.map { |k, v| "#{k} #{v}" }.join(', ')})"

    def self.cell(m)
      split = split(m[:lost_connected])
      split += " at +#{m[:lost_span_s].join('..')} s" unless m[:lost_span_s].empty?
      c = m[:census]
      settle = c[:settle_s].nil? ? "not settled" : "#{c[:settle_s]} s"
      {
        "published" => m[:published].to_s,
        "lost while connected" => split,
        "lost in own disconnect" => m[:lost_disconnected].to_s,
        "duplicates" => split(m[:duplicates]),
        "out of order" => split(m[:out_of_order]),
        "census before/peak/after" => "#{c[:before]}/#{c[:peak]}/#{c[:after]}",
        "census settled after" => settle,
        "census after the fault" => c[:changes].size > 1 ? c[:changes].map { |at, n| "#{n}@+#{at}" }.join(" ") : "-",
        "longest without LISTEN" => "#{m[:no_listen_max_s]} s",
        "new LISTEN backends" => m[:new_listen_backends].to_s,
        "hub reconnects" => m[:reconnects].nil? ? "-" : "#{m[:reconnects]}#{m[:new_hub] ? ' (a new hub)' : ''}",
        "standby promotions" => m[:standby_promotions].nil? ? "-" : m[:standby_promotions].to_s,
        "worker restarts" => m[:worker_restarts].to_s,
        "latency p50/p99/max ms" => m[:latency_ms].values.map { |v| v || "-" }.join("/"),
        "worker RSS max MB" => m[:rss_max_mb].join(" -> "),
        "worker fds total" => m[:fds_total].join(" -> ")
      }
    end

    def self.print(data, out)
      adapters = data[:totals].keys
      out.puts "", "=== soak: #{data[:windows].size} faults, #{data[:duration_s]} s, #{data[:settings][:rate]} msg/s, " \
               "#{data[:settings][:clients]} WebSocket (+ #{data[:settings][:clients]} streaming HTTP on pgbus_hub) clients per app, " \
               "hub: #{data[:settings][:hub] == 'serve' ? 'pgbus-hub serve (a sidecar)' : 'in the Puma master'}" \
               "#{', with a standby LISTEN connection' if data[:settings][:standby]} ==="
      data[:windows].each_with_index do |w, i|
        out.puts "", format("%-2d %-16s at +%.1f s (%s)", i + 1, w[:fault], w[:at], JSON.generate(w[:detail]))
        cells = adapters.to_h { |a| [a, cell(w[:apps][a])] }
        out.puts format("   %-26s %s", "", adapters.map { |a| a.ljust(40) }.join)
        cells[adapters.first].each_key do |label|
          out.puts format("   %-26s %s", label, adapters.map { |a| "#{cells[a][label]} ".ljust(40) }.join)
        end
        adapters.each do |a|
          ex = w[:apps][a][:lost_examples]
          out.puts "   #{a} lost while connected, e.g.: #{JSON.generate(ex)}" unless ex.empty?
        end
      end
      out.puts "", "totals:"
      data[:totals].each { |a, t| out.puts "   #{a}: #{JSON.generate(t)}" }
      out.puts "", markdown(data)
    end

    # The docs' table: one row per fault, "pgbus_hub / postgresql" in each cell.
    def self.markdown(data)
      adapters = data[:totals].keys
      both = ->(w, &f) { adapters.map { |a| f.call(w[:apps][a]) }.join(" / ") }
      lines = ["| # | fault | lost while connected | lost in own disconnect | dup / ooo | census before/peak/after | " \
               "settled | longest no LISTEN | hub reconnects | worker restarts | p99 ms |",
               "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
      data[:windows].each_with_index do |w, i|
        lines << "| #{i + 1} | #{w[:fault]} | #{both.call(w) { |m| m[:lost_connected].values.sum }} | " \
                 "#{both.call(w) { |m| m[:lost_disconnected] }} | #{both.call(w) { |m| "#{m[:duplicates].values.sum}/#{m[:out_of_order].values.sum}" }} | " \
                 "#{both.call(w) { |m| m[:census].values_at(:before, :peak, :after).join('/') }} | " \
                 "#{both.call(w) { |m| m[:census][:settle_s].nil? ? 'no' : "#{m[:census][:settle_s]} s" }} | " \
                 "#{both.call(w) { |m| "#{m[:no_listen_max_s]} s" }} | #{both.call(w) { |m| m[:reconnects] || '-' }} | " \
                 "#{both.call(w) { |m| m[:worker_restarts] }} | #{both.call(w) { |m| m[:latency_ms][:p99] || '-' }} |"
      end
      lines.join("\n")
    end
  end
end
