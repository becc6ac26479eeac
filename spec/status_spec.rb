# frozen_string_literal: true

require "tmpdir"
require "fileutils"
require "json"
require "open3"
require "etc"
require "rbconfig"
require_relative "support/database"
require_relative "support/ruby_hub_peer"

RSpec.describe "Pgbus::Hub.stats and `pgbus-hub status`" do

  def status(*args, env: {}, as: nil, root: ROOT)
    env = { "RUBYLIB" => File.join(root, "lib"), Pgbus::Hub::DEFAULT_SOCKET_ENV => nil }.merge(env)
    as_user = as ? Etc.getpwnam(as).then { |pw| ["setpriv", "--reuid=#{pw.uid}", "--regid=#{pw.gid}", "--clear-groups"] } : []
    out, st = Open3.capture2e(env, *as_user, RbConfig.ruby, File.join(root, "exe", "pgbus-hub"), "status", *args)
    [out, st.exitstatus]
  end

  # `--database-url` counts the census with the pg gem; on a Ruby without it (3.4 in CI) the
  # report says why instead, and the rest of the report stands.
  def expect_census(report)
    return yield(report) if defined?(PG)

    expect(report).not_to have_key("census")
    expect(report["census_error"]).to start_with("LoadError")
  end

  it "reports a healthy hub (exit 0), with counters and the census" do
    skip "no PostgreSQL" unless TestDatabase.available?
    Dir.mktmpdir do |dir|
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "h.sock")).start
      wait_for("listener healthy") { hub.stats[:listener_healthy] }
      stats = Pgbus::Hub.stats(socket_path: hub.socket_path)
      # the asking connection is not a worker
      expect(stats).to include(listener_healthy: true, listener_state: "listening", threads: 1, pid: Process.pid, workers: 0)
      client = Pgbus::Hub::HubClient.new(socket_path: hub.socket_path, dispatch_queue: Queue.new).connect
      wait_for("the worker counted") { hub.stats[:workers] == 1 }
      expect(Pgbus::Hub.stats(socket_path: hub.socket_path)[:workers]).to eq(1)
      out, code = status("--socket", hub.socket_path, "--json", "--database-url", TestDatabase.url)
      expect(code).to eq(0), out
      report = JSON.parse(out)
      expect(report).to include("status" => "healthy")
      expect_census(report) { expect(report["census"]).to be >= 1 }
      out, code = status("--socket", hub.socket_path)
      expect([code, out]).to match([0, /healthy.*listener: listening \(healthy: true\), workers: \d+/m])
    ensure
      client&.stop
      hub&.stop
    end
  end

  it "says so when the hub refuses the asking uid (exit 2), and counts the refusal" do
    skip "no PostgreSQL" unless TestDatabase.available?
    skip "needs root and setpriv to ask as another uid" unless Process.uid.zero? && system("command -v setpriv >/dev/null")
    Dir.mktmpdir do |dir|
      File.chmod(0o755, dir)
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "h.sock")).start
      File.chmod(0o666, hub.socket_path) # let the other uid reach the hub's own check
      # A copy the other uid can read: the checkout may sit in a 0700 directory (a CI clone in mktemp -d).
      FileUtils.cp_r([File.join(ROOT, "lib"), File.join(ROOT, "exe")], dir)
      out, code = status("--socket", hub.socket_path, root: dir, as: "nobody")
      expect([code, out]).to match([2, /no hub.*closed the connection without answering.*another uid/m])
      wait_for("the refusal counted") { hub.stats[:rejected_peers] == 1 }
    ensure
      hub&.stop
    end
  end

  it "finds the hub at the default path when no socket is given, and says so when there is none" do
    skip "no PostgreSQL" unless TestDatabase.available?
    Dir.mktmpdir do |dir|
      out, code = status(env: { "TMPDIR" => dir })
      expect([code, out]).to match([2, %r{no hub.*no socket given.*no hub answering at #{dir}/pgbus-streams-hub-\*\.sock}m])
      # Named as a Puma master names its hub: after the (live) process that runs it.
      name = Pgbus::Hub.socket_name(::Process.pid)
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, name)).start
      wait_for("listener healthy") { hub.stats[:listener_healthy] }
      out, code = status(env: { "TMPDIR" => dir })
      expect([code, out]).to match([0, /#{Regexp.escape(name)}: healthy.*workers: 0/m])
    ensure
      hub&.stop
    end
  end

  it "exits 2 with a clear message when no hub serves the socket, or the hub does not answer stats" do
    Dir.mktmpdir do |dir|
      out, code = status("--socket", File.join(dir, "none.sock"))
      expect([code, out]).to match([2, /no hub.*cannot reach master hub/m])
      stub = RubyHubStub.new(File.join(dir, "ruby.sock"))
      out, code = status("--socket", File.join(dir, "ruby.sock"))
      expect([code, out]).to match([2, /did not answer a stats request/])
      stub.close
    end
  end

  it "reports a hub whose database is unreachable as degraded (exit 1), its error as current" do
    Dir.mktmpdir do |dir|
      # Port 1 on loopback: nothing listens there, so every connect is refused at once.
      hub = Pgbus::Hub::MasterHub.new(connection: "host=127.0.0.1 port=1 dbname=x user=x connect_timeout=1",
                                      socket_path: File.join(dir, "h.sock")).start
      wait_for("a failed attempt", timeout: 10) { hub.stats[:last_error] }
      out, code = status("--socket", hub.socket_path)
      expect([code, out]).to match([1, /degraded.*listener: (connecting|reconnecting) \(healthy: false\).*last error: .+\(at .+ UTC, current\)/m])
    ensure
      hub&.stop
    end
  end

  it "follows CLI conventions: usage on stderr and exit 64 for bad input, --help exits 0" do
    run = lambda do |*args|
      out, err, st = Open3.capture3({ "RUBYLIB" => File.join(ROOT, "lib") }, RbConfig.ruby,
                                    File.join(ROOT, "exe", "pgbus-hub"), *args)
      [st.exitstatus, out, err]
    end
    [[], %w[bogus], %w[status --bogus], %w[status --socket], %w[status extra]].each do |args|
      code, out, err = run.call(*args)
      expect([code, out]).to eq([64, ""]), "#{args.inspect}: #{err}"
      expect(err).to match(/\Apgbus-hub: .+\nusage: pgbus-hub status/)
      expect(err).not_to include("from ") # no backtrace
    end
    [%w[--help], %w[help], %w[status --help], %w[status -h]].each do |args|
      code, out, = run.call(*args)
      expect([code, out]).to match([0, /usage: pgbus-hub status.*Exit status: 0 healthy, 1 degraded.*2 no hub, 64 usage/m])
    end
  end

  it "counts this host's census in the hub's database only, the server-wide total apart; " \
     "stats date the last error and say when it was resolved" do
    skip "no PostgreSQL" unless TestDatabase.available?
    Dir.mktmpdir do |dir|
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "h.sock")).start
      wait_for("listener healthy") { hub.stats[:listener_healthy] }
      stats = hub.stats
      database = TestDatabase.with { |c| c.exec("select current_database()").getvalue(0, 0) }
      expect(stats).to include(database: database, last_error: nil, last_error_at: nil)
      expect(stats[:healthy_since]).to be_within(30).of(Time.now.to_f)
      backend = TestDatabase.with do |c|
        c.exec_params("select datname, client_addr::text from pg_stat_activity where pid = $1", [stats[:backend_pid]]).first
      end
      expect(backend).to eq("datname" => database, "client_addr" => stats[:client_addr])

      # A listener in another database of the same server is not this host's.
      other = "pgbus_hub_status_#{Process.pid}_#{rand(1 << 20)}"
      TestDatabase.with { |c| c.exec("create database #{other}") }
      foreign = Pgbus::Hub::Listener.new(connection: TestDatabase.keywords(dbname: other), dispatch_queue: Queue.new).start
      expect(foreign.ensure_listening("elsewhere")).to eq(:done)
      out, code = status("--socket", hub.socket_path, "--json", "--database-url", TestDatabase.url)
      expect(code).to eq(0), out
      report = JSON.parse(out)
      expect_census(report) do
        expect(report["census"]).to eq(1)
        expect(report["census_server_wide"]).to be >= 2
      end

      # An outage that ended: the error is kept, dated, and shown as resolved.
      TestDatabase.with { |c| c.exec_params("select pg_terminate_backend($1)", [stats[:backend_pid]]) }
      wait_for("reconnected", timeout: 15) { hub.stats[:reconnects] == 1 && hub.stats[:listener_healthy] }
      after = hub.stats
      expect(after[:last_error]).to be_a(String)
      expect(after[:last_error_at]).to be <= after[:healthy_since]
      out, code = status("--socket", hub.socket_path)
      expect([code, out]).to match([0, /last error: .+\(at \d{4}-\d\d-\d\d [\d:]+ UTC, resolved\)/])
    ensure
      foreign&.stop
      hub&.stop
      TestDatabase.with { |c| c.exec("drop database if exists #{other} with (force)") } if other
    end
  end
end
