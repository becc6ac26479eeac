# frozen_string_literal: true

require "rbconfig"
require "timeout"

# Runs spec/support/run_hub.rb as a real child process.
class HubProcess
  attr_reader :socket_path, :pid

  def initialize(socket_path)
    @socket_path = socket_path
    lib = File.expand_path("../../lib", __dir__)
    @out, writer = IO.pipe
    @pid = Process.spawn(RbConfig.ruby, "-I", lib, File.expand_path("run_hub.rb", __dir__), socket_path,
                         TestDatabase.url, out: writer)
    writer.close
    Timeout.timeout(20) { raise "hub process did not start" unless @out.gets&.strip == "ready" }
  end

  def kill(signal = "KILL")
    Process.kill(signal, @pid)
    Process.wait(@pid)
    @pid = nil
  rescue Errno::ESRCH, Errno::ECHILD
    @pid = nil
  end

  def stop
    kill("TERM") if @pid
    @out.close unless @out.closed?
  end
end
