# frozen_string_literal: true

require "json"
require "socket"
require_relative "support/puma_apps/e2e_helpers"
require_relative "support/serve_process"

# Unicorn (Debian's package, 4 workers, preload_app) sharing a `pgbus-hub serve`
# sidecar through PGBUS_STREAMS_HUB_SOCKET: the e2e rack app of the Puma specs,
# standalone mode. The sidecar killed with -9: every worker falls back to its
# own connection; the sidecar restarted: every worker comes back to it.
RSpec.describe "Unicorn on a pgbus-hub serve sidecar", :puma do
  UNICORN = "/usr/bin/unicorn"

  def get(path) = PumaCluster.get(@port, path)

  # pgbus-listen connections in this run's database, now.
  def census
    TestDatabase.connect.then do |conn|
      conn.exec("select count(*) from pg_stat_activity where application_name = 'pgbus-listen' " \
                "and datname = current_database()").getvalue(0, 0).to_i
    ensure
      conn&.close
    end
  end

  # Every worker subscribed to `stream` (requests held so each lands on a free worker).
  def subscribe_all(stream)
    pids = {}
    wait_for("all 4 workers subscribed", timeout: 30, interval: 0) do
      Array.new(4) { Thread.new { get("/sub?q=#{stream}&hold=0.3") } }.map(&:value).compact.each do |sub|
        pids[sub["pid"]] = sub["result"]
      end
      pids.size >= 4
    end
    pids
  end

  def woken(pid, payload)
    path = File.join(@dir, "wakes-#{pid}.log")
    File.exist?(path) && File.readlines(path).any? { |line| JSON.parse(line)[1] == payload }
  end

  # NOTIFYed again each second until every worker has it: right after a
  # switch of connection a NOTIFY can precede a worker's LISTEN (its payload
  # is then lost by design; the catch-up wake covers durable streams).
  def expect_every_worker_woken(pids, stream, payload)
    wait_for("#{payload.inspect} in every worker", timeout: 15, interval: 0) do
      TestDatabase.notify(stream, payload, prefix: "", suffix: "")
      wait_for(nil, timeout: 1) { pids.all? { |pid| woken(pid, payload) } }
    end
  end

  before do
    skip "Debian's unicorn is not installed here (bin/setup installs it)" unless File.executable?(UNICORN)
    skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available?
    @dir = Dir.mktmpdir("pgbus-unicorn")
    @port = TCPServer.new("127.0.0.1", 0).then { |server| server.addr[1].tap { server.close } }
  end

  after do
    (::Process.kill("TERM", -@unicorn) rescue nil) if @unicorn # rubocop:disable Style/RescueModifier
    (::Process.wait(@unicorn) rescue nil) if @unicorn # rubocop:disable Style/RescueModifier
    [@serve, @restarted].compact.each { |serve| serve.stop.tap { serve.cleanup } }
    FileUtils.rm_rf(@dir) if @dir
  end

  it "4 workers, census 1; sidecar killed: census 4; sidecar restarted: census 1 again within 5 s, all woken" do
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    File.write(File.join(@dir, "unicorn.rb"), <<~RUBY)
      worker_processes 4
      listen "127.0.0.1:#{@port}"
      preload_app true
      timeout 60
      stderr_path #{File.join(@dir, 'unicorn.log').inspect}
      stdout_path #{File.join(@dir, 'unicorn.log').inspect}
    RUBY
    env = { "RUBYLIB" => File.join(ROOT, "lib"), "PGBUS_E2E_MODE" => "standalone", "PGBUS_E2E_STATE_DIR" => @dir,
            "PGBUS_E2E_DATABASE_URL" => PumaCluster::DATABASE_URL, "PGBUS_STREAMS_HUB_SOCKET" => @serve.socket }
    @unicorn = ::Process.spawn(env, UNICORN, "-c", File.join(@dir, "unicorn.rb"),
                               File.join(ROOT, "spec/support/puma_apps/config.ru"),
                               chdir: @dir, pgroup: true, in: File::NULL, out: File::NULL, err: File::NULL)
    wait_for("unicorn to serve", timeout: 30) { get("/pid") }
    stream = "unicorn_#{::Process.pid}_#{rand(1 << 30).to_s(36)}"
    subs = subscribe_all(stream)
    expect(subs.values.uniq).to eq(["done"])
    pids = subs.keys
    expect(wait_for("census 1 (the sidecar's)", timeout: 10) { census == 1 }).to be(true)
    expect_every_worker_woken(pids, stream, "via the sidecar")

    expect(@serve.stop("KILL").termsig).to eq(9) # its socket file stays behind
    expect(wait_for("census 4: every worker on its own connection", timeout: 15) { census == 4 }).to be(true)
    expect_every_worker_woken(pids, stream, "each on its own connection")

    restarted_at = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
    @restarted = ServeProcess.new(PumaCluster::DATABASE_URL, socket: @serve.socket)
    wait_for("census 1 again", timeout: 15, interval: 0.05) { census == 1 }
    back_s = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - restarted_at
    warn format("  [unicorn: 4 workers back on the restarted sidecar %.2f s after it started]", back_s)
    expect(back_s).to be < 5
    expect(File.read(File.join(@dir, "unicorn.log")).scan("back on the master hub").size).to eq(4)
    expect_every_worker_woken(pids, stream, "via the restarted sidecar")
  end
end
