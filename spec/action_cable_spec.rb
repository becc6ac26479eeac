# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"
require_relative "support/serve_process"

# Each gem installed, or its library on the load path (a Ruby whose gems were built by hand).
CABLE_GEMS = { "actioncable" => "action_cable", "activerecord" => "active_record",
               "websocket-driver" => "websocket/driver" }.freeze
CABLE_MISSING = CABLE_GEMS.reject do |name, feature|
  Gem::Specification.find_all_by_name(name).any? || $LOAD_PATH.resolve_feature_path(feature)
rescue LoadError
  false
end.keys
require_relative "support/cable_client" if CABLE_MISSING.empty?

# `adapter: pgbus_hub` on a real 4-worker Puma cluster (preload_app!, plugin
# :pgbus_hub) serving spec/support/cable_app/config.ru, real WebSocket
# clients on every worker, real PostgreSQL; Rails' own postgresql adapter
# live beside it for wire compatibility and for the latency comparison.
RSpec.describe "ActionCable adapter pgbus_hub", :puma do
  include PumaE2E

  RACKUP = File.expand_path("support/cable_app/config.ru", __dir__)
  # PostgreSQL truncates channel names at 63 bytes: both adapters hash longer ones.
  LONG_ROOM_BYTES = 80
  LATENCY_BROADCASTS = 200

  before do
    skip "ActionCable e2e needs #{CABLE_MISSING.join(', ')} (bin/setup installs them)" unless CABLE_MISSING.empty?
    skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available?
  end

  after do
    (@clients || []).each(&:close)
    stop_clusters
  end

  def cable_cluster(adapter: "pgbus_hub", workers: 4, prefix: nil, env: {})
    env = { "PGBUS_E2E_RACKUP" => RACKUP, "PGBUS_E2E_CABLE_ADAPTER" => adapter, "PGBUS_E2E_CABLE_PREFIX" => prefix,
            **env }
    cluster(mode: :standalone, workers: workers, plugins: workers.positive? ? "pgbus_hub" : "", env: env)
  end

  # Clients (each subscribed to every room, confirmed) until every worker
  # serves at least two of them. Bounded: 48 connections.
  def clients_on_every_worker(c, rooms)
    workers = [c.options[:workers], 1].max
    clients = []
    48.times do
      per_pid = clients.group_by(&:pid).transform_values(&:size)
      break if per_pid.size == workers && per_pid.values.min >= 2

      client = CableClient.new(c.port)
      (@clients ||= []) << client # closed after the example, whatever happens
      rooms.each { |room| client.subscribe(room) }
      # RoomChannel#subscribed tells its pid; 20 s: two shared cores, five Puma processes (fails with the Puma log)
      c.wait_for("the pid of a new subscription", timeout: 20) { client.pid }
      clients << client
    end
    expect(clients.map(&:pid).uniq.size).to eq(workers)
    wait_for("every subscription confirmed") { clients.all? { |client| rooms.all? { |r| client.confirmed?(r) } } }
    clients
  end

  def unique_room(bytes = nil)
    room = "cable_#{Process.pid}_#{rand(1 << 30).to_s(36)}"
    bytes ? room.ljust(bytes, "r") : room
  end

  def broadcast_via(c, room, seq, bytes: 10)
    expect(c.get("/broadcast?room=#{room}&seq=#{seq}&bytes=#{bytes}")).to include("pid")
  end

  # Every client got seqs of room (with their body sizes), whatever worker broadcast them.
  def expect_delivered(clients, room, sizes)
    got = lambda do |client|
      client.messages.filter_map { |r, message, _at| [message["seq"], message["body"].size] if r == room && message["body"] }.sort
    end
    wait_for("#{sizes.size} broadcasts on #{room} at every client", timeout: 15) do
      clients.all? { |client| (sizes.to_a - got.call(client)).empty? }
    end
    expect(clients.map { |client| got.call(client) }.uniq).to eq([sizes.to_a.sort])
  end

  # NOTIFYs sent straight from here (the bytes both adapters send), each
  # stamped; [p50, p99] in ms of every client's arrival time minus the stamp.
  def latency(clients, room)
    PG.connect(PumaCluster::DATABASE_URL) do |conn|
      LATENCY_BROADCASTS.times do |seq|
        payload = JSON.generate(seq: -seq - 1, sent_at: Process.clock_gettime(Process::CLOCK_REALTIME))
        conn.exec("NOTIFY #{conn.escape_identifier(room)}, '#{conn.escape_string(payload)}'")
        sleep 0.01
      end
    end
    measured = ->(client) { client.messages.select { |r, message, _| r == room && message["sent_at"] } }
    wait_for("every latency broadcast at every client", timeout: 20) do
      clients.all? { |client| measured.call(client).size == LATENCY_BROADCASTS }
    end
    samples = clients.flat_map { |client| measured.call(client).map { |_, m, at| (at - m["sent_at"]) * 1000 } }.sort
    [samples[samples.size / 2], samples[(samples.size * 0.99).ceil - 1]].map { |ms| ms.round(2) }
  end

  def hub_status(c)
    out = IO.popen({ "RUBYLIB" => File.join(ROOT, "lib") },
                   [RbConfig.ruby, File.join(ROOT, "exe/pgbus-hub"), "status", "--socket", c.socket_path, "--json"],
                   &:read)
    JSON.parse(out)
  end

  it "serves every worker from one LISTEN connection, delivers every broadcast (100 KB too), fails over" do
    started = TestDatabase.with { |conn| conn.exec("select clock_timestamp()").getvalue(0, 0) }
    c = cable_cluster
    c.wait_log(/master hub listening at/)
    expect(c.log).to match(/actioncable configuration: master hub started before fork/)
    rooms = [unique_room, unique_room(LONG_ROOM_BYTES)]
    clients = clients_on_every_worker(c, rooms)
    expect(c.census_settles_at(1)).to eq(1)
    expect(TestDatabase.census).to eq(1) # this run's database: the hub only

    status = hub_status(c)
    expect(status).to include("status" => "healthy")
    expect(status["hub"]).to include("workers" => 4, "channels" => 2)
    expect(status["hub"]).to include("raw_channels" => 2)
    expect(status["hub"]["raw_channel_names"].size).to eq(2) # ActionCable's identifiers, by name

    sizes = { 1 => 10, 2 => 7900, 3 => 8000, 4 => 100_000 } # JSON adds ~40 bytes: inline, then stored (8000+)
    rooms.each do |room|
      sizes.each { |seq, bytes| broadcast_via(c, room, seq, bytes: bytes) }
      expect_delivered(clients, room, sizes)
    end
    stored = TestDatabase.with do |conn|
      conn.exec_params("select count(*) from pgbus_hub_large_payloads where created_at >= $1", [started]).getvalue(0, 0).to_i
    end
    expect(stored).to eq(4) # 8000 and 100,000 bytes, in both rooms
    hub_latency = latency(clients, rooms.first)
    puts "\n  pgbus_hub: #{clients.size} subscribers on 4 workers, census 1, latency p50/p99 #{hub_latency.join('/')} ms"

    c.signal("WINCH") # stops the master hub: every worker fails over to its own LISTEN connection
    expect(c.census_settles_at(4)).to eq(4)
    after_failover = { 5 => 10, 6 => 100_000 }
    rooms.each do |room|
      after_failover.each { |seq, bytes| broadcast_via(c, room, seq, bytes: bytes) }
      expect_delivered(clients, room, sizes.merge(after_failover))
    end
    expect(hub_status(c)["status"]).to eq("no hub")
  end

  it "uses a pgbus-hub serve sidecar instead of starting a hub: census 1, delivered on every worker" do
    serve = ServeProcess.new(PumaCluster::DATABASE_URL)
    c = cable_cluster(env: { "PGBUS_STREAMS_HUB_SOCKET" => serve.socket })
    c.wait_log(/a hub already serves #{Regexp.escape(serve.socket)}/)
    room = unique_room
    clients = clients_on_every_worker(c, [room])
    expect(c.census_settles_at(0)).to eq(0) # no connection of the cluster's own
    expect(TestDatabase.census).to eq(1) # the sidecar's
    broadcast_via(c, room, 1, bytes: 100_000)
    expect_delivered(clients, room, { 1 => 100_000 })
    expect(Pgbus::Hub.stats(socket_path: serve.socket)).to include(worker_processes: 4, raw_channels: 1)
  ensure
    stop_clusters
    serve&.stop
    serve&.cleanup
  end

  it "shares the hub started from Pgbus::Hub.configure when it names ActionCable's database" do
    c = cable_cluster(env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1" }) # puma.rb configures the hub (as pgbus would)
    c.wait_log(/standalone configuration: master hub started before fork/)
    room = unique_room
    clients = clients_on_every_worker(c, [room])
    expect(c.census_settles_at(1)).to eq(1)
    broadcast_via(c, room, 1, bytes: 100_000)
    expect_delivered(clients, room, { 1 => 100_000 })
    expect(c.log).not_to include("another database")
  end

  it "keeps ActionCable on each worker's own connection when the hub LISTENs on another database" do
    other = "#{PG::Connection.conninfo_parse(PumaCluster::DATABASE_URL).find { |o| o[:keyword] == 'dbname' }[:val]}_other"
    TestDatabase.with { |conn| conn.exec("create database #{conn.quote_ident(other)}") }
    c = cable_cluster(env: { "PGBUS_E2E_CONFIGURE_IN_MASTER" => "1",
                             "PGBUS_E2E_HUB_DATABASE_URL" => TestDatabase.keywords(host: "127.0.0.1", dbname: other) })
    c.wait_log(/standalone configuration: master hub started before fork/)
    room = unique_room
    clients = clients_on_every_worker(c, [room])
    expect(c.census_settles_at(5)).to eq(5) # the hub on the other database, 4 workers on ActionCable's
    expect(TestDatabase.census).to eq(4)
    broadcast_via(c, room, 1)
    expect_delivered(clients, room, { 1 => 10 })
    expect(c.log.scan(/LISTENs on another database than ActionCable's/).size).to eq(4)
  ensure
    stop_clusters
    TestDatabase.with { |conn| conn.exec("drop database if exists #{conn.quote_ident(other)} with (force)") } if other
  end

  it "without a hub LISTENs on the process's own connection (cable.yml url), and a forked child builds its own" do
    script = File.join(__dir__, "support/cable_app/fork_check.rb")
    rubylib = [File.join(ROOT, "lib"), *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR)
    out = IO.popen({ "CABLE_URL" => PumaCluster::DATABASE_URL, "RUBYLIB" => rubylib }, [RbConfig.ruby, script], &:read)
    report = JSON.parse(out)
    threads = ["pgbus-hub events", "pgbus-hub listener log", "pgbus-hub listener pump"]
    # subscribed (success callback), then an inline and a 20 KB broadcast received, in the parent and in the child
    expect(report).to include("parent" => [true, true], "child" => [true, true], "parent_threads" => threads,
                              "inherited" => [], "child_threads" => threads)
    expect(report).to include("after_shutdown" => [], "parent_after_shutdown" => [])
  end

  it "mixes with Rails' postgresql adapter both ways (prefix, hashed names) and compares latency on 4 workers" do
    prefix = "mixed_#{rand(1 << 20)}"
    hub = cable_cluster(prefix: prefix)
    rails = cable_cluster(adapter: "postgresql", workers: 0, prefix: prefix)
    rooms = [unique_room, unique_room(LONG_ROOM_BYTES)]
    clients = clients_on_every_worker(hub, rooms) + clients_on_every_worker(rails, rooms)
    expect(hub.census_settles_at(1)).to eq(1)
    rooms.each do |room|
      broadcast_via(hub, room, 1)
      broadcast_via(rails, room, 2)
      expect_delivered(clients, room, { 1 => 10, 2 => 10 })
    end
    clients.each(&:close) # every worker UNLISTENs through the hub
    wait_for("the hub to drop both channels") { hub.hub_info&.dig("stats", "channels")&.zero? }
    stop_clusters
    @clients = []

    # The same 4-worker cluster on Rails' own adapter: one LISTEN connection per worker.
    c = cable_cluster(adapter: "postgresql")
    room = unique_room
    clients = clients_on_every_worker(c, [room])
    rails_latency = latency(clients, room)
    puts "\n  postgresql: #{clients.size} subscribers on 4 workers, latency p50/p99 #{rails_latency.join('/')} ms"
    expect(c.census).to eq(0)
  end
end
