# frozen_string_literal: true

require "fileutils"
require "tmpdir"
require_relative "database"

# A throwaway PostgreSQL cluster (initdb as the postgres user when run as root,
# in a temp dir of its own, its own port) that scenarios may stop, restart and
# break, and `rake postgres` runs each release's checks against. Never the
# shared server. Binaries: PGBUS_HUB_PG_BIN, else the newest Debian package here.
class PrivateCluster
  BIN = ENV.fetch("PGBUS_HUB_PG_BIN") do
    Dir["/usr/lib/postgresql/*/bin"].max_by { |dir| dir[%r{postgresql/(\d+)/}, 1].to_i } || "/usr/lib/postgresql/bin"
  end

  attr_reader :dir, :port

  def self.available?
    File.executable?(File.join(BIN, "initdb"))
  end

  # The release the binaries are, e.g. "19".
  def self.release
    `#{File.join(BIN, "postgres")} --version`[/\d+/]
  end

  # `standby_of:` a running PrivateCluster: a streaming standby of it
  # (pg_basebackup -R, so it starts in recovery), with a port and socket of its own.
  # `tcp: true` also listens on 127.0.0.1 (the Puma specs connect there).
  def initialize(standby_of: nil, tcp: false, max_connections: 50)
    @dir = Dir.mktmpdir("pgbus-rel-pg")
    File.chmod(0o755, @dir)
    @data = File.join(@dir, "data")
    @port = 55_000 + rand(5000)
    @tcp = tcp
    @as_postgres = ::Process.euid.zero?
    FileUtils.chown("postgres", "postgres", @dir) if @as_postgres
    if standby_of
      run!("#{BIN}/pg_basebackup", "-D", @data, "-R", "-X", "stream", "-h", standby_of.dir,
           "-p", standby_of.port.to_s, "-U", "root", "--no-sync")
    else
      run!("#{BIN}/initdb", "-D", @data, "-A", "trust", "-U", "root", "-E", "UTF8", "--no-sync")
    end
    File.open(File.join(@data, "postgresql.conf"), "a") do |conf| # the last setting wins over the primary's
      conf.puts "listen_addresses = '#{tcp ? '127.0.0.1' : ''}'", "unix_socket_directories = '#{@dir}'",
                "port = #{@port}", "fsync = off", "max_connections = #{max_connections}", "shared_buffers = 16MB"
    end
  end

  def url(dbname: "postgres")
    "host=#{@tcp ? '127.0.0.1' : @dir} port=#{@port} dbname=#{dbname} user=root"
  end

  def pg_ctl(*args)
    run!("#{BIN}/pg_ctl", "-D", @data, "-l", File.join(@dir, "server.log"), "-w", "-t", "30", *args)
  end

  def start = pg_ctl("start")
  def promote = pg_ctl("promote")
  def stop(mode = "fast") = pg_ctl("-m", mode, "stop")
  def restart(mode = "fast") = pg_ctl("-m", mode, "restart")

  def connect(dbname: "postgres")
    TestDatabase.connect(url(dbname: dbname))
  end

  def destroy
    stop("immediate") rescue nil # rubocop:disable Style/RescueModifier
    FileUtils.rm_rf(@dir)
  end

  private

  def run!(*cmd)
    cmd = ["runuser", "-u", "postgres", "--", *cmd] if @as_postgres
    out = IO.popen(cmd, err: %i[child out], &:read)
    raise "#{cmd.join(' ')} failed: #{out}" unless $?.success?

    out
  end
end
