# frozen_string_literal: true

require "securerandom"
require "socket"

# `rake stops` with real pgbus (opt-in: PGBUS_HUB_REAL_PGBUS_LIBS, colon-separated lib dirs of
# pgbus, pgmq-ruby and fugit, as spec/real_pgbus_spec.rb; never shipped with this project):
# the soak's app also serves pgbus's own SSE streams (Pgbus::Web::StreamApp at /pgbus/streams,
# spec/support/soak/app/config/pgbus_sse.rb) under `plugin :pgbus_streams`. The gem's app loads
# pgbus-hub too (its lib first: its `pgbus_streams` plugin serves); the control loads pgbus
# alone (pgbus's own plugin and Ruby MasterHub, Rails' postgresql adapter for ActionCable).
# Messages go through pgbus's stream broadcast (Pgbus::Streams::Stream#broadcast, ephemeral:
# pgbus's default mode) from the harness, beside the ActionCable NOTIFY.
module Stops
  module PgbusSse
    SECRET = "stops-pgbus-sse-#{'0' * 48}".freeze
    # pgbus's install migration (lib/generators/pgbus/templates: migration.rb.erb with
    # pgmq_schema_mode :embedded, add_stream_queues, add_stream_stats) without Rails' migrator:
    # the tables its streams touch.
    STREAM_TABLES = <<~SQL
      CREATE TABLE pgbus_stream_queues (id bigserial PRIMARY KEY, queue_name varchar NOT NULL,
        created_at timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP);
      CREATE UNIQUE INDEX idx_pgbus_stream_queues_queue_name ON pgbus_stream_queues (queue_name);
      CREATE TABLE pgbus_stream_stats (id bigserial PRIMARY KEY, stream_name varchar NOT NULL,
        event_type varchar NOT NULL, duration_ms integer NOT NULL DEFAULT 0, fanout integer,
        created_at timestamp(6) NOT NULL DEFAULT CURRENT_TIMESTAMP);
    SQL

    module_function

    def libs(env = ENV) = env["PGBUS_HUB_REAL_PGBUS_LIBS"].to_s.split(File::PATH_SEPARATOR).reject(&:empty?)

    # Real pgbus in the harness (after this project's lib): the publisher's broadcasts, the tokens.
    def load!(libs)
      missing = libs.reject { |dir| File.directory?(dir) }
      raise ArgumentError, "PGBUS_HUB_REAL_PGBUS_LIBS: no such directory #{missing.join(', ')} (bind it: PGBUS_HUB_CHROOT_BIND)" if missing.any?

      $LOAD_PATH.concat(libs - $LOAD_PATH)
      require "pgbus"
      Pgbus.configure { |c| c.streams_signed_name_secret = SECRET }
    end

    def install_schema(conn)
      conn.exec(Pgbus::PgmqSchema.install_sql)
      conn.exec(Pgbus::PgmqSchema.version_tracking_sql)
      conn.exec(STREAM_TABLES)
    end
  end

  # Soak::App with pgbus's SSE: WebSocket clients on ActionCable as before, and SSE clients on
  # pgbus's StreamApp in place of the gem's streaming HTTP ones.
  class PgbusSseApp < Soak::App
    attr_reader :sse_stream

    def initialize(adapter, pg, tag, cluster:, env:, libs:)
      @sse_stream = "soaksse_#{SecureRandom.hex(6)}"
      ours = adapter == "pgbus_hub" ? [File.join(PumaCluster::ROOT, "lib")] : []
      rubylib = [*ours, *libs, *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR)
      super(adapter, pg, tag, cluster: cluster,
                              env: env.merge("RUBYLIB" => rubylib, "PGBUS_E2E_PLUGINS" => "pgbus_streams",
                                             "SOAK_PGBUS_SSE" => "1", "SOAK_PGBUS_SECRET" => PgbusSse::SECRET))
    end

    def open_clients(count, deadline)
      token = Pgbus::Streams::SignedName.sign(@sse_stream)
      count.times do |k|
        @clients << Soak::CableSoakClient.new("#{@adapter}/cable#{k}", @puma.port, @cable_room, deadline: deadline)
        @clients << PgbusSseClient.new("#{@adapter}/sse#{k}", @puma.port, token, state_dir: @puma.state_dir, deadline: deadline)
      end
    end
  end

  # A client of pgbus's SSE endpoint, as EventSource would be but without Last-Event-ID (ephemeral
  # broadcasts have no replay). Served (confirmed) at its first broadcast: pgbus's
  # `pgbus:connected` event comes before the worker LISTENs (its dispatcher subscribes after the
  # hijack), so only a message received says the path works; the harness publishes from before
  # these clients connect. Its worker: the one whose authorize hook recorded this session's key
  # (STATE_DIR/sse-KEY).
  class PgbusSseClient < Soak::StreamSoakClient
    Conn = Struct.new(:socket, :reader, :key, :pid, :ready, :ended_at, :rows)

    def initialize(name, port, token, state_dir:, deadline:)
      @state_dir = state_dir
      super(name, port, token, deadline: deadline)
    end

    private

    def open_connection
      key = "#{@name.tr('/', '-')}-#{SecureRandom.hex(4)}"
      socket = Socket.tcp("127.0.0.1", @port, connect_timeout: 2)
      socket.write("GET /pgbus/streams/#{@channel}?session=#{key} HTTP/1.1\r\nhost: 127.0.0.1\r\n" \
                   "accept: text/event-stream\r\n\r\n")
      conn = Conn.new(socket, nil, key, nil, nil, nil, [])
      conn.reader = Thread.new { read(conn) }
      conn
    end

    def read(conn)
      headers = true
      event = nil
      while (line = conn.socket.gets)
        at = Soak.now
        if headers
          headers = false if line == "\r\n"
        elsif line.start_with?("event: ")
          event = line.chomp.delete_prefix("event: ")
        elsif line.start_with?("data: ")
          if event == "pgbus:connected"
            conn.pid = Integer(File.read(File.join(@state_dir, "sse-#{conn.key}")))
          elsif (seq = line[/\Adata: (\d+) /, 1])
            @lock.synchronize { conn.rows << [Integer(seq), at] }
            conn.ready ||= [conn.pid, at] if conn.pid
          end
        elsif line == "\n"
          event = nil
        end
      end
    rescue IOError, SystemCallError, ArgumentError
      nil
    ensure
      conn.ended_at = Soak.now
    end
  end

  # Soak::Publisher with pgbus: each message is also broadcast on the app's pgbus stream ("SEQ T"),
  # through pgbus's client on the app's database, before its ActionCable NOTIFY (Soak::Publisher's,
  # which records it; the gem's app also gets the NOTIFY for the soak's own streams, unheard here).
  class PgbusSsePublisher < Soak::Publisher
    def initialize(pg, apps, rate:, log:)
      super
      @streams = apps.to_h do |app|
        config = Pgbus::Configuration.new
        config.database_url = pg.url(dbname: app.db)
        config.pgmq_schema_mode = :embedded
        [app.adapter, Pgbus::Streams::Stream.new(app.sse_stream, client: Pgbus::Client.new(config), durable: false)]
      end
    end

    private

    def publish(conns, app, seq)
      @streams.fetch(app.adapter).broadcast("#{seq} #{Soak.now}")
      super
    rescue StandardError => e # pgbus's or pgmq's own, on its connection: not recorded, as a failed NOTIFY
      @errors[app.adapter] += 1
      @log.call("broadcast #{seq} to #{app.adapter} failed: #{e.class}: #{e.message.lines.first&.strip}") if @errors[app.adapter] % 20 == 1
    end
  end
end
