# frozen_string_literal: true

# The stop harness's short form (issue 49, docs/deploys.md; `rake stops` runs the long one):
# the soak's Rails app on a 4-worker Puma (worker_shutdown_timeout 30 s), 16 WebSocket + 16
# streaming HTTP clients, 10 msg/s, pgbus_hub only: 3 cycles of boot, hot restart (USR2) and
# TERM, then 3 phased restarts (USR1) of a cluster without preload_app! and its TERM. Opt-in
# (Rails 7.2: the trixie chroot): PGBUS_HUB_STOPS=1, or `rake stops SHORT=1`. PGBUS_STOPS_*
# variables override its settings.
RSpec.describe "stops, short form: TERM, hot and phased restarts of a Rails app with clients attached", :stops do
  SHORT_STOPS = { "PGBUS_STOPS_N" => "3", "PGBUS_STOPS_CONTROL" => "0" }.freeze

  before do
    skip "opt-in: PGBUS_HUB_STOPS=1 or rake stops SHORT=1" unless ENV["PGBUS_HUB_STOPS"] == "1"
    require_relative "support/stops/runner" # needs pg, puma and Rails 7.2: loaded only when asked for
    skip "no PostgreSQL binaries for a private cluster" unless PrivateCluster.available?
  end

  it "leaves no worker to the master's kill, every client served again, none lost while connected" do
    settings = Stops::Settings.from_env(SHORT_STOPS.merge(ENV.to_h.select { |key, _| key.start_with?("PGBUS_STOPS_") }))
    data = Stops::Runner.new(settings).run
    kinds = data[:apps].fetch("pgbus_hub")[:kinds]
    expect(kinds.keys).to include("term", "usr2", "usr1")
    kinds.each do |kind, k|
      # A worker the master had to SIGKILL (at worker_shutdown_timeout) never ran its at_exit.
      expect(k[:killed]).to eq(0), "#{kind}: workers killed by the master: #{k[:lingering]}"
      expect(k[:lost_while_connected]).to eq(0), "#{kind}: lost while connected"
    end
    expect(data[:apps]["pgbus_hub"][:stops].select { |s| %w[usr2 usr1].include?(s[:kind]) }.map { |s| s[:served_s] }).to all(be_a(Float))
  end
end
