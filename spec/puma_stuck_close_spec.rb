# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"

# Issue 49: a Puma server that stops (6.6 to 8.0.2, and main with puma#3940: spec/puma_main_stop_spec.rb)
# can wedge for good in IO#close of its notify pipe (puma#3677, docs/deploys.md); the worker then
# lives until the master kills it at worker_shutdown_timeout. `plugin :pgbus_hub` ends a server
# thread that sat 0.5 s in IO#close as it stopped. The wedge is made on purpose here
# (spec/support/stops/wedge: a close that never returns), the race being rare: a real 1-worker
# cluster, stopped with TERM (config.rb: worker_shutdown_timeout 5).
RSpec.describe "a Puma server wedged in IO#close as it stops", :puma do
  include PumaE2E

  WEDGE = File.join(ROOT, "spec/support/stops/wedge")

  after { stop_clusters }

  def wedged_cluster(plugins)
    env = { "PGBUS_E2E_RACKUP" => File.join(WEDGE, "config.ru"),
            "RUBYLIB" => [File.join(ROOT, "lib"), WEDGE, *ENV["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR) }
    c = cluster(mode: :standalone, workers: 1, plugins: plugins, env: env)
    c.wait_for("1 worker", timeout: 30) { c.worker_pids.size == 1 }
    [c, c.worker_pids.first]
  end

  it "is ended by plugin :pgbus_hub: the worker exits on its own, not by the master's kill" do
    c, worker = wedged_cluster("pgbus_hub,wedge_stop")
    c.stop
    expect(c.stopped_cleanly?).to be(true)
    expect(c.final_log).to include("wedge_stop: #{worker} wedged")
    expect(c.final_log).to match(/\[#{worker}\] .*Puma's server thread sat 0\.5 s in IO#close/)
    expect(c.final_log).to include("wedge_stop: #{worker} exited on its own")
  end

  it "without the plugin lasts until the master kills the worker (the wedge is real)" do
    c, worker = wedged_cluster("wedge_stop")
    c.stop
    expect(c.final_log).to include("wedge_stop: #{worker} wedged")
    expect(c.final_log).not_to include("wedge_stop: #{worker} exited on its own")
  end
end
