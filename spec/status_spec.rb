# frozen_string_literal: true

require "tmpdir"
require "json"
require "open3"
require "rbconfig"
require_relative "support/database"
require_relative "support/ruby_hub_peer"

RSpec.describe "Pgbus::Hub.stats and `pgbus-hub status`" do
  let(:exe) { File.join(ROOT, "exe", "pgbus-hub") }

  def status(*args)
    out, st = Open3.capture2e({ "RUBYLIB" => File.join(ROOT, "lib") }, RbConfig.ruby, exe, "status", *args)
    [out, st.exitstatus]
  end

  it "reports a healthy hub (exit 0), with counters and the census" do
    skip "no PostgreSQL" unless TestDatabase.available?
    Dir.mktmpdir do |dir|
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "h.sock")).start
      wait_for("listener healthy") { hub.stats[:listener_healthy] }
      stats = Pgbus::Hub.stats(socket_path: hub.socket_path)
      expect(stats).to include(listener_healthy: true, threads: 1, pid: Process.pid)
      out, code = status("--socket", hub.socket_path, "--json", "--database-url", TestDatabase.url)
      expect(code).to eq(0), out
      report = JSON.parse(out)
      expect(report).to include("status" => "healthy")
      expect(report["census"]).to be >= 1
      out, code = status("--socket", hub.socket_path)
      expect([code, out]).to match([0, /healthy.*workers: \d+/m])
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
end
