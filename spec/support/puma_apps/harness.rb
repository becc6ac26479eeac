# frozen_string_literal: true

require "json"
require "net/http"
require "socket"
require "tmpdir"
require "fileutils"
require "rbconfig"
require "set"
require "pg"
require_relative "../database"

# A real `puma -C config.rb` cluster for the e2e specs, in its own process
# group so every Puma process it leaves behind can be found and killed.
class PumaCluster
  ROOT = File.expand_path("../../..", __dir__)
  PUMA = ENV.fetch("PGBUS_E2E_PUMA", "/usr/bin/puma")
  # The Ruby that runs Puma: this one, or PGBUS_E2E_RUBY, e.g. a Ruby that has no `pg` gem for
  # the harness (a standalone app's workers need none): README, "Compatibility".
  RUBY = ENV.fetch("PGBUS_E2E_RUBY") { RbConfig.ruby }
  DATABASE_URL = ENV.fetch("PGBUS_HUB_E2E_DATABASE_URL") { TestDatabase.keywords(host: "127.0.0.1") }

  attr_reader :pid, :state_dir, :port, :options

  # mode: :pgbus or :standalone, or :real (the pgbus on PGBUS_HUB_REAL_PGBUS_LIBS, spec/support/real_pgbus);
  # shape: "pre382" / "v382"; order: :ours_first / :pgbus_first
  def initialize(mode:, shape: nil, order: :ours_first, workers: 4, preload: true, plugins: "pgbus_streams",
                 scope: nil, fork_worker: false, eager: false, puma_rb_requires: "", env: {})
    @options = { mode: mode, shape: shape, order: order, workers: workers, preload: preload, plugins: plugins,
                 scope: scope, fork_worker: fork_worker, eager: eager, puma_rb_requires: puma_rb_requires }
    @extra_env = env
  end

  # wait: false returns once Puma is spawned (a client may hammer it from then on).
  def start(wait: true)
    @state_dir = Dir.mktmpdir("pgbus-e2e")
    @port = free_port
    @log_path = File.join(@state_dir, "puma.log")
    @pid = Process.spawn(environment, RUBY, PUMA, "-C", File.join(__dir__, "config.rb"),
                         chdir: @state_dir, pgroup: true, in: File::NULL, out: @log_path, err: %i[child out])
    @socket_to_clean = socket_path
    wait_for("puma to serve /pid", timeout: 30) { get("/pid") } if wait
    self
  rescue StandardError
    stop
    raise
  end

  def environment
    ours = File.join(ROOT, "lib")
    libs = [ours]
    if %i[pgbus real].include?(@options[:mode])
      pgbus = if @options[:mode] == :real
                ENV.fetch("PGBUS_HUB_REAL_PGBUS_LIBS").split(File::PATH_SEPARATOR)
              else
                [File.join(ROOT, "spec/support/pgbus_standin", @options[:shape], "lib")]
              end
      libs = @options[:order] == :pgbus_first ? [*pgbus, ours] : [ours, *pgbus]
    end
    {
      # survives the hot-restart exec; this process's RUBYLIB after ours (gems built by hand for a Ruby)
      "RUBYLIB" => [*libs, *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR),
      "PGBUS_E2E_MODE" => @options[:mode].to_s,
      "PGBUS_E2E_PORT" => @port.to_s,
      "PGBUS_E2E_STATE_DIR" => @state_dir,
      "PGBUS_E2E_DATABASE_URL" => DATABASE_URL,
      "PGBUS_E2E_WORKERS" => @options[:workers].to_s,
      "PGBUS_E2E_PRELOAD" => @options[:preload] ? "1" : "0",
      "PGBUS_E2E_FORK_WORKER" => @options[:fork_worker] ? "1" : "0",
      "PGBUS_E2E_PLUGINS" => @options[:plugins],
      "PGBUS_E2E_PUMA_RB_REQUIRES" => @options[:puma_rb_requires],
      "PGBUS_E2E_SCOPE" => (@options[:scope] || "master").to_s,
      "PGBUS_E2E_SET_SCOPE" => @options[:scope] ? "1" : "0",
      "PGBUS_STANDIN_EAGER" => @options[:eager] ? "1" : "0",
      "PGBUS_STREAMS_HUB_SOCKET" => nil
    }.merge(@extra_env)
  end

  def log
    File.exist?(@log_path.to_s) ? File.read(@log_path) : ""
  end

  def wait_for(what, timeout:, &block)
    super(what, timeout: timeout, interval: 0.05, detail: -> { "--- puma log ---\n#{log[-4000..] || log}" }, &block)
  end

  def wait_log(pattern, timeout: 15, count: 1)
    wait_for("log #{pattern.inspect} x#{count}", timeout: timeout) { log.scan(pattern).size >= count }
  end

  def get(path, timeout: 5) = PumaCluster.get(@port, path, timeout: timeout)

  # The e2e app's JSON answer on 127.0.0.1:port (any server), nil if none.
  def self.get(port, path, timeout: 5)
    http = Net::HTTP.new("127.0.0.1", port)
    http.open_timeout = 1
    http.read_timeout = timeout
    response = http.get(path)
    response.is_a?(Net::HTTPOK) ? JSON.parse(response.body) : nil
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout, EOFError
    nil
  end

  # Concurrent held requests (threads 1,1 per worker) until `count` distinct
  # worker pids have subscribed to `stream`. Bounded: 15 rounds. `own: true`
  # adds a queue of its own to every request ("<stream>_own_<n>"), so each
  # worker also holds channels no other worker shares.
  def subscribe_all(stream, count: @options[:workers], hold: 0.4, own: false)
    seen = {}
    15.times do
      responses = Array.new(count) do
        queues = own ? "#{stream},#{stream}_own_#{@own_seq = (@own_seq || 0) + 1}" : stream
        Thread.new { get("/sub?q=#{queues}&hold=#{hold}") }
      end.map(&:value).compact
      responses.each { |r| seen[r["pid"]] = r }
      return seen if seen.size >= count
    end
    raise "only #{seen.size}/#{count} workers subscribed: #{seen.keys}"
  end

  # [queue, payload] of every wake worker `pid` recorded.
  def wakes(pid)
    wake_records(pid).first.map { |queue, payload, _t| [queue, payload] }
  end

  # [[queue, payload, CLOCK_MONOTONIC], ...] recorded from byte `from` on, and
  # the offset to read on from (cheap polling of a large wake log).
  def wake_records(pid, from: 0)
    records_of("wakes", pid, from)
  end

  # Queues worker `pid` subscribed to and got :done for (its acked subscriptions).
  def acked_subs(pid)
    records_of("subs", pid, 0).first.filter_map { |queue, result, _t| queue if result == "done" }.uniq
  end

  def hub_info(master = @pid)
    JSON.parse(File.read(File.join(@state_dir, "hub-#{master}.json")))
  rescue Errno::ENOENT, JSON::ParserError
    nil
  end

  def records_of(kind, pid, from)
    File.open(File.join(@state_dir, "#{kind}-#{pid}.log")) do |f|
      f.seek(from)
      rows = []
      while (line = f.gets)
        break unless line.end_with?("\n") # a record still being written: read it next time

        rows << JSON.parse(line)
        from = f.pos
      end
      [rows, from]
    end
  rescue Errno::ENOENT
    [[], from]
  end

  def signal(name, target = @pid)
    Process.kill(name, target)
  end

  def socket_path
    File.join(Dir.tmpdir, "pgbus-streams-hub-#{@pid}.sock")
  end

  def group_pids
    Dir.glob("/proc/[0-9]*/stat").filter_map do |stat|
      fields = File.read(stat).split(") ").last.split
      stat[%r{/proc/(\d+)/}, 1].to_i if fields[2].to_i == @pid && fields[0] != "Z"
    rescue Errno::ENOENT, Errno::ESRCH
      nil
    end
  end

  def worker_pids
    group_pids - [@pid]
  end

  # pgbus-listen backends whose client socket belongs to THIS cluster's
  # processes (TCP client ports mapped through /proc), so concurrent test
  # runs on the same PostgreSQL cannot skew the figure.
  # A Census::Count: compared as an Integer, inspected with each backend's owner.
  def census
    ports = local_ports(group_pids)
    rows = PG.connect(DATABASE_URL) do |conn|
      conn.exec("select pid, client_port, backend_start from pg_stat_activity " \
                "where application_name = 'pgbus-listen' order by pid").to_a
    end
    Census::Count.new(rows.select { |row| ports.include?(row["client_port"].to_i) })
  end

  def census_settles_at(expected, timeout: 15)
    wait_for("census == #{expected} (is #{census})", timeout: timeout) { census == expected }
    sleep 0.5
    census
  end

  # TERM by default (Puma then re-raises it: the master dies of SIGTERM by
  # design); INT stops the same way and exits 0.
  def stop(deadline: 20, signal: "TERM")
    return unless @pid

    begin
      Process.kill(signal, @pid)
    rescue Errno::ESRCH
      nil
    end
    stopped = wait_for(nil, timeout: deadline) do
      pid, status = Process.waitpid2(@pid, Process::WNOHANG)
      @exit_status = status
      pid
    end
    unless stopped
      kill_group("KILL")
      Process.waitpid(@pid) rescue nil # rubocop:disable Style/RescueModifier
    end
    wait_for(nil, timeout: 5) { group_pids.empty? } || kill_group("KILL")
    wait_for(nil, timeout: 5) { group_pids.empty? }
    @stopped_cleanly = stopped ? true : false
  ensure
    @final_log = log
    @pid = nil if @pid && !stopped.nil?
  end

  def stopped_cleanly?
    @stopped_cleanly
  end

  # The master's Process::Status once stop reaped it.
  attr_reader :exit_status

  def final_log
    @final_log || log
  end

  # Removes the state dir, and the hub socket if a master that died without
  # its teardown (kill -9) left it behind.
  def cleanup
    FileUtils.rm_rf(@state_dir) if @state_dir
    FileUtils.rm_f(@socket_to_clean) if @socket_to_clean && group_pids.empty? && File.socket?(@socket_to_clean)
  end

  private

  def kill_group(signal)
    Process.kill(signal, -@pid)
  rescue Errno::ESRCH, Errno::EPERM
    nil
  end

  def free_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  def local_ports(pids)
    inodes = pids.flat_map do |p|
      Dir.glob("/proc/#{p}/fd/*").filter_map { |fd| File.readlink(fd)[/\Asocket:\[(\d+)\]\z/, 1] rescue nil } # rubocop:disable Style/RescueModifier
    end.to_set
    %w[/proc/net/tcp /proc/net/tcp6].flat_map do |table|
      File.exist?(table) ? File.readlines(table).drop(1) : []
    end.filter_map do |line|
      fields = line.split
      fields[1].split(":").last.to_i(16) if inodes.include?(fields[9])
    end.to_set
  end
end
