# frozen_string_literal: true

require "open3"
require "rbconfig"
require_relative "support/puma_apps/e2e_helpers"
require_relative "support/serve_process"

# `pgbus-hub serve`: the hub as a process of its own for a host, found by
# `pgbus-hub status`, stopped by TERM, its log reopened by HUP; Puma clusters
# that find it at their socket path attach instead of starting hubs of their
# own, so two of them and the sidecar hold one LISTEN connection.
RSpec.describe "pgbus-hub serve", :puma do
  include PumaE2E

  def run_exe(*args, tmpdir: nil)
    env = { "RUBYLIB" => File.join(ROOT, "lib"), "TMPDIR" => tmpdir, "PGBUS_STREAMS_HUB_SOCKET" => nil }
    out, status = Open3.capture2e(env, RbConfig.ruby, PGBUS_HUB_EXE, *args)
    [out, status.exitstatus]
  end

  before do
    skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available?
  end

  after do
    stop_clusters
    @serve&.stop
    @serve&.cleanup
  end

  it "prints its socket and the variable to export, answers status, delivers, reopens its log, stops on TERM" do
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    expect(@serve.output).to include("listening on #{@serve.socket}", "export PGBUS_STREAMS_HUB_SOCKET=#{@serve.socket}")
    out, code = run_exe("status", "--socket", @serve.socket)
    expect([out, code]).to match([/healthy/, 0])

    wakes = Queue.new
    client = Pgbus::Hub::HubClient.new(socket_path: @serve.socket, dispatch_queue: wakes).connect
    stream = unique_stream
    expect(client.ensure_listening(stream)).to eq(:done)
    TestDatabase.notify(stream, "through the sidecar", prefix: "", suffix: "")
    expect(wait_for("the wake", timeout: 5) { wakes.pop(true) rescue nil }).to have_attributes( # rubocop:disable Style/RescueModifier
      queue_name: stream, payload: "through the sidecar"
    )

    File.rename(@serve.log_path, "#{@serve.log_path}.1") # logrotate
    @serve.signal("HUP")
    wait_for("the log reopened", timeout: 5) { @serve.log.include?("log reopened") }
    expect(File.read("#{@serve.log_path}.1")).to match(/\A\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z INFO .*master hub listening at #{Regexp.escape(@serve.socket)}$/m)

    expect(@serve.stop("TERM")).to have_attributes(exitstatus: 0)
    expect(File.exist?(@serve.socket)).to be(false)
    expect(@serve.log).to include("master hub at #{@serve.socket} stopped")
    client.stop
  end

  it "at the default path: status skips and names a socket nobody answers on; serve removes it, status finds serve" do
    Dir.mktmpdir("pgbus-serve-tmpdir") do |tmpdir|
      stale = File.join(tmpdir, Pgbus::Hub.socket_name(999_999_999)) # a hub killed with -9 leaves its file
      UNIXServer.new(stale).close
      out, code = run_exe("status", tmpdir: tmpdir)
      expect(code).to eq(2)
      expect(out).to include("no hub answering", "skipped stale sockets", stale)

      @serve = ServeProcess.new(PumaCluster::DATABASE_URL, tmpdir: tmpdir)
      expect(File.exist?(stale)).to be(false)
      expect(@serve.log).to include("removed a stale hub socket: #{stale}")
      out, code = run_exe("status", tmpdir: tmpdir)
      expect([out, code]).to match([/pgbus-hub at #{Regexp.escape(@serve.socket)}: healthy/, 0])
      expect(@serve.stop).to have_attributes(exitstatus: 0)
    end
  end

  it "a Puma master starting its hub at the default path removes the sockets dead masters left there, no others" do
    Dir.mktmpdir("pgbus-puma-tmpdir") do |tmpdir|
      dead = File.join(tmpdir, Pgbus::Hub.socket_name(999_999_999)) # above any pid_max: no such process
      alive = File.join(tmpdir, Pgbus::Hub.socket_name(::Process.pid)) # this process: never removed
      [dead, alive].each { |path| UNIXServer.new(path).close }
      c = cluster(mode: :standalone, workers: 2, env: { "TMPDIR" => tmpdir })
      c.wait_log(/master hub listening at/)
      expect(c.log).to include("removed a stale hub socket: #{dead}")
      expect([File.exist?(dead), File.exist?(alive)]).to eq([false, true])
      stop_clusters
    end
  end

  it "a socket_path set in the app (after the plugin armed) is the one the workers use: a sidecar there serves them" do
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    c = cluster(mode: :standalone, workers: 2, env: { "PGBUS_E2E_APP_SOCKET" => @serve.socket })
    c.wait_log(/a hub already serves #{Regexp.escape(@serve.socket)}/)
    expect(c.log).to include("socket_path #{@serve.socket} from Pgbus::Hub.configure")
    subs = c.subscribe_all(unique_stream)
    expect(subs.values.map { |s| [s["listener"], s["result"], s["socket"]] }.uniq)
      .to eq([["Pgbus::Hub::FailoverListener", "done", @serve.socket]])
    expect(c.census_settles_at(0)).to eq(0) # none of the cluster's own: the master started no hub
    expect(c.hub_info).to include("running" => false)
    expect(Pgbus::Hub.stats(socket_path: @serve.socket)[:workers]).to eq(2)
  end

  it "exits 64 on a usage error and when it has no connection" do
    out, code = run_exe("serve", "--bogus")
    expect([out, code]).to match([/invalid option: --bogus/, 64])
    out, code = run_exe("serve", "--socket", "/nonexistent/x.sock")
    expect([out, code]).to match([/no connection/, 64]) unless ENV["DATABASE_URL"]
  end

  it "a Puma hot restart (USR2) keeps its LISTEN connection: census 1 throughout, the new workers woken" do
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    backend = wait_for("the sidecar LISTENing", timeout: 10) { Pgbus::Hub.stats(socket_path: @serve.socket)[:backend_pid] }
    c = cluster(mode: :standalone, workers: 2, env: { "PGBUS_STREAMS_HUB_SOCKET" => @serve.socket })
    c.wait_log(/a hub already serves/)
    stream = unique_stream
    c.subscribe_all(stream)
    census = []
    sampling = true
    sampler = Thread.new do
      conn = TestDatabase.connect # its own: the example's thread uses TestDatabase's meanwhile
      while sampling
        census << count_listen(conn)
        sleep 0.05
      end
    ensure
      conn&.close
    end
    c.signal("USR2")
    c.wait_log(/a hub already serves/, count: 2, timeout: 30) # the re-executed master attaches again
    c.wait_log(/Worker \d \(PID: \d+\) booted/, count: 4, timeout: 30)
    subs = c.subscribe_all(stream)
    expect_wake_everywhere(c, subs.keys, stream, "after the hot restart")
    sampling = false
    sampler.join
    expect(census.uniq).to eq([1]), "pgbus-listen connections sampled through the restart: #{census.tally}"
    expect(Pgbus::Hub.stats(socket_path: @serve.socket)).to include(backend_pid: backend, reconnects: 0)
  end

  # Issue 56 item 3, in both start orders: a newer serve replaces the hub at the socket (an older
  # serve, or the Puma master's own because Puma booted first); the workers move to it at markers.
  it "a newer serve takes the socket over from an older one: the older exits 0, the workers move and are woken" do
    older = ServeProcess.new(PumaCluster::DATABASE_URL)
    c = cluster(mode: :standalone, workers: 2, env: { "PGBUS_STREAMS_HUB_SOCKET" => older.socket })
    c.wait_log(/a hub already serves/)
    stream = unique_stream
    subs = c.subscribe_all(stream)
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL, socket: older.socket)
    expect(older.exited).to have_attributes(exitstatus: 0)
    expect(older.output).to include("another pgbus-hub serve took #{older.socket} over")
    expect(@serve.log).to include("took #{older.socket} over from the hub of pid #{older.pid}")
    wait_for("the workers on the newer serve", timeout: 15) { Pgbus::Hub.stats(socket_path: @serve.socket)[:workers] == 2 }
    expect(c.census_settles_at(0)).to eq(0) # the workers' own connections closed again
    expect_wake_everywhere(c, subs.keys, stream, "through the newer serve")
    expect(c.log.scan(/back on the master hub at its marker/).size).to eq(2)
  ensure
    older&.stop
    older&.cleanup
  end

  it "serve started after a Puma that serves the socket itself takes it over: the master's hub yields" do
    socket = File.join(Dir.mktmpdir("pgbus-order"), "hub.sock")
    c = cluster(mode: :standalone, workers: 2, env: { "PGBUS_STREAMS_HUB_SOCKET" => socket })
    c.wait_log(/master hub listening at #{Regexp.escape(socket)}/)
    stream = unique_stream
    subs = c.subscribe_all(stream)
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL, socket: socket)
    c.wait_log(/took #{Regexp.escape(socket)} over: handing every worker over, then yielding/)
    wait_for("the workers on serve", timeout: 15) { Pgbus::Hub.stats(socket_path: socket)[:workers] == 2 }
    expect(c.census_settles_at(0)).to eq(0) # neither the master's hub nor a worker holds a connection
    expect_wake_everywhere(c, subs.keys, stream, "through serve")
  end

  def count_listen(conn)
    conn.exec("select count(*) from pg_stat_activity where application_name = 'pgbus-listen' " \
              "and datname = current_database()").getvalue(0, 0).to_i
  end

  it "two Puma clusters attach to it instead of starting hubs: one LISTEN connection for all their workers" do
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    env = { "PGBUS_STREAMS_HUB_SOCKET" => @serve.socket }
    clusters = Array.new(2) { cluster(mode: :standalone, workers: 2, env: env) }
    stream = unique_stream
    clusters.each do |c|
      c.wait_log(/a hub already serves #{Regexp.escape(@serve.socket)}/)
      expect(c.log).not_to match(/master hub started before fork/)
      subs = c.subscribe_all(stream)
      expect(subs.values.map { |s| s["result"] }.uniq).to eq(["done"])
      expect(c.hub_info).to include("running" => false, "socket" => @serve.socket)
    end
    # No worker or master of either cluster holds a LISTEN connection; this
    # run's database has the sidecar's only.
    clusters.each { |c| expect(c.census_settles_at(0)).to eq(0) }
    expect(TestDatabase.census).to eq(1)
    clusters.each { |c| expect_wake_everywhere(c, c.subscribe_all(stream).keys, stream, "to both clusters") }
    clusters.each(&:stop)
    expect(File.socket?(@serve.socket)).to be(true) # the clusters leave the sidecar's socket alone
    out, code = run_exe("status", "--socket", @serve.socket)
    expect([out, code]).to match([/healthy/, 0])
  end
end
