# frozen_string_literal: true

# Issue 56 item 4: Puma's main branch carries puma#3940 (notify_safely writes with syswrite), meant
# to fix the stop wedge (puma#3677, docs/puma-stop-wedge.md). On Ruby 3.3.8 it does not: a syswrite
# from the TERM trap leaves IOError "stream closed in another thread" and IOError's closer waiting,
# as `<<` did (measured 2026-12-07: without the plugin 2 of 12 worker stops lasted until the
# master's kill at 30 s). So the plugin keeps its stop watch on every Puma (no version check: that
# Puma also reports 8.0.2), and this spec shows it on Puma main: each worker either closes its pipes
# with the watch running and untouched, or is stuck in IO#close and ended by the watch; every one
# exits on its own, none waits for the master's kill.
# Opt-in and local: PGBUS_HUB_PUMA_DIR names a checkout of a Puma with puma#3940, its C extension
# built for this Ruby (docs/deploys.md, "`rake stops`"); without one the spec is skipped. Real
# clusters (4 workers, spec/support/stops/puma.rb, worker_shutdown_timeout 30 s), booted and
# stopped with TERM CYCLES times.
RSpec.describe "plugin :pgbus_hub on Puma main (puma#3940)", :puma do
  MAIN_PUMA_CYCLES = Integer(ENV.fetch("PGBUS_HUB_PUMA_MAIN_CYCLES", "20"))

  before do
    skip "opt-in: PGBUS_HUB_PUMA_DIR=<a Puma checkout with puma#3940, its C extension built>" if ENV["PGBUS_HUB_PUMA_DIR"].to_s.empty?
    require_relative "support/stops/cluster" # pg and a Puma: loaded only when asked for
  end

  after do
    @cluster&.stop
    @cluster&.cleanup
  end

  def probed_cluster
    wedge = File.join(PumaCluster::ROOT, "spec/support/stops/wedge") # its config.ru (/pid) and plugin :stop_watch_probe
    env = { "PGBUS_E2E_RACKUP" => File.join(wedge, "config.ru"),
            "RUBYLIB" => [File.join(PumaCluster::ROOT, "lib"), wedge, *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR) }
    @cluster = Stops::Cluster.new(mode: :standalone, plugins: "pgbus_hub,stop_watch_probe", env: env).start
    @cluster.wait_for("4 workers", timeout: 30) { @cluster.worker_pids.size == 4 }
    @cluster.wait_log(/stop_watch_probe: \d+ notify_safely in/, count: 4, timeout: 30)
    @cluster
  end

  it "ends each stop stuck in IO#close, leaves every other close alone, and no worker waits for the master's kill" do
    expect(Stops::Cluster.puma_dir_has_fix?).to be(true),
                                                "#{Stops::Cluster::PUMA_DIR}: its notify_safely does not use syswrite (no puma#3940)"
    server_rb = File.join(Stops::Cluster::PUMA_DIR, "lib", "puma", "server.rb")
    ended = closed = 0
    MAIN_PUMA_CYCLES.times do |cycle|
      c = probed_cluster
      workers = c.worker_pids
      started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      c.stop(deadline: 45) # past worker_shutdown_timeout: a worker left wedged is killed, then seen below
      took = Process.clock_gettime(Process::CLOCK_MONOTONIC) - started
      log = c.final_log
      workers.each do |pid|
        expect(log).to include("stop_watch_probe: #{pid} notify_safely in #{server_rb}")
        expect(c.marks(pid)).to include("at_exit"), "cycle #{cycle + 1}: worker #{pid} never ran its at_exit (the master killed it)"
        watch_ended = log.match?(/\[#{pid}\] .*Puma's server thread sat 0\.5 s in IO#close at #{Regexp.escape(server_rb)}:/)
        closed_itself = log.include?("stop_watch_probe: #{pid} closed, stop watch running: true")
        expect([watch_ended, closed_itself]).to contain_exactly(true, false), "cycle #{cycle + 1}, worker #{pid}:\n#{log[-3000..] || log}"
        watch_ended ? ended += 1 : closed += 1
      end
      expect(took).to be < 5, "cycle #{cycle + 1}: the stop took #{took.round(2)} s"
      c.cleanup
      @cluster = nil
    end
    RSpec.configuration.reporter.message("Puma main: #{ended + closed} worker stops, #{ended} stuck in IO#close and ended by the " \
                                         "stop watch, #{closed} closed with the watch running and untouched")
  end
end
