# frozen_string_literal: true

require "json"
require "fileutils"
require "securerandom"
require "set"
require_relative "../soak/runner"
require_relative "cluster"
require_relative "pgbus_sse"

# `rake stops N=40` (issue 49, docs/deploys.md): graceful stops of a 4-worker Puma serving the
# soak's Rails app (spec/support/soak: ActionCable + streaming HTTP, clients attached, messages
# flowing), beside the same app on Rails' postgresql adapter. Per cycle and app: boot
# (preload_app!), SIGUSR2 (hot restart), then SIGTERM; then, on a cluster without preload_app!,
# N SIGUSR1 (phased restarts) and its TERM. A worker alive LINGER seconds after its stop is dumped.
module Stops
  KINDS = %w[term usr2 usr1].freeze
  LINGER = 5.0 # a worker alive this long after its stop is dumped and counted
  FLOW = 2.0 # seconds of messages before and after each restart
  GONE_DEADLINE = 45 # Puma kills a stuck worker at 30 s (worker_shutdown_timeout)

  ADAPTERS = %w[pgbus_hub postgresql].freeze # the gem's app, the control

  # apps: which of ADAPTERS run, at the same time (PGBUS_STOPS_APPS; CONTROL=0 is pgbus_hub alone).
  # pgbus_libs: real pgbus's lib dirs (PGBUS_HUB_REAL_PGBUS_LIBS): pgbus's SSE streams (pgbus_sse.rb).
  # puma_dir: the Puma checkout run instead of the installed Puma (PGBUS_HUB_PUMA_DIR, Cluster::PUMA_DIR).
  Settings = Struct.new(:cycles, :kinds, :rate, :clients, :apps, :pgbus_libs, :puma_dir, :report, :dumps, keyword_init: true) do
    def self.from_env(env = ENV)
      kinds = env.fetch("PGBUS_STOPS_KINDS", KINDS.join(",")).split(",").map(&:strip).reject(&:empty?)
      unknown = kinds - KINDS
      raise ArgumentError, "unknown stop kind(s) #{unknown.join(', ')} (known: #{KINDS.join(', ')})" unless unknown.empty?

      apps = env.fetch("PGBUS_STOPS_APPS", env["PGBUS_STOPS_CONTROL"] == "0" ? "pgbus_hub" : ADAPTERS.join(","))
                .split(",").map(&:strip).reject(&:empty?)
      unknown = apps - ADAPTERS
      raise ArgumentError, "unknown app(s) #{unknown.join(', ')} (known: #{ADAPTERS.join(', ')})" if unknown.any? || apps.empty?

      new(cycles: Integer(env.fetch("PGBUS_STOPS_N", "40")), kinds: kinds, rate: Float(env.fetch("PGBUS_STOPS_RATE", "10")),
          clients: Integer(env.fetch("PGBUS_STOPS_CLIENTS", "16")), apps: apps, pgbus_libs: PgbusSse.libs(env),
          puma_dir: Cluster::PUMA_DIR,
          report: env["PGBUS_STOPS_REPORT"],
          dumps: env.fetch("PGBUS_STOPS_DUMPS") { File.join(PumaCluster::ROOT, "tmp", "stops-#{Time.now.utc.strftime('%Y%m%d-%H%M%S')}") })
    end
  end

  # One stop's figures: kind, when (s after the run began), each old worker's end (s after its
  # stop), the ones that lingered (> LINGER s) with their dump files; served_s: when every
  # client was subscribed again (USR2: on a new worker; USR1: the longest client's gap).
  # served_by_kind / missed_per_client: the same per client kind (cable, stream), per client.
  # killed: old workers that never ran their at_exit (puma.rb marks it): the master SIGKILLed them.
  # ended_by_plugin: old workers whose server thread the plugin's stop watch ended, stuck in IO#close
  # (its WARN line in Puma's log; Pgbus::Hub::PumaPlugin::StuckClose): Puma's stop wedge, worked around.
  # steps: a hot restart's timeline (AppStops#hot_restart_steps); load: the host's 1-minute load
  # average at the stop (/proc/loadavg: other work on the host shows in the figures).
  Stop = Struct.new(:kind, :at, :workers_gone_s, :master_gone_s, :served_s, :served_by_kind, :lingered, :killed, :ended_by_plugin,
                    :missed, :missed_per_client, :lost, :lost_by_kind, :detail, :steps, :load, keyword_init: true)

  # The stops of one app (adapter), run in a thread of its own beside the other app's.
  class AppStops
    attr_reader :stops, :adapter

    def initialize(adapter, pg, settings, tag:, t0:, out:)
      @adapter = adapter
      @pg = pg
      @settings = settings
      @tag = tag
      @t0 = t0
      @out = out
      @stops = []
    end

    def run
      @settings.cycles.times { |i| preloaded_cycle(i) } if (@settings.kinds & %w[term usr2]).any?
      phased_cycles if @settings.kinds.include?("usr1")
      @stops
    end

    private

    def log(line) = @out.puts("[stops #{Time.now.utc.strftime('%H:%M:%S')}] #{@adapter}: #{line}")

    # Boot, clients, USR2 (unless only TERM is asked), TERM (unless only USR2 is; then an unmeasured stop).
    def preloaded_cycle(i)
      with_app(preload: true) do |app, publisher|
        if @settings.kinds.include?("usr2")
          usr2 = hot_restart(app)
          sleep FLOW
        end
        publisher.stop
        term = terminate(app) if @settings.kinds.include?("term")
        usr2&.then { |stop| account(stop, app, publisher) }
        [usr2, term].compact.each { |stop| record(stop, "cycle #{i + 1}/#{@settings.cycles}") }
      end
    end

    # One cluster without preload_app!: N phased restarts, then its TERM.
    def phased_cycles
      with_app(preload: false) do |app, publisher|
        phased = Array.new(@settings.cycles) do |i|
          phased_restart(app).tap do |stop|
            sleep FLOW
            log "usr1 #{i + 1}/#{@settings.cycles}: #{summary(stop)}"
          end
        end
        publisher.stop
        term = terminate(app)
        term.kind = "term (no preload)"
        account(phased, app, publisher)
        phased.each { |stop| @stops << stop }
        record(term, "after #{phased.size} phased restarts")
      end
    end

    def record(stop, where)
      @stops << stop
      log "#{stop.kind} (#{where}): #{summary(stop)}"
    end

    def summary(stop)
      served = stop.served_s ? ", every client served again after #{stop.served_s} s #{stop.served_by_kind.inspect}" : ""
      missed = stop.missed ? ", missed while disconnected #{stop.missed}, lost while connected #{stop.lost}" : ""
      steps = stop.steps ? "; steps (s) #{stop.steps.compact.map { |step, s| "#{step} #{s}" }.join(', ')}" : ""
      plugin = stop.ended_by_plugin.empty? ? "" : " (#{stop.ended_by_plugin.size} ended by the plugin's stop watch)"
      "load #{stop.load}: old workers gone after #{stop.workers_gone_s.max} s#{plugin}#{served}#{missed}#{steps}" \
        "#{stop.lingered.empty? ? '' : " — LINGERED: #{stop.lingered.map { |l| "#{l[:pid]} #{l[:gone_s]} s" }.join(', ')}"}"
    end

    # A Soak::App on Stops::Cluster: booted, every client subscribed, messages flowing.
    def with_app(preload:)
      env = { "PGBUS_STOPS_PRELOAD" => preload ? "1" : "0" }
      app = if @settings.pgbus_libs.empty?
              Soak::App.new(@adapter, @pg, "#{@tag}_#{@adapter}", cluster: Cluster, env: env)
            else
              PgbusSseApp.new(@adapter, @pg, "#{@tag}_#{@adapter}", cluster: Cluster, env: env, libs: @settings.pgbus_libs)
            end
      app.puma.start(wait: false)
      app.puma.wait_for("#{@adapter} to serve /pid", timeout: 90) { app.puma.get("/pid") }
      app.puma.wait_for("4 workers of #{@adapter}", timeout: 90) { app.puma.worker_pids.size == 4 }
      # pgbus's SSE clients are served at their first message: messages flow before they connect.
      sse = !@settings.pgbus_libs.empty?
      start_publisher = -> { (sse ? PgbusSsePublisher : Soak::Publisher).new(@pg, [app], rate: @settings.rate, log: method(:log)).start(Soak.now + 3600) }
      publisher = start_publisher.call if sse
      app.open_clients(@settings.clients, Soak.now + 3600)
      app.puma.wait_for("every #{@adapter} client connected", timeout: 90) { app.clients.all?(&:connected?) }
      publisher ||= start_publisher.call
      sleep FLOW
      yield app, publisher
    ensure
      publisher&.stop
      app&.clients&.each(&:stop)
      app&.puma&.stop if app&.puma&.pid
      app&.puma&.cleanup
      app&.proxy&.close
    end

    def hot_restart(app)
      old = app.puma.worker_pids
      at = Soak.now
      app.puma.signal("USR2")
      probe = Thread.new { first_answer(app, old, at + 90) }
      gone = watch(app, old.to_h { |pid| [pid, at] })
      app.puma.wait_for("4 new workers of #{@adapter}", timeout: 90) { (app.puma.worker_pids - old).size == 4 }
      served = served_again(app, old, at)
      steps = hot_restart_steps(app, old, at).merge(first_request_answered: probe.value&.then { |t| (t - at).round(2) })
      stop("usr2", at, gone, app, served_s: served.values.max, served_by_kind: served, steps: steps)
    end

    # When a new worker first answered a plain request (GET /pid), asked again at once until one
    # does: a request waits in the listen backlog, which the re-exec'd master keeps open.
    def first_answer(app, old, deadline)
      until Soak.now > deadline
        answer = app.puma.get("/pid", timeout: 30)
        return Soak.now if answer && !old.include?(answer["pid"])

        sleep 0.01
      end
    end

    # Where a hot restart's time goes, in s after the USR2 (Cluster marks, spec/support/stops/puma.rb;
    # nil: not reached or not this app's, e.g. no hub in the control): the last client cut off by
    # its old worker's end, the old master's restart hooks and the plugin's teardown (the hub's stop) before its exec, the
    # re-exec'd master reading puma.rb (Ruby and Puma loaded), the app preloaded, the hub started
    # before the first fork, the new workers booting and all serving, then each client's
    # disconnect and its subscription confirmed on a new worker (last of each).
    def hot_restart_steps(app, old, at)
      master = app.puma.marks(app.puma.pid)
      booted = (app.puma.worker_pids - old).filter_map { |pid| app.puma.marks(pid)["booted"] }
      sessions = app.clients.map { |c| [c.sessions.find { |s| old.include?(s.pid) && s.ended_at }, c.sessions.find { |s| !old.include?(s.pid) && s.confirmed_at >= at }] }
      {
        last_disconnect: sessions.filter_map { |ended, _| ended&.ended_at }.max, restart_hooks: master["restart_hooks"],
        teardown_begin: master["teardown_begin"], teardown_end: master["teardown_end"], config: master["config"],
        preloaded: master["preloaded"], hub_boot_begin: master["hub_boot_begin"], hub_boot_end: master["hub_boot_end"],
        first_worker_booted: booted.min, last_worker_booted: booted.max, all_booted: master["all_booted"],
        first_served: sessions.filter_map { |_, s| s&.confirmed_at }.min, last_served: sessions.filter_map { |_, s| s&.confirmed_at }.max
      }.transform_values { |t| t && (t - at).round(2) }
    end

    def phased_restart(app)
      old = app.puma.worker_pids
      at = Soak.now
      app.puma.signal("USR1")
      gone = watch(app, old.to_h { |pid| [pid, nil] }, phased: true)
      app.puma.wait_for("4 new workers of #{@adapter}", timeout: 120) { (app.puma.worker_pids - old).size == 4 }
      served_again(app, old, at)
      # The longest any client went without service: from a session's end to its next confirmation.
      gaps = app.clients.group_by { |c| c.name[%r{/([a-z]+)\d+\z}, 1] }.transform_values do |clients|
        clients.map do |client|
          client.sessions.each_cons(2).filter_map { |a, b| b.confirmed_at - a.ended_at if a.ended_at && a.ended_at >= at }.max || 0
        end.max.round(2)
      end
      stop("usr1", at, gone, app, served_s: gaps.values.max, served_by_kind: gaps)
    end

    def terminate(app)
      old = app.puma.worker_pids
      at = Soak.now
      app.puma.signal("TERM")
      gone = watch(app, old.to_h { |pid| [pid, at] })
      reaped = app.puma.wait_for(nil, timeout: GONE_DEADLINE) { app.puma.reaped? && Soak.now }
      stop("term", at, gone, app, master_gone_s: reaped && (reaped - at).round(2))
    end

    def stop(kind, at, gone, app, **figures)
      killed = gone[:detail].reject { |_, marks| marks.key?("at_exit") }.keys
      Stop.new(kind: kind, at: (at - @t0).round(1), workers_gone_s: gone[:gone].values, lingered: gone[:lingered],
               killed: killed, ended_by_plugin: ended_by_plugin(app, gone[:detail].keys), detail: gone[:detail],
               load: Float(File.read("/proc/loadavg").split.first), **figures)
    end

    # Which of +pids+ logged the stop watch's WARN line (Puma prefixes a worker's lines with "[PID] ").
    def ended_by_plugin(app, pids)
      app.puma.log.scan(/\[(\d+)\] .*Puma's server thread sat .* in IO#close/).flatten.map(&:to_i).uniq & pids
    end

    # Every client subscribed on a worker not in +old+ (bounded); per client kind (cable,
    # stream), seconds from +at+ to the last one.
    def served_again(app, old, at)
      app.puma.wait_for("every #{@adapter} client served by a new worker", timeout: 90) do
        app.clients.all? { |c| (pid = c.current_pid) && !old.include?(pid) }
      end
      app.clients.group_by { |c| c.name[%r{/([a-z]+)\d+\z}, 1] }.transform_values do |clients|
        clients.filter_map { |c| c.sessions.find { |s| !old.include?(s.pid) && s.confirmed_at >= at }&.confirmed_at }
               .max.then { |last| last && (last - at).round(2) }
      end
    end

    # Polls the old workers until all are gone (bounded): +stops+ maps each to when it was told
    # to stop (nil: a phased restart's, read from Puma's log as it happens). A worker alive
    # LINGER s after its stop is dumped (in a thread: the others' ends are still timed).
    def watch(app, stops, phased: false)
      gone = {}
      dumpers = {}
      deadline = Soak.now + GONE_DEADLINE + (phased ? 120 : 0)
      until gone.size == stops.size || Soak.now > deadline
        now = Soak.now
        app.puma.phased_stops.each { |pid| stops[pid] ||= now if stops.key?(pid) } if phased
        stops.each do |pid, stop_at|
          next if gone.key?(pid) || stop_at.nil?

          if !Cluster.alive?(pid)
            gone[pid] = (now - stop_at).round(2)
          elsif now - stop_at > LINGER && !dumpers.key?(pid)
            log "worker #{pid} alive #{LINGER} s after its stop: dumping its threads"
            dumpers[pid] = Thread.new { app.puma.dump(pid) }
          end
        end
        sleep 0.05
      end
      lingered = dumpers.map do |pid, thread|
        text = thread.value
        FileUtils.mkdir_p(@settings.dumps)
        file = File.join(@settings.dumps, "#{@adapter}-#{pid}.txt")
        File.write(file, "#{text}\n## marks after the end\n#{app.puma.marks(pid).inspect}\n")
        File.write(File.join(@settings.dumps, "#{@adapter}-#{pid}-puma.log"), app.puma.log)
        { pid: pid, gone_s: gone[pid], dump: file }
      end
      detail = stops.keys.to_h { |pid| [pid, app.puma.marks(pid).transform_values { |t| stops[pid] && (t - stops[pid]).round(2) }] }
      { gone: gone, lingered: lingered, detail: detail }
    end

    # Messages of the cycle at every client (after the clients stopped: arrivals are recorded
    # as sessions end): missed while the client was disconnected, lost while it was subscribed.
    # Attributed to +stops+ (the one USR2 of a cycle; the phased restarts of a cluster, evenly).
    def account(stops, app, publisher)
      app.clients.each(&:stop)
      missed = 0
      missed_by_kind = Hash.new(0)
      lost_by_kind = Hash.new(0)
      pubs = publisher.pubs[app.adapter]
      app.clients.each do |client|
        got = client.arrivals.to_set(&:first)
        sessions = client.sessions
        kind = client.name[%r{/([a-z]+)\d+\z}, 1]
        pubs.each do |seq, (t, committed)|
          next if got.include?(seq)
          next if sessions.empty? || t < sessions.first.confirmed_at # before its first session (pgbus SSE: published from before it connects)

          connected = sessions.any? { |s| s.confirmed_at <= t && (s.ended_at.nil? || committed + Soak::GRACE <= s.ended_at) }
          next lost_by_kind[kind] += 1 if connected

          missed += 1
          missed_by_kind[kind] += 1
        end
      end
      clients_by_kind = app.clients.map { |c| c.name[%r{/([a-z]+)\d+\z}, 1] }.tally
      stops = [stops].flatten # Array() would take a Struct for its members
      stops.each do |stop|
        stop.missed = (missed.to_f / stops.size).round(1)
        stop.lost = (lost_by_kind.values.sum.to_f / stops.size).round(1)
        stop.lost_by_kind = lost_by_kind.transform_values { |n| (n.to_f / stops.size).round(1) }
        stop.missed_per_client = clients_by_kind.to_h { |kind, n| [kind, (missed_by_kind[kind].to_f / n / stops.size).round(1)] }
      end
    end
  end

  # Both apps side by side on one private cluster; returns the report's data.
  class Runner
    def initialize(settings = Settings.from_env, out: $stdout)
      @settings = settings
      @out = out
    end

    def run
      @pg = PrivateCluster.new(tcp: true, max_connections: 200)
      @pg.start
      adapters = @settings.apps
      admin = @pg.connect
      adapters.each { |adapter| admin.exec("create database soak_#{adapter}") }
      admin.close
      unless @settings.pgbus_libs.empty?
        PgbusSse.load!(@settings.pgbus_libs)
        adapters.each { |adapter| @pg.connect(dbname: "soak_#{adapter}").then { |c| PgbusSse.install_schema(c).tap { c.close } } }
      end
      t0 = Soak.now
      tag = "#{Process.pid}_#{SecureRandom.hex(3)}"
      @out.puts "[stops] PostgreSQL #{PrivateCluster.release} on :#{@pg.port}; #{@settings.to_h.to_json}" \
                "#{@settings.pgbus_libs.empty? ? '' : "; pgbus #{Pgbus::VERSION}'s SSE streams"}"
      runs = adapters.map { |adapter| AppStops.new(adapter, @pg, @settings, tag: tag, t0: t0, out: @out) }
      runs.map { |run| Thread.new { run.run } }.each(&:join)
      data = Stops.summarize(runs, @settings)
      Stops.print(data, @out)
      File.write(@settings.report, JSON.pretty_generate(data)) if @settings.report
      data
    ensure
      @pg&.destroy
    end
  end

  module_function

  def summarize(runs, settings)
    { settings: settings.to_h, apps: runs.to_h do |run|
      by_kind = run.stops.group_by(&:kind).transform_values do |stops|
        gone = stops.map { |s| s.workers_gone_s.max || 0 }
        served = stops.filter_map(&:served_s)
        { stops: stops.size, lingered: stops.count { |s| s.lingered.any? }, killed: stops.sum { |s| s.killed.size },
          worker_stops: stops.sum { |s| s.detail.size }, ended_by_plugin: stops.sum { |s| s.ended_by_plugin.size },
          workers_gone_s: spread(gone), master_gone_s: spread(stops.filter_map(&:master_gone_s)),
          served_again_s: served.empty? ? nil : spread(served),
          served_again_by_kind_s: stops.filter_map(&:served_by_kind).flat_map(&:to_a).group_by(&:first)
                                       .transform_values { |pairs| spread(pairs.map(&:last).compact) },
          missed_per_client_per_stop: stops.filter_map(&:missed_per_client).flat_map(&:to_a).group_by(&:first)
                                           .transform_values { |pairs| (pairs.sum(&:last) / pairs.size).round(1) },
          missed_while_disconnected: stops.sum { |s| s.missed || 0 }.round, lost_while_connected: stops.sum { |s| s.lost || 0 }.round,
          lost_while_connected_by_kind: stops.filter_map(&:lost_by_kind).flat_map(&:to_a).group_by(&:first)
                                             .transform_values { |pairs| pairs.sum(&:last).round },
          lingering: stops.flat_map(&:lingered), load: stops.map(&:load).minmax,
          steps_p50_s: median_steps(stops.filter_map(&:steps)) }
      end
      [run.adapter, { kinds: by_kind, stops: run.stops.map(&:to_h) }]
    end }
  end

  def spread(values)
    sorted = values.sort
    return nil if sorted.empty?

    { min: sorted.first, p50: sorted[(sorted.size - 1) / 2], max: sorted.last, over_5s: sorted.count { |v| v > LINGER } }
  end

  # Each step's median over the hot restarts' timelines (nil: no stop reached it).
  def median_steps(timelines)
    return nil if timelines.empty?

    timelines.first.keys.to_h { |step| [step, spread(timelines.filter_map { |t| t[step] })&.fetch(:p50)] }
  end

  def print(data, out)
    out.puts "", "=== stops: #{data[:settings][:cycles]} cycles, #{data[:settings][:clients]} WebSocket " \
                 "(+ as many #{data[:settings][:pgbus_libs].empty? ? 'streaming HTTP on pgbus_hub' : "pgbus SSE"}) clients, #{data[:settings][:rate]} msg/s ==="
    out.puts "[stops] Puma: #{Cluster::PUMA}"
    out.puts "| app | stop | stops | a worker alive > 5 s (workers killed) | worker stops (ended by the plugin's stop watch) | " \
             "old workers gone p50 / max s | master gone p50 / max s | " \
             "every client served again min / p50 / max s (over 5 s) | load (1 min) | missed while disconnected (per client and stop) | lost while connected |"
    out.puts "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"
    data[:apps].each do |adapter, app|
      app[:kinds].each do |kind, k|
        fmt = ->(s) { s ? "#{s[:p50]} / #{s[:max]}" : "-" }
        served = ->(s) { s ? "#{s[:min]} / #{s[:p50]} / #{s[:max]} (#{s[:over_5s]})" : "-" }
        out.puts "| #{adapter} | #{kind} | #{k[:stops]} | #{k[:lingered]} (#{k[:killed]}) | #{k[:worker_stops]} (#{k[:ended_by_plugin]}) | " \
                 "#{fmt.call(k[:workers_gone_s])} | " \
                 "#{fmt.call(k[:master_gone_s])} | #{served.call(k[:served_again_s])} | #{k[:load].join('-')} | #{k[:missed_while_disconnected]} " \
                 "(#{k[:missed_per_client_per_stop].map { |kind, n| "#{kind} #{n}" }.join(', ')}) | " \
                 "#{k[:lost_while_connected]}#{k[:lost_while_connected_by_kind].empty? ? '' : " (#{k[:lost_while_connected_by_kind].map { |kind, n| "#{kind} #{n}" }.join(', ')})"} |"
      end
    end
    data[:apps].each do |adapter, app|
      steps = app[:kinds].dig("usr2", :steps_p50_s) or next
      out.puts "#{adapter}: hot restart steps, p50 s after the USR2: #{steps.map { |step, s| "#{step} #{s.inspect}" }.join(', ')}"
    end
    data[:apps].each do |adapter, app|
      app[:kinds].each_value do |k|
        k[:lingering].each { |l| out.puts "#{adapter}: worker #{l[:pid]} gone after #{l[:gone_s].inspect} s: #{l[:dump]}" }
      end
    end
  end
end
