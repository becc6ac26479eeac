# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"

# A real `puma -C` cluster (4 workers, preload_app!), real PostgreSQL, real
# sockets: for standalone and both pgbus shapes, in both $LOAD_PATH orders of
# the two puma/plugin/pgbus_streams.rb files (and zeitwerk eager loading),
# exactly ONE pgbus-listen connection serves every worker, a NOTIFY reaches
# every worker, and stop leaves no socket, no process and runs pgbus's teardown.
RSpec.describe "Puma cluster on one LISTEN connection", :puma do
  include PumaE2E

  before { skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available? }
  after { stop_clusters }

  [
    { mode: :standalone },
    { mode: :pgbus, shape: "pre382", order: :ours_first },
    { mode: :pgbus, shape: "pre382", order: :pgbus_first },
    { mode: :pgbus, shape: "pre382", order: :ours_first, eager: true },
    { mode: :pgbus, shape: "v382", order: :ours_first },
    { mode: :pgbus, shape: "v382", order: :pgbus_first },
    { mode: :pgbus, shape: "v382", order: :pgbus_first, eager: true },
    { mode: :pgbus, shape: "v382", order: :pgbus_first, plugins: "pgbus_streams,pgbus_hub" },
    { mode: :pgbus, shape: "pre382", order: :pgbus_first, plugins: "pgbus_hub" },
    { mode: :pgbus, shape: "v382", order: :pgbus_first, puma_rb_requires: "pgbus" }, # pgbus's MasterHubBoot runs too
    { mode: :pgbus, shape: "pre382", order: :pgbus_first, puma_rb_requires: "pgbus" },
    { mode: :pgbus, shape: "v382", order: :ours_first, puma_rb_requires: "pgbus,pgbus/hub" },
    { mode: :pgbus, shape: "v382", plugins: "" } # no plugin at all: the gem alone, under preload_app!
  ].each do |options|
    it "census 1 for 4 subscribed workers, wakes everywhere, clean stop: #{options}" do
      c = cluster(**options)
      c.wait_log(/master hub listening at/)
      # The Ruby 3.3 stage runs this file again on a Puma it did not install (8.x): prove which one ran.
      expect(c.log).to include("Puma version: #{ENV['PGBUS_E2E_PUMA_VERSION']}") if ENV["PGBUS_E2E_PUMA_VERSION"]
      # ...and with PGBUS_E2E_RUBY, on which Ruby.
      expect(c.log).to include("Ruby version: ruby #{ENV['PGBUS_E2E_RUBY_VERSION']}") if ENV["PGBUS_E2E_RUBY_VERSION"]
      # whichever plugin file Puma loaded, the hub listens before the first worker forks
      c.wait_log(/Worker \d \(PID: \d+\) booted/)
      expect(c.log.index(/master hub started before fork/)).to be < c.log.index(/Worker \d \(PID: \d+\) booted/)
      stream = unique_stream
      subs = c.subscribe_all(stream)
      # pgbus 0.13.1+ keeps its own FailoverListener (over our native HubClient); older pgbus and standalone get ours
      listener = options[:shape] == "v382" ? "Pgbus::Web::Streamer::FailoverListener" : "Pgbus::Hub::FailoverListener"
      expect(subs.values.map { |s| s["listener"] }.uniq).to eq([listener])
      expect(subs.values.map { |s| s["result"] }.uniq).to eq(["done"])
      expect(c.census_settles_at(1)).to eq(1)
      expect_wake_everywhere(c, subs.keys, stream, "<p>hi #{stream}</p>")
      expect(c.hub_info).to include("running" => true)
      expect(c.hub_info["stats"]).to include("workers" => 4, "channels" => 1)
      socket = c.socket_path
      expect(File.socket?(socket)).to be(true)
      c.stop
      expect(c.stopped_cleanly?).to be(true)
      expect(File.exist?(socket)).to be(false)
      expect(c.final_log.scan(/master hub at \S+ stopped/).size).to eq(1), c.final_log.lines.last(30).join
      # pgbus's teardown runs from our plugin; pgbus's own plugin registers it for Puma 7+ only
      ours = (options[:order] != :pgbus_first && options[:plugins] != "") || options[:plugins].to_s.include?("pgbus_hub")
      expect(c.final_log).to match(/\[Pgbus::Streamer\] reset! \(pid \d+\)/) if options[:mode] == :pgbus && ours
      # pgbus's own plugin teardown raises ThreadError in Puma 7/8's trap context (its bug, not ours).
      expect(c.final_log.lines.grep_v(/\[Pgbus::Puma::Plugin\]/).join).not_to match(/failed to start|Error|raised/)
      expect(c.final_log).not_to include("Thread(s) started in app boot") # Puma 7+: our master threads are fork-safe
    end
  end
end
