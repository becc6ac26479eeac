# frozen_string_literal: true

require "net/http"
require_relative "support/puma_apps/e2e_helpers"
require_relative "support/serve_process"
require_relative "support/sse_clients"

# Opt-in: Falcon (its released source, never shipped with this project: its lib
# dir in PGBUS_HUB_FALCON_LIB) serving REAL pgbus streams (PGBUS_HUB_REAL_PGBUS_LIBS,
# as in spec/real_pgbus_spec.rb) under Rails, 4 processes on a `pgbus-hub serve`
# sidecar. Falcon's gems are Debian sid's (bin/sid installs them), e.g.
#   PGBUS_HUB_CHROOT_BIND=/src PGBUS_HUB_FALCON_LIB=/src/falcon/lib \
#   PGBUS_HUB_REAL_PGBUS_LIBS=/src/pgbus/lib:/src/pgmq/lib:/src/fugit/lib \
#     bin/sid bash -c 'rake compile && rspec spec/real_pgbus_falcon_spec.rb'
# SSE clients on every process: census 1 and every client gets every broadcast; the sidecar
# killed with -9: census 4, still delivered; restarted: census 1 again.
RSpec.describe "real pgbus streams on Falcon with a pgbus-hub serve sidecar" do
  APP = File.join(ROOT, "spec/support/real_pgbus/falcon")

  before do
    skip "set PGBUS_HUB_FALCON_LIB and PGBUS_HUB_REAL_PGBUS_LIBS (see the header)" if
      ENV["PGBUS_HUB_FALCON_LIB"].to_s.empty? || ENV["PGBUS_HUB_REAL_PGBUS_LIBS"].to_s.empty?
    skip "no PostgreSQL at #{TestDatabase.url}" unless TestDatabase.available?
    @dir = Dir.mktmpdir("pgbus-falcon")
    @port = TCPServer.new("127.0.0.1", 0).then { |socket| socket.addr[1].tap { socket.close } }
    @database = "pgbus_hub_falcon_#{::Process.pid}_#{rand(1 << 30).to_s(36)}"
    TestDatabase.with { |conn| conn.exec("create database #{@database}") }
    @url = TestDatabase.keywords(dbname: @database)
  end

  after do
    (::Process.kill("TERM", -@falcon) rescue nil) if @falcon # rubocop:disable Style/RescueModifier
    (::Process.wait(@falcon) rescue nil) if @falcon # rubocop:disable Style/RescueModifier
    [@serve, @restarted].compact.each { |serve| serve.stop.tap { serve.cleanup } }
    TestDatabase.with { |conn| conn.exec("drop database if exists #{@database} with (force)") } if @database
    FileUtils.rm_rf(@dir) if @dir
  end

  def census
    PG.connect(@url) { |conn| Census::Count.new(TestDatabase.census_rows(conn)) }
  end

  def get(path) = Net::HTTP.get(URI("http://127.0.0.1:#{@port}#{path}"))

  # pgmq's tables without the extension, and the two of pgbus's that its streams touch.
  def install_pgbus_schema
    script = <<~RUBY
      require "pg"; require "pgbus"
      PG.connect(ARGV[0]) do |conn|
        conn.exec(Pgbus::PgmqSchema.install_sql)
        conn.exec("CREATE TABLE pgbus_stream_queues (id bigserial PRIMARY KEY, queue_name varchar NOT NULL UNIQUE,
                     created_at timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP);
                   CREATE TABLE pgbus_stream_stats (id bigserial PRIMARY KEY, stream_name varchar NOT NULL,
                     event_type varchar NOT NULL, duration_ms integer NOT NULL DEFAULT 0, fanout integer,
                     created_at timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP)")
      end
    RUBY
    system({ "RUBYLIB" => ENV.fetch("PGBUS_HUB_REAL_PGBUS_LIBS") }, RbConfig.ruby, "-e", script, @url, exception: true)
  end

  # Debian has no async-http-cache, which Falcon's server.rb requires but uses only with --cache
  # (never given here): an empty module stands in. Sid's json 3.x is newer than process-metrics allows.
  def falcon_shims
    shims = File.join(@dir, "shims")
    FileUtils.mkdir_p(File.join(shims, "async/http"))
    File.write(File.join(shims, "async/http/cache.rb"), "module Async; module HTTP; module Cache; end; end; end\n")
    File.write(File.join(shims, "falcon_gems.rb"), %(gem "json", "~> 2"\n))
    shims
  end

  def start_falcon
    falcon = ENV.fetch("PGBUS_HUB_FALCON_LIB")
    env = { "RUBYLIB" => [File.join(ROOT, "lib"), ENV.fetch("PGBUS_HUB_REAL_PGBUS_LIBS")].join(File::PATH_SEPARATOR),
            "DATABASE_URL" => @url, "RAILS_ENV" => "production", "PGBUS_E2E_STATE_DIR" => @dir,
            "PGBUS_STREAMS_HUB_SOCKET" => @serve.socket }
    shims = falcon_shims
    @falcon = ::Process.spawn(env, RbConfig.ruby, "-I", shims, "-rfalcon_gems", "-I", falcon,
                              File.join(falcon, "../bin/falcon"), "serve", "--bind", "http://127.0.0.1:#{@port}",
                              "--count", "4", "--config", "config.ru",
                              chdir: APP, pgroup: true, out: File.join(@dir, "falcon.log"), err: %i[child out])
    wait_for("Falcon to serve", timeout: 60) { (get("/pid") rescue nil) } # rubocop:disable Style/RescueModifier
  end

  # Broadcast (again each second: a NOTIFY right at a switch of connection can precede a
  # LISTEN, and ephemeral payloads are not replayed) until every client has it.
  def expect_every_client_reached(batches, message)
    missing = -> { batches.flat_map { |clients| clients.missing(message) } }
    wait_for("#{message} at every client", timeout: 15, interval: 0, detail: -> { missing.call.inspect }) do
      get("/broadcast?s=falcon&m=#{message}")
      wait_for(nil, timeout: 1) { missing.call.empty? }
    end
  end

  # Clients served by each Falcon process (pid => count).
  def served = Dir[File.join(@dir, "clients-*.log")].to_h { |f| [f[/clients-(\d+)/, 1], File.readlines(f).size] }

  it "4 processes, census 1, every process's clients served; sidecar killed: census 4; restarted: census 1" do
    install_pgbus_schema
    @serve = ServeProcess.new(@url, pgbus: true)
    start_falcon
    token = get("/token?s=falcon")
    # The kernel hands connections to whichever process accepts first: batches until all 4 serve some.
    batches = []
    until served.size == 4 || batches.size == 16
      batches << SseClients.new(@port, token, 4)
      wait_for(nil, timeout: 5) { served.values.sum == batches.size * 4 }
    end
    expect(served.size).to eq(4)
    expect_every_client_reached(batches, "via-the-sidecar")
    expect(census).to eq(1)

    expect(@serve.stop("KILL").termsig).to eq(9)
    expect(wait_for("census 4", timeout: 15, detail: -> { "census #{census}" }) { census == 4 }).to be(true)
    expect_every_client_reached(batches, "each-on-its-own-connection")

    restarted_at = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
    @restarted = ServeProcess.new(@url, socket: @serve.socket, pgbus: true)
    wait_for("census 1 again", timeout: 15, interval: 0.05) { census == 1 }
    back_s = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - restarted_at
    expect_every_client_reached(batches, "via-the-restarted-sidecar")
    batches.each(&:close)
    warn format("  [falcon: %d SSE clients, per process %s; census 1, 4 with the sidecar killed, " \
                "1 again %.2f s after it restarted; every client got every broadcast]",
                batches.size * 4, served.values.sort.inspect, back_s)
  end
end
