# frozen_string_literal: true

require "fileutils"
require "rbconfig"
require "tmpdir"
require_relative "wait"

PGBUS_HUB_EXE = File.expand_path("../../exe/pgbus-hub", __dir__)

# A `pgbus-hub serve` child, configured by a --config file (Pgbus::Hub.configure,
# the standalone apps' channels: no prefix or suffix; pgbus's with pgbus: true),
# logging to a file.
class ServeProcess
  attr_reader :pid, :socket, :log_path, :out_path

  # tmpdir: its TMPDIR, where the default socket path is (then no --socket);
  # socket: a path of the caller's (a restarted sidecar serves the same one).
  # args: more of serve's options (--metrics-port...).
  def initialize(url, tmpdir: nil, socket: nil, pgbus: false, args: [])
    @dir = Dir.mktmpdir("pgbus-serve")
    @socket = socket || (tmpdir ? File.join(tmpdir, Pgbus::Hub.socket_name("serve")) : File.join(@dir, "hub.sock"))
    @log_path = File.join(@dir, "serve.log")
    @out_path = File.join(@dir, "out")
    config = File.join(@dir, "hub.rb")
    File.write(config, <<~RUBY)
      Pgbus::Hub.configure do |c|
        c.connection = #{url.inspect}
        #{pgbus ? '' : 'c.channel_prefix = ""; c.channel_suffix = ""'}
      end
    RUBY
    env = { "RUBYLIB" => File.expand_path("../../lib", __dir__), "TMPDIR" => tmpdir, "PGBUS_STREAMS_HUB_SOCKET" => nil }
    socket_flag = tmpdir && !socket ? [] : ["--socket", @socket]
    @pid = ::Process.spawn(env, RbConfig.ruby, PGBUS_HUB_EXE, "serve", *socket_flag,
                           "--config", config, "--log", @log_path, *args, out: @out_path, err: %i[child out])
    wait_for("serve to listen", timeout: 30) { output.include?("export ") }
  end

  def output = File.read(@out_path)
  def log = File.exist?(@log_path) ? File.read(@log_path) : ""
  def signal(name) = ::Process.kill(name, @pid)

  # The exit status after `signal` (nil if it did not exit within 15 s).
  def stop(signal = "TERM")
    return @status if @status

    ::Process.kill(signal, @pid)
    @status = wait_for(nil, timeout: 15) { ::Process.waitpid2(@pid, ::Process::WNOHANG)&.last }
  ensure
    (::Process.kill("KILL", @pid) rescue nil) unless @status # rubocop:disable Style/RescueModifier
  end

  # The exit status once it exits on its own (a newer serve took its socket over), nil after `timeout`.
  def exited(timeout: 15)
    @status ||= wait_for(nil, timeout: timeout) { ::Process.waitpid2(@pid, ::Process::WNOHANG)&.last }
  end

  def cleanup = FileUtils.rm_rf(@dir)
end
