# frozen_string_literal: true

require "json"
require "securerandom"
require "pgbus/hub"
require_relative "../private_cluster"
require_relative "../puma_apps/harness"
require_relative "../serve_process"
require_relative "proxy"
require_relative "clients"
require_relative "report"
require_relative "publisher"

module Soak
  FAULTS = %w[terminate_listen kill9 pg_restart sigstop usr2 terminate_all blackhole].freeze
  # Planned events of a sidecar hub (SOAK_HUB=serve): a new `pgbus-hub serve` replaces the running
  # one, as a deploy does; the hub stopped (TERM), a new one started HUB_DOWN_SECONDS later.
  SERVE_FAULTS = %w[hub_restart hub_stop].freeze
  HUBS = %w[puma serve].freeze
  RACKUP = File.expand_path("app/config.ru", __dir__)
  HUB_DOWN_SECONDS = 20
  SIGSTOP_SECONDS = 15
  BLACK_HOLE_SECONDS = 10
  SAMPLE_SECONDS = 0.1
  # A message sent less than this before a client's connection ended and not
  # received counts as lost during that client's disconnect (in flight at the cut).
  GRACE = 1.0
  DRAIN = 3.0

  # Settings, from PGBUS_SOAK_* (rake soak maps MINUTES and SOAK_* onto them:
  # only PGBUS_* variables pass into the chroot).
  # hub: where the app's hub runs, "puma" (the plugin starts it in the master) or "serve" (a
  # `pgbus-hub serve` sidecar the master attaches to). standby: the hub app's LISTEN connections
  # with a standby (issue 57; its hub and its workers' own: 2 LISTEN connections per listener).
  Settings = Struct.new(:minutes, :interval, :faults, :rate, :clients, :control, :report, :logs, :hub, :standby,
                        keyword_init: true) do
    def self.from_env(env = ENV)
      hub = env.fetch("PGBUS_SOAK_HUB", "puma")
      raise ArgumentError, "unknown hub mode #{hub} (known: #{HUBS.join(', ')})" unless HUBS.include?(hub)

      known = hub == "serve" ? FAULTS + SERVE_FAULTS : FAULTS
      faults = env.fetch("PGBUS_SOAK_FAULTS", "").split(",").map(&:strip).reject(&:empty?)
      faults = known if faults.empty?
      unknown = faults - known
      raise ArgumentError, "unknown fault(s) #{unknown.join(', ')} with hub #{hub} (known: #{known.join(', ')})" unless unknown.empty?

      new(minutes: Float(env.fetch("PGBUS_SOAK_MINUTES", "15")), interval: Float(env.fetch("PGBUS_SOAK_INTERVAL", "60")),
          faults: faults, rate: Float(env.fetch("PGBUS_SOAK_RATE", "20")), hub: hub,
          clients: Integer(env.fetch("PGBUS_SOAK_CLIENTS", "16")), control: env.fetch("PGBUS_SOAK_CONTROL", "1") != "0",
          report: env["PGBUS_SOAK_REPORT"], logs: env["PGBUS_SOAK_LOGS"], standby: env.fetch("PGBUS_SOAK_STANDBY", "0") == "1")
    end

    def fault_count = [(minutes * 60 / interval).floor, 1].max
  end

  # One app under test: a 4-worker Puma (PumaCluster on the soak's Rails app)
  # on a database of its own, reached through its own Proxy.
  class App
    attr_reader :adapter, :db, :proxy, :puma, :cable_room, :stream_channel, :clients

    # cluster: the PumaCluster class to run (rake stops runs its own config); env: more variables for Puma;
    # hub: "serve" runs the hub app's hub as a `pgbus-hub serve` sidecar (start_sidecar, before Puma).
    def initialize(adapter, pg, tag, cluster: PumaCluster, env: {}, hub: "puma", standby: false)
      @adapter = adapter
      @standby = standby && hub?
      @db = "soak_#{adapter}"
      @cable_room = "soak_#{tag}_cable"
      @stream_channel = "soak_#{tag}_stream"
      @proxy = Proxy.new("127.0.0.1", pg.port)
      @url = "postgres://root@127.0.0.1:#{@proxy.port}/#{@db}"
      @sidecar_socket = File.join(Dir.mktmpdir("soak-hub"), "hub.sock") if hub? && hub == "serve"
      env = { "PGBUS_E2E_RACKUP" => RACKUP, "SOAK_CABLE_ADAPTER" => adapter, "DATABASE_URL" => @url,
              "PGBUS_E2E_DATABASE_URL" => @url, "RAILS_ENV" => "production", "RAILS_LOG_TO_STDOUT" => "1", **env }
      env["PGBUS_STREAMS_HUB_SOCKET"] = @sidecar_socket if @sidecar_socket
      env["SOAK_HUB_STANDBY"] = "1" if @standby
      @puma = cluster.new(mode: :standalone, plugins: hub? ? "pgbus_hub" : "", env: env)
      @clients = []
    end

    def hub? = @adapter == "pgbus_hub"
    def standby? = @standby
    def sidecar? = !@sidecar_socket.nil?
    def start_sidecar = (@sidecar = new_sidecar if sidecar?)
    def new_sidecar = ServeProcess.new(@url, socket: @sidecar_socket, args: @standby ? ["--standby"] : [])

    # The hub's LISTEN connections when settled (the census): 2 with a standby.
    def listen_connections = @standby ? 2 : 1

    # hub_restart: a new serve takes the socket over; the old one yields and exits by itself.
    def restart_sidecar
      older = @sidecar
      @sidecar = new_sidecar
      { older_exit: older.exited(timeout: 20)&.exitstatus }
    ensure
      older&.stop
      older&.cleanup
    end

    # hub_stop: TERM, the hub down for HUB_DOWN_SECONDS, a new serve.
    def stop_sidecar_for(seconds)
      status = @sidecar.stop("TERM")
      @sidecar.cleanup
      sleep seconds
      @sidecar = new_sidecar
      { stop_exit: status&.exitstatus, down_s: seconds }
    end

    def stop_sidecar
      @sidecar&.stop
      @sidecar&.cleanup
      FileUtils.rm_rf(File.dirname(@sidecar_socket)) if @sidecar_socket
    end

    def listen_backend?(application_name)
      hub? ? application_name == "pgbus-listen" : application_name.start_with?("ActionCable-PID-")
    end

    def open_clients(count, deadline)
      count.times do |k|
        @clients << CableSoakClient.new("#{@adapter}/cable#{k}", @puma.port, @cable_room, deadline: deadline)
        @clients << StreamSoakClient.new("#{@adapter}/stream#{k}", @puma.port, @stream_channel, deadline: deadline) if hub?
      end
    end

    # The live worker with the most connected clients.
    def busiest_worker
      live = @puma.worker_pids
      counts = @clients.filter_map(&:current_pid).tally.select { |pid, _| live.include?(pid) }
      counts.max_by { |_, n| n }&.first || live.first
    end

    def hub_stats
      return nil unless hub?

      Pgbus::Hub.stats(socket_path: @sidecar_socket || @puma.socket_path, timeout: 1.0) || @puma.hub_info&.fetch("stats", nil)
    rescue StandardError
      @puma.hub_info&.fetch("stats", nil)
    end

    # Per worker: [rss_kb, fds] from /proc.
    def worker_procs
      @puma.worker_pids.filter_map do |pid|
        rss = File.read("/proc/#{pid}/status")[/^VmRSS:\s+(\d+)/, 1].to_i
        [pid, rss, Dir.children("/proc/#{pid}/fd").size]
      rescue SystemCallError
        nil
      end
    end
  end

  # `rake soak`: both apps on one private cluster, a fault a minute to both at
  # once, every message accounted for per client; returns the report's data.
  class Runner
    def initialize(settings = Settings.from_env, out: $stdout)
      @settings = settings
      @out = out
      @tag = "#{Process.pid}_#{SecureRandom.hex(3)}"
      @stopped = [] # SIGSTOPped pids, continued whatever happens
      @samples = []
    end

    def run
      start
      run_faults
      finish
    ensure
      cleanup
    end

    private

    def log(line) = @out.puts("[soak #{Time.now.utc.strftime('%H:%M:%S')}] #{line}")

    def start
      @pg = PrivateCluster.new(tcp: true, max_connections: 150)
      @pg.start
      adapters = @settings.control ? %w[pgbus_hub postgresql] : %w[pgbus_hub]
      @apps = adapters.map { |adapter| App.new(adapter, @pg, "#{@tag}_#{adapter}", hub: @settings.hub, standby: @settings.standby) }
      admin = @pg.connect
      @apps.each { |app| admin.exec("create database #{app.db}") }
      admin.close
      log "private cluster PostgreSQL #{PrivateCluster.release} on 127.0.0.1:#{@pg.port}; apps: " \
          "#{@apps.map { |a| "#{a.adapter} (proxy :#{a.proxy.port})" }.join(', ')}; hub: #{@settings.hub}"
      @apps.each(&:start_sidecar)
      @apps.each { |app| app.puma.start(wait: false) }
      @apps.each { |app| app.puma.wait_for("puma #{app.adapter} to serve /pid", timeout: 60) { app.puma.get("/pid") } }
      @apps.each { |app| app.puma.wait_for("4 workers of #{app.adapter}", timeout: 60) { app.puma.worker_pids.size == 4 } }
      @total = @settings.fault_count * @settings.interval
      deadline = Soak.now + @total + 180
      @monitor = Thread.new { monitor(deadline) }
      @apps.each { |app| app.open_clients(@settings.clients, deadline) }
      @apps.each do |app|
        app.puma.wait_for("every #{app.adapter} client connected", timeout: 90) { app.clients.all?(&:connected?) }
        spread = app.clients.map(&:current_pid).tally.values.sort.reverse
        log "#{app.adapter}: #{app.clients.size} clients on #{spread.size} workers (#{spread.join('/')})"
      end
      @t0 = Soak.now
      @publisher = Publisher.new(@pg, @apps, rate: @settings.rate, log: method(:log)).start(@t0 + @total + 5)
      @snapshots = [snapshot]
    end

    def run_faults
      @fires = []
      @settings.fault_count.times do |i|
        fire_at = @t0 + 5 + (i * @settings.interval)
        sleep [fire_at - Soak.now, 0].max
        name = @settings.faults[i % @settings.faults.size]
        @snapshots << snapshot unless i.zero?
        at = Soak.now
        log "fault #{i + 1}/#{@settings.fault_count}: #{name}"
        detail = inject(name)
        @fires << { name: name, at: at, detail: detail, took: (Soak.now - at).round(2) }
      end
      sleep [@t0 + 5 + @total - Soak.now, 0].max
      @snapshots << snapshot
      @end = Soak.now
    end

    def finish
      @publisher.stop
      sleep DRAIN
      @stop_times = {}
      @apps.map do |app|
        Thread.new do
          started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
          app.puma.stop
          @stop_times[app.adapter] = [(Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).round(2),
                                      app.puma.stopped_cleanly?]
        end
      end.each(&:join)
      @apps.each { |app| app.clients.each(&:stop) }
      @stop_monitor = true
      @monitor.join(5)
      data = Report.new(@apps, pubs: @publisher.pubs, fires: @fires, samples: @samples, snapshots: @snapshots,
                               t0: @t0, finish: @end, stop_times: @stop_times, publish_errors: @publisher.errors,
                               settings: @settings).build
      Report.print(data, @out)
      File.write(@settings.report, JSON.pretty_generate(data)) if @settings.report
      data
    end

    # Where a fault starts and ends: stats, /proc and worker pids of every app.
    def snapshot
      { at: Soak.now, apps: @apps.to_h do |app|
        [app.adapter, { stats: app.hub_stats, procs: app.worker_procs, workers: app.puma.worker_pids }]
      end }
    end

    def inject(name)
      case name
      when "terminate_listen"
        @apps.to_h { |app| [app.adapter, admin_sql(terminate_sql(app, listen_only: true), [app.db])] }
      when "terminate_all"
        @apps.to_h { |app| [app.adapter, admin_sql(terminate_sql(app, listen_only: false), [app.db, @publisher.backend_pids])] }
      when "kill9"
        @apps.to_h { |app| [app.adapter, app.busiest_worker.tap { |pid| Process.kill("KILL", pid) if pid }] }
      when "sigstop"
        pids = @apps.to_h { |app| [app.adapter, app.busiest_worker] }
        pids.each_value { |pid| @stopped << pid and Process.kill("STOP", pid) }
        sleep SIGSTOP_SECONDS
        continue_stopped
        pids
      when "usr2"
        @apps.each { |app| app.puma.signal("USR2") }
        { masters: @apps.map { |app| app.puma.pid } }
      when "pg_restart"
        started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
        @pg.restart("fast")
        { restart_seconds: (Process.clock_gettime(Process::CLOCK_MONOTONIC) - started).round(2) }
      when "hub_restart"
        @apps.select(&:sidecar?).to_h { |app| [app.adapter, app.restart_sidecar] }
      when "hub_stop"
        @apps.select(&:sidecar?).to_h { |app| [app.adapter, app.stop_sidecar_for(HUB_DOWN_SECONDS)] }
      when "blackhole"
        @apps.each { |app| app.proxy.black_hole! }
        sleep BLACK_HOLE_SECONDS
        @apps.each { |app| app.proxy.restore! }
        { seconds: BLACK_HOLE_SECONDS }
      end
    rescue StandardError => e
      log "fault #{name} failed: #{e.class}: #{e.message}"
      { error: "#{e.class}: #{e.message}" }
    end

    def continue_stopped
      @stopped.each { |pid| Process.kill("CONT", pid) rescue nil } # rubocop:disable Style/RescueModifier
      @stopped.clear
    end

    def terminate_sql(app, listen_only:)
      base = "select count(pg_terminate_backend(pid)) from pg_stat_activity where datname = $1 " \
             "and pid <> pg_backend_pid()"
      return "#{base} and not (pid = any($2::int[]))" unless listen_only

      return "#{base} and application_name like 'ActionCable-PID-%'" unless app.hub?
      return "#{base} and application_name = 'pgbus-listen'" unless app.standby?

      # With a standby: the serving backend, the older of the two (a standby starts after the
      # connection it stands by, and a promoted one's successor after it). Both at once is
      # terminate_all's case.
      "select count(pg_terminate_backend(pid)) from (select pid from pg_stat_activity where datname = $1 " \
        "and application_name = 'pgbus-listen' order by backend_start limit 1) serving"
    end


    def admin_sql(sql, params)
      conn = PG.connect(@pg.url.sub("user=root", "user=root connect_timeout=3"))
      conn.exec_params(sql, params).getvalue(0, 0).to_i
    ensure
      conn&.close
    end

    # pg_stat_activity every SAMPLE_SECONDS: the LISTEN backends of each app's
    # database, [at, {adapter => [backend pids]}], or [at, nil] when the cluster did not answer.
    def monitor(deadline)
      conn = nil
      until @stop_monitor || Soak.now > deadline
        at = Soak.now
        begin
          conn ||= PG.connect(@pg.url.sub("user=root", "user=root connect_timeout=1"))
          rows = conn.exec_params("select datname, pid, application_name from pg_stat_activity " \
                                  "where datname = any($1::text[])", ["{#{@apps.map(&:db).join(',')}}"]).values
          @samples << [at, @apps.to_h do |app|
            [app.adapter, rows.filter_map { |db, pid, name| pid.to_i if db == app.db && name && app.listen_backend?(name) }]
          end]
        rescue PG::Error
          conn&.close rescue nil # rubocop:disable Style/RescueModifier
          conn = nil
          @samples << [at, nil]
        end
        sleep [at + SAMPLE_SECONDS - Soak.now, 0.01].max
      end
    ensure
      conn&.close rescue nil # rubocop:disable Style/RescueModifier
    end

    # PGBUS_SOAK_LOGS=DIR: each app's Puma log (master, hub, workers) kept as DIR/puma-<adapter>.log.
    def keep_log(app)
      return unless @settings.logs

      FileUtils.mkdir_p(@settings.logs)
      File.write(File.join(@settings.logs, "puma-#{app.adapter}.log"), app.puma.final_log)
    rescue SystemCallError => e
      log "could not keep the #{app.adapter} Puma log in #{@settings.logs}: #{e.message}"
    end

    def cleanup
      continue_stopped
      @stop_monitor = true
      @publisher&.stop
      @monitor&.then { |t| t.join(5) || t.kill }
      (@apps || []).each do |app|
        app.clients.each(&:stop)
        app.puma.stop if app.puma.pid
        app.stop_sidecar
        keep_log(app)
        app.puma.cleanup
        app.proxy.close
      end
      @pg&.destroy
    end
  end
end
