# frozen_string_literal: true

require "socket"
require "uri"
require_relative "wait"
require_relative "census"
begin
  require "pg"
rescue LoadError
  # A Ruby Debian builds no ruby-pg for (3.4 in CI): psql answers the suite's own queries.
  require_relative "psql_connection"
end

# The real local PostgreSQL the suite talks to (no mocks). bin/setup creates
# the pgbus_hub_test role and database; CI exports PGBUS_HUB_TEST_DATABASE_URL.
module TestDatabase
  module_function

  # bin/setup's test role, over TCP as CI has it: the README's `bash bin/setup && rake test` runs
  # what CI runs (HeldRelay finds its backend by its TCP client port; a Unix socket has none).
  SETUP_URL = "postgres://pgbus_hub_test:pgbus-hub@127.0.0.1:5432/pgbus_hub_test"

  def url
    ENV["PGBUS_HUB_TEST_DATABASE_URL"] || ENV["DATABASE_URL"] || SETUP_URL
  end

  # The suite's own connection: ruby-pg's, else a psql session (PsqlConnection), which answers the
  # same calls for what the specs do with it (census, NOTIFY, terminate, create a database).
  def connect(server = url)
    defined?(PG) ? PG.connect(server) : PsqlConnection.new(server)
  end

  def error_class = defined?(PG) ? PG::Error : PsqlConnection::Error

  # A connection string (URL or keywords) as a Hash of its libpq keywords (symbols).
  def conninfo(server = url)
    return PG::Connection.conninfo_parse(server).select { |o| o[:val] }.to_h { |o| [o[:keyword].to_sym, o[:val]] } if defined?(PG)

    if server.match?(%r{\Apostgres(?:ql)?://})
      uri = URI.parse(server)
      parts = { user: uri.user, password: uri.password, host: uri.host, port: uri.port&.to_s,
                dbname: uri.path.delete_prefix("/") }.transform_values { |v| v && URI.decode_www_form_component(v) }
      parts.merge(URI.decode_www_form(uri.query.to_s).to_h.transform_keys(&:to_sym)).reject { |_, v| v.nil? || v.empty? }
    else
      server.scan(/(\w+)\s*=\s*(?:'((?:[^'\\]|\\.)*)'|(\S+))/).to_h { |key, quoted, bare| [key.to_sym, quoted ? quoted.gsub(/\\(.)/, '\1') : bare] }
    end
  end

  # The test database's connection (URL or keywords) as a libpq keyword
  # string with some keywords replaced, e.g. keywords(host: "127.0.0.1").
  def keywords(**overrides)
    conninfo.merge(overrides.transform_values(&:to_s))
            .map { |key, value| "#{key}='#{value.gsub(/['\\]/) { |c| "\\#{c}" }}'" }.join(" ")
  end

  # Set to 1 on a machine without PostgreSQL to let the specs that need it
  # skip. Unset, a missing server fails them: the suite must never pass by
  # testing nothing. `rake test` and `.ci/run` never set it.
  SKIP_VARIABLE = "PGBUS_HUB_SKIP_PG_TESTS"

  # A raw socket to the test database's server (for proxies between a client and it).
  def server_socket
    info = conninfo
    host = info[:host] || "/var/run/postgresql"
    port = (info[:port] || 5432).to_i
    host.start_with?("/") ? UNIXSocket.new(File.join(host, ".s.PGSQL.#{port}")) : TCPSocket.new(host, port)
  end

  def available?
    return @available unless @available.nil?

    @available = answers?(url)
  end

  # Whether `server` (a URL or keywords) answers. If not, raises (the example
  # fails) unless SKIP_VARIABLE lets the caller skip.
  def answers?(server)
    connect(server).close
    true
  rescue error_class => e
    why = "PostgreSQL not reachable at #{server} (#{e.message.strip})"
    raise "#{why}; set #{SKIP_VARIABLE}=1 to skip the PostgreSQL specs on a machine without a server" unless ENV[SKIP_VARIABLE] == "1"

    warn "#{why}: skipped (#{SKIP_VARIABLE}=1)"
    false
  end

  def notify(queue, payload = "", prefix: "pgmq.q_", suffix: ".INSERT")
    with { |conn| conn.exec_params("select pg_notify($1, $2)", ["#{prefix}#{queue}#{suffix}", payload]) }
  end

  # Rows tagged application_name in pg_stat_activity, once the count holds
  # still for 0.2 s: backends of an earlier example may still be closing.
  # A Census::Count: compared as an Integer, inspected with each backend's owner.
  def census(application_name = "pgbus-listen")
    read = lambda do
      with do |conn|
        # This database only: another suite on the same server has its own.
        Census::Count.new(census_rows(conn, application_name))
      end
    end
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 5
    count = read.call
    loop do
      sleep 0.2
      again = read.call
      return again if again == count || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline

      count = again
    end
  end

  # This database's backends tagged application_name (pid, client_port, backend_start).
  def census_rows(conn, application_name = "pgbus-listen")
    conn.exec_params("select pid, client_port, backend_start from pg_stat_activity " \
                     "where application_name = $1 and datname = current_database() order by pid",
                     [application_name]).to_a
  end

  def with
    @conn = nil if @conn&.finished? || @conn_pid != Process.pid
    @conn_pid = Process.pid
    @conn ||= connect
    yield @conn
  end
end

# A worker speaking the hub protocol by hand (pgbus's HubClient wire behaviour).
class WirePeer
  attr_reader :socket

  def initialize(path)
    @socket = UNIXSocket.new(path)
  end

  def send_frame(message)
    @socket.write(Pgbus::Hub::Protocol.encode(message))
  end

  def next_frame(timeout: 5)
    return nil unless @socket.wait_readable(timeout)

    Pgbus::Hub::Protocol.read_frame(@socket)
  end

  def next_non_status(timeout: 5)
    loop do
      frame = next_frame(timeout: timeout)
      return frame unless frame && frame["t"] == "status"
    end
  end

  def subscribe(queue)
    send_frame({ "t" => "sub", "q" => queue })
    loop do
      frame = next_non_status
      raise "no ack for #{queue}" if frame.nil?
      return frame if frame["t"] == "ack" && frame["q"] == queue
    end
  end

  def close
    @socket.close unless @socket.closed?
  end
end

