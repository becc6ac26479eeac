# frozen_string_literal: true

require_relative "support/helpers"

# A hub pointed at a hot standby refuses to LISTEN there (a standby never
# delivers NOTIFY: LISTEN would succeed and stay silent forever), says so, and
# follows a promotion to healthy without a restart. Private primary + standby
# clusters (initdb, pg_basebackup -R) on private ports; the shared server is never touched.
RSpec.describe "reliability 13: standby refused, promotion followed", reliability: :fast do
  before(:all) do
    next unless PrivateCluster.available?

    @primary = PrivateCluster.new
    @primary.start
    @standby = PrivateCluster.new(standby_of: @primary)
    @standby.start
  end

  after(:all) do
    @standby&.destroy
    @primary&.destroy
  end

  it "reports the standby unhealthy with the reason, then serves wakes after pg_ctl promote" do
    skip "no PostgreSQL binaries for a private cluster" unless PrivateCluster.available?
    expect(@standby.connect.exec("select pg_is_in_recovery()").getvalue(0, 0)).to eq("t")
    with_tmpdir do |dir|
      hub = RelHub.new(dir, url: @standby.url)
      wait_for("the refusal recorded") { hub.stats[:last_error].to_s.include?("recovery") }
      stats = hub.stats
      expect(stats[:listener_healthy]).to be(false)
      expect(stats[:last_error]).to include("refusing to LISTEN on a server in recovery")
      expect(hub.log).to include("refusing to LISTEN on a server in recovery")

      @standby.promote
      wait_for("healthy on the promoted server", timeout: 30) { hub.stats[:listener_healthy] }
      worker = RelWorker.new(hub.socket_path, url: @standby.url)
      expect(worker.sub("promoted")["result"]).to eq(":done")
      conn = @standby.connect
      Rel.notify("promoted", "after promote", conn: conn)
      expect(worker.wait_wake("promoted", "after promote")).to include("q" => "promoted")
      expect(Rel.census(conn: conn, db: "postgres")).to eq(1)
      expect(worker.failed_over?).to be(false)
      worker.stop
      hub.stop
    end
  end
end
