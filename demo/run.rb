# frozen_string_literal: true

# bin/demo: a real 4-worker Puma cluster (preload_app!, plugin :pgbus_hub) on
# one PostgreSQL LISTEN connection, driven by SSE clients; then the hub is
# stopped and every worker fails over. `--serve` keeps it running for a browser.
require "json"
require "net/http"
require "optparse"
require "rbconfig"
require "socket"
require "tmpdir"
require "fileutils"
require "set"

ROOT = File.expand_path("..", __dir__)
$LOAD_PATH.unshift(File.join(ROOT, "lib"))

module Demo
  class Failure < StandardError; end

  module_function

  def step(msg) = puts("==> #{msg}")

  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def wait_until(what, timeout:, interval: 0.05)
    deadline = monotonic + timeout
    loop do
      result = yield
      return result if result
      raise Failure, "timed out after #{timeout}s waiting for #{what}" if monotonic > deadline

      sleep interval
    end
  end

  def free_tcp_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  def port_taken?(port)
    TCPServer.new("127.0.0.1", port).close
    false
  rescue Errno::EADDRINUSE, Errno::EACCES
    true
  end
end

# The native extension (lib/pgbus_hub/<ruby minor>/), built by `rake compile` when missing.
module Native
  def self.ensure_built
    require_relative "../lib/pgbus/hub/native_path"
    so = Pgbus::Hub::NATIVE_DEV_PATH
    return if File.exist?(so)

    Demo.step "compiling the native extension (rake compile; first run only)"
    target = ENV.fetch("CARGO_TARGET_DIR") { File.join(Dir.home, ".cache", "pgbus-hub", "target") }
    ok = system({ "CARGO_TARGET_DIR" => target }, "rake", "compile", chdir: ROOT, out: $stderr)
    raise Demo::Failure, "rake compile failed (needs cargo and libclang: run bin/setup)" unless ok && File.exist?(so)
  end
end

# DATABASE_URL, or a throwaway cluster in a temp dir (unix socket only, trust auth).
class Database
  attr_reader :url

  def initialize
    @dir = nil
  end

  def start
    if (url = ENV["DATABASE_URL"]) && !url.empty?
      @url = url
      Demo.step "database: DATABASE_URL (#{url.sub(/:[^:@\/]*@/, ':***@')})"
    else
      start_throwaway
    end
    check
    self
  end

  def throwaway? = !@dir.nil?

  def stop
    return unless @dir

    if @data && File.exist?(File.join(@data, "postmaster.pid"))
      pg(%W[#{@bin}/pg_ctl -D #{@data} -m fast -w -t 20 stop], out: File::NULL, err: File::NULL)
    end
    FileUtils.rm_rf(@dir)
    @dir = nil
  end

  private

  def start_throwaway
    version = Dir.glob("/usr/lib/postgresql/*/bin/initdb").map { |p| p.split("/")[4] }.max_by(&:to_i)
    raise Demo::Failure, "PostgreSQL binaries not found (/usr/lib/postgresql/<version>/bin/initdb): " \
                         "run bin/setup, or set DATABASE_URL" unless version

    @bin = "/usr/lib/postgresql/#{version}/bin"
    @dir = Dir.mktmpdir("pgbus-hub-demo-pg")
    @data = File.join(@dir, "data")
    @sock = File.join(@dir, "sock")
    FileUtils.mkdir_p(@sock)
    @as = nil
    if Process.uid.zero? # initdb refuses root: the cluster runs as postgres
      require "etc"
      begin
        pw = Etc.getpwnam("postgres")
      rescue ArgumentError
        raise Demo::Failure, "running as root but there is no 'postgres' user to run initdb as"
      end
      File.chown(pw.uid, pw.gid, @dir, @sock)
      @as = "postgres"
    end
    @port = rand(20_000..60_000)
    user = `id -un`.strip
    Demo.step "database: throwaway PostgreSQL #{version} cluster in #{@dir} (unix socket only, port #{@port})"
    log = File.join(@dir, "initdb.log")
    unless pg(%W[#{@bin}/initdb -D #{@data} -A trust -U #{user} -E UTF8 --no-sync], out: log, err: log)
      raise Demo::Failure, "initdb failed:\n#{File.read(log) rescue ''}"
    end
    opts = "-k #{@sock} -p #{@port} -c listen_addresses='' -c fsync=off -c max_connections=50"
    unless pg(%W[#{@bin}/pg_ctl -D #{@data} -l #{@dir}/server.log -w -t 30 -o #{opts} start], out: File::NULL, err: log)
      raise Demo::Failure, "pg_ctl start failed:\n#{File.read(log) rescue ''}\n#{File.read("#{@dir}/server.log") rescue ''}"
    end
    @url = "host=#{@sock} port=#{@port} dbname=postgres user=#{user}"
  end

  def pg(argv, **redirects)
    argv = ["runuser", "-u", @as, "--", *argv] if @as
    system(*argv, in: File::NULL, **redirects)
  end

  def check
    require "pg"
    PG.connect(@url).close
  rescue PG::Error => e
    raise Demo::Failure, "cannot connect to PostgreSQL (#{@url}): #{e.message.strip}"
  end
end

# `puma -C demo/puma.rb` in its own process group.
class Cluster
  PUMA = ENV.fetch("DEMO_PUMA", "/usr/bin/puma")
  attr_reader :pid, :port, :log_path

  def initialize(database_url:, port:, workers:, scope:, log_path:, state_dir:)
    @state_dir = state_dir
    @database_url = database_url
    @port = port
    @workers = workers
    @scope = scope
    @log_path = log_path
  end

  def start
    raise Demo::Failure, "port #{@port} on 127.0.0.1 is already in use (pick another with --port)" if Demo.port_taken?(@port)
    raise Demo::Failure, "puma not found at #{PUMA} (run bin/setup)" unless File.exist?(PUMA)

    env = { "RUBYLIB" => [File.join(ROOT, "lib"), ENV["RUBYLIB"]].compact.reject(&:empty?).join(File::PATH_SEPARATOR),
            "DEMO_DATABASE_URL" => @database_url, "DEMO_PORT" => @port.to_s, "DEMO_WORKERS" => @workers.to_s,
            "DEMO_SCOPE" => @scope.to_s, "DEMO_STATE_DIR" => @state_dir, "PGBUS_STREAMS_HUB_SOCKET" => nil }
    @pid = Process.spawn(env, RbConfig.ruby, PUMA, "-C", File.join(__dir__, "puma.rb"), chdir: __dir__, pgroup: true,
                         in: File::NULL, out: @log_path, err: %i[child out])
    Demo.wait_until("puma to serve on port #{@port}", timeout: 60) do
      raise Demo::Failure, "puma exited early:\n#{log_tail}" if Process.waitpid(@pid, Process::WNOHANG)

      get("/health")
    end
    Demo.wait_until("#{@workers} workers booted", timeout: 30) { log.scan(/Worker \d+ \(PID: \d+\) booted/).size >= @workers }
    if @scope.to_s == "master"
      Demo.wait_until("the master hub", timeout: 30) { log.include?("master hub listening at") && File.socket?(socket_path) }
    end
    self
  rescue StandardError
    stop
    raise
  end

  def socket_path = File.join(Dir.tmpdir, "pgbus-streams-hub-#{@pid}.sock")
  def url = "http://127.0.0.1:#{@port}/"
  def log = File.exist?(@log_path) ? File.read(@log_path) : ""
  def log_tail = log.lines.last(30).join

  def get(path)
    http = Net::HTTP.new("127.0.0.1", @port)
    http.open_timeout = 1
    http.read_timeout = 5
    res = http.get(path)
    res.is_a?(Net::HTTPOK) ? JSON.parse(res.body) : nil
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout, JSON::ParserError
    nil
  end

  def post(path, body)
    http = Net::HTTP.new("127.0.0.1", @port)
    http.open_timeout = 2
    http.read_timeout = 5
    res = http.post(path, body, "content-type" => "text/plain")
    raise Demo::Failure, "POST #{path}: HTTP #{res.code} #{res.body}" unless res.is_a?(Net::HTTPOK)

    JSON.parse(res.body)
  end

  def group_pids
    return [] unless @pid

    Dir.glob("/proc/[0-9]*/stat").filter_map do |stat|
      fields = File.read(stat).split(") ").last.split
      stat[%r{/proc/(\d+)/}, 1].to_i if fields[2].to_i == @pid && fields[0] != "Z"
    rescue SystemCallError
      nil
    end
  end

  def stop_hub
    Process.kill("WINCH", @pid)
  end

  def stop(timeout: 20)
    return unless @pid

    begin
      Process.kill("TERM", @pid)
    rescue Errno::ESRCH
      nil
    end
    deadline = Demo.monotonic + timeout
    reaped = nil
    until (reaped = Process.waitpid(@pid, Process::WNOHANG)) || Demo.monotonic > deadline
      sleep 0.05
    end
    unless reaped
      warn "bin/demo: puma did not stop within #{timeout}s, killing its process group"
      Process.kill("KILL", -@pid) rescue nil # rubocop:disable Style/RescueModifier
      Process.waitpid(@pid) rescue nil # rubocop:disable Style/RescueModifier
    end
    @clean = !reaped.nil?
    begin
      Demo.wait_until("puma's workers to exit", timeout: 5) { group_pids.empty? }
    rescue Demo::Failure
      Process.kill("KILL", -@pid) rescue nil # rubocop:disable Style/RescueModifier
    end
    @pid = nil
  end

  def stopped_cleanly? = @clean
end

# One SSE connection (plain TCPSocket), parsed on a reader thread.
class SseClient
  Event = Struct.new(:name, :data, :at)
  attr_reader :topic, :pid, :events

  def initialize(port, topic)
    @topic = topic
    @events = []
    @lock = Mutex.new
    @socket = Socket.tcp("127.0.0.1", port, connect_timeout: 2)
    @socket.write("GET /streams/#{topic} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
    @thread = Thread.new { read_loop }
  end

  def wait_ready(timeout = 10)
    Demo.wait_until("SSE subscription ack on #{@topic}", timeout: timeout) { @pid }
  end

  def wakes
    @lock.synchronize { @events.select { |e| e.name == "wake" } }
  end

  def close
    @socket.close unless @socket.closed?
    @thread.join(1)
  end

  private

  def read_loop
    status = @socket.gets
    raise "bad response #{status.inspect}" unless status&.start_with?("HTTP/1.1 200")

    nil while (line = @socket.gets) && line != "\r\n"
    name = nil
    data = nil
    while (line = @socket.gets)
      line = line.chomp
      if line.empty?
        if data
          parsed = JSON.parse(data)
          @pid = parsed["pid"] if name == "ready"
          @lock.synchronize { @events << Event.new(name, parsed, Demo.monotonic) }
        end
        name = data = nil
      elsif line.start_with?("event: ")
        name = line.delete_prefix("event: ")
      elsif line.start_with?("data: ")
        data = line.delete_prefix("data: ")
      end
    end
  rescue IOError, SystemCallError, RuntimeError, JSON::ParserError
    nil
  end
end

class Runner
  TOPICS = %w[alpha beta].freeze

  def initialize(argv)
    @opts = { serve: false, port: nil, workers: 4, messages: 10 }
    OptionParser.new do |o|
      o.banner = "usage: bin/demo [--serve] [--port N] [--messages N]"
      o.on("--serve", "keep the cluster running for a browser until Ctrl-C") { @opts[:serve] = true }
      o.on("--port N", Integer, "HTTP port (default: a free one)") { |v| @opts[:port] = v }
      o.on("--messages N", Integer, "durable and ephemeral messages per topic and phase (default 10)") { |v| @opts[:messages] = v }
    end.parse!(argv)
    @clients = []
    @report = []
  end

  def run
    @work = Dir.mktmpdir("pgbus-hub-demo")
    install_traps
    port = @opts[:port] || Demo.free_tcp_port
    raise Demo::Failure, "port #{port} on 127.0.0.1 is already in use (pick another with --port)" if Demo.port_taken?(port)

    @db = Database.new.start
    Demo.step "starting Puma: #{@opts[:workers]} workers, preload_app!, plugin :pgbus_hub, listen_scope :master"
    @cluster = Cluster.new(database_url: @db.url, port: port, workers: @opts[:workers], scope: :master,
                           log_path: File.join(@work, "puma.log"), state_dir: @work).start
    @socket = @cluster.socket_path
    Demo.step "master hub at #{@socket} (master pid #{@cluster.pid}, workers #{@cluster.group_pids.sort - [@cluster.pid]})"
    @opts[:serve] ? serve : drive
  rescue Demo::Failure => e
    warn "bin/demo: #{e.message}"
    warn "--- puma log (tail) ---\n#{@cluster.log_tail}" if @cluster&.pid
    @failed = true
  rescue Interrupt
    puts
    Demo.step "interrupted"
    @interrupted = true
  ensure
    cleanup
    exit(@failed ? 1 : 0) unless @interrupted
    exit 130
  end

  private

  def install_traps
    %w[INT TERM].each { |sig| Signal.trap(sig) { raise Interrupt } }
  end

  def serve
    puts "demo running: #{@cluster.url}"
    puts "  ActionCable (adapter: pgbus_hub): #{@cluster.url}cable.html" if Gem::Specification.find_all_by_name("actioncable").any?
    puts "  hub socket: #{@socket}"
    url = @db.throwaway? ? "'#{@db.url}'" : '"$DATABASE_URL"'
    puts "  try:  exe/pgbus-hub status --socket #{@socket} --database-url #{url}"
    puts "  press Ctrl-C to stop"
    $stdout.flush
    loop do
      sleep 1
      raise Demo::Failure, "puma exited" if Process.waitpid(@cluster.pid, Process::WNOHANG)
    end
  end

  def drive
    Demo.step "opening SSE clients until both topics are served by all #{@opts[:workers]} workers"
    open_clients
    pids = @clients.map(&:pid).uniq
    census1 = census_settles_at(1)
    stats1 = Pgbus::Hub.stats(socket_path: @socket)
    Demo.step "phase 1 (hub): broadcasting #{@opts[:messages]} durable + #{@opts[:messages]} ephemeral messages per topic"
    phase1 = broadcast_phase("hub")
    stats1 = Pgbus::Hub.stats(socket_path: @socket)

    Demo.step "stopping the master hub (SIGWINCH to the master: socket closed and unlinked)"
    @cluster.stop_hub
    Demo.wait_until("the hub socket to disappear", timeout: 10) { !File.exist?(@socket) }
    census2 = census_settles_at(pids.size, timeout: 20)
    wait_probes
    Demo.step "phase 2 (failed over): broadcasting again"
    phase2 = broadcast_phase("failover")

    print_report(pids, census1, census2, stats1, phase1, phase2)
    @failed = !(phase1[:ok] && phase2[:ok] && census1 == 1 && census2 == pids.size)
  end

  def open_clients
    TOPICS.each do |topic|
      seen = Set.new
      attempts = 0
      until seen.size >= @opts[:workers]
        attempts += 1
        raise Demo::Failure, "only workers #{seen.to_a} took #{topic} streams after #{attempts - 1} connections" if attempts > 40

        batch = Array.new(2) { SseClient.new(@cluster.port, topic) }
        batch.each(&:wait_ready)
        @clients.concat(batch)
        seen.merge(batch.map(&:pid))
      end
    end
    per_worker = @clients.group_by(&:pid).transform_values(&:size)
    puts "    #{@clients.size} SSE clients (#{TOPICS.map { |t| "#{t}: #{@clients.count { |c| c.topic == t }}" }.join(', ')}); per worker: #{per_worker}"
  end

  # pgbus-listen backends of our processes: in the throwaway cluster all of
  # them; on a shared DATABASE_URL only those whose TCP client port is ours.
  def census
    require "pg"
    rows = PG.connect(@db.url) do |c|
      c.exec("select client_port from pg_stat_activity where application_name = 'pgbus-listen'").values.flatten.map(&:to_i)
    end
    return rows.size if @db.throwaway?

    ports = local_ports(@cluster.group_pids)
    rows.count { |p| p.negative? || ports.include?(p) }
  end

  def census_settles_at(expected, timeout: 15)
    Demo.wait_until("census == #{expected}", timeout: timeout) { census == expected }
    sleep 0.3
    census
  rescue Demo::Failure => e
    raise Demo::Failure, "#{e.message} (it is #{census})"
  end

  def local_ports(pids)
    inodes = pids.flat_map do |p|
      Dir.glob("/proc/#{p}/fd/*").filter_map { |fd| File.readlink(fd)[/\Asocket:\[(\d+)\]\z/, 1] rescue nil } # rubocop:disable Style/RescueModifier
    end.to_set
    %w[/proc/net/tcp /proc/net/tcp6].flat_map { |t| File.exist?(t) ? File.readlines(t).drop(1) : [] }.filter_map do |line|
      f = line.split
      f[1].split(":").last.to_i(16) if inodes.include?(f[9])
    end.to_set
  end

  # After fail-over: probe until every client got a probe (the local
  # listeners have re-LISTENed), bounded.
  def wait_probes
    Demo.step "waiting for every worker's own listener (probes until every client answers)"
    deadline = Demo.monotonic + 20
    n = 0
    loop do
      n += 1
      TOPICS.each { |t| @cluster.post("/broadcast/#{t}", "probe-#{n}") }
      sleep 0.3
      missing = @clients.reject { |c| c.wakes.any? { |e| e.data["payload"].to_s.start_with?("probe-") } }
      return if missing.empty?
      raise Demo::Failure, "#{missing.size} clients never got a probe after the fail-over" if Demo.monotonic > deadline
    end
  end

  # Sequential: each message is sent, then every subscribed client must get it
  # (5 s bound) before the next; latency = POST start -> receipt.
  def broadcast_phase(name)
    latencies = []
    delivered = 0
    expected = 0
    workers_hit = Set.new
    missing_total = 0
    TOPICS.each do |topic|
      subs = @clients.select { |c| c.topic == topic }
      @opts[:messages].times do |i|
        [nil, "#{name}-#{topic}-#{i} héllo"].each do |payload|
          before = subs.to_h { |c| [c, c.wakes.size] }
          t0 = Demo.monotonic
          @cluster.post("/broadcast/#{topic}", payload.to_s)
          expected += subs.size
          got = {}
          deadline = t0 + 5
          loop do
            subs.each do |c|
              next if got[c]

              e = c.wakes.drop(before[c]).find { |w| w.data["payload"] == payload }
              got[c] = e if e
            end
            break if got.size == subs.size || Demo.monotonic > deadline

            sleep 0.002
          end
          missing_total += subs.size - got.size
          got.each_value do |e|
            delivered += 1
            latencies << (e.at - t0) * 1000
            workers_hit << e.data["pid"]
          end
        end
      end
    end
    sorted = latencies.sort
    pct = ->(q) { sorted.empty? ? Float::NAN : sorted[[(q * sorted.size).ceil - 1, 0].max] }
    { name: name, delivered: delivered, expected: expected, ok: delivered == expected && missing_total.zero?,
      p50: pct.call(0.5), p99: pct.call(0.99), max: sorted.last || Float::NAN, workers: workers_hit.size }
  end

  def print_report(pids, census1, census2, stats, phase1, phase2)
    line = ->(p) { format("%-10s delivered %d/%d to %d workers, wake latency p50 %.2f ms, p99 %.2f ms, max %.2f ms%s", p[:name], p[:delivered], p[:expected], p[:workers], p[:p50], p[:p99], p[:max], p[:ok] ? "" : "  <-- MISSING") }
    puts
    puts "=== pgbus-hub demo report ==="
    puts "cluster:    #{@opts[:workers]} Puma workers (#{pids.size} serving #{@clients.size} SSE clients), preload_app!, plugin :pgbus_hub"
    puts "census:     #{census1} pgbus-listen connection(s) with the hub; #{census2} without it (measured after the " \
         "fail-over below: one per worker, as listen_scope :process uses)"
    puts line.call(phase1)
    puts "hub stats:  workers #{stats[:workers]}, channels #{stats[:channels]}, listener_healthy #{stats[:listener_healthy]}, " \
         "wakes_received #{stats[:wakes_received]}, frames_sent #{stats[:frames_sent]}, dropped_durable_wakes " \
         "#{stats[:dropped_durable_wakes]}, evicted_workers #{stats[:evicted_workers]}, threads #{stats[:threads]}, reconnects #{stats[:reconnects]}"
    puts "fail-over:  hub stopped -> census #{census2} (each worker LISTENs on its own connection)"
    puts line.call(phase2)
    puts "result:     #{phase1[:ok] && phase2[:ok] ? 'OK, every message delivered in both phases' : 'FAILED'}"
    puts
  end

  def cleanup
    Signal.trap("INT", "IGNORE")
    Signal.trap("TERM", "IGNORE")
    Demo.step "shutting down" if @cluster || @db
    @clients.each(&:close)
    socket = @cluster&.pid && @cluster.socket_path
    if @cluster&.pid
      @cluster.stop
      unless @cluster.stopped_cleanly?
        warn "bin/demo: puma had to be killed"
        @failed = true
      end
    end
    if socket && File.exist?(socket)
      warn "bin/demo: the hub socket #{socket} was left behind; removing it"
      File.unlink(socket) rescue nil # rubocop:disable Style/RescueModifier
      @failed = true
    end
    throwaway = @db&.throwaway?
    @db&.stop
    FileUtils.rm_rf(@work) if @work
    puts "    stopped cleanly#{throwaway ? ' (throwaway cluster removed)' : ''}" if @cluster
  rescue StandardError => e
    warn "bin/demo: cleanup: #{e.class}: #{e.message}"
    @failed = true
  end
end

begin
  Native.ensure_built
rescue Demo::Failure => e
  warn "bin/demo: #{e.message}"
  exit 1
end
require "pgbus/hub"
begin
  runner = Runner.new(ARGV)
rescue OptionParser::ParseError => e
  warn "bin/demo: #{e.message} (usage: bin/demo [--serve] [--port N] [--messages N])"
  exit 64
end
runner.run
