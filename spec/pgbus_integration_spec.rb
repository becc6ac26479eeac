# frozen_string_literal: true

require "open3"
require "rbconfig"
require_relative "support/database"

# The pgbus glue against both stand-in shapes (each in its own child process,
# zeitwerk-lazy and eager-loaded, pgbus-hub required before and after pgbus):
# the config attribute and its exact errors, Instance
# wiring (hub -> our FailoverListener, under pgbus 0.13.1+'s own, with pgbus's
# WakeMessage class; no socket -> pgbus's own Listener), failover and fail-back,
# and pgbus's #382 MasterHub backed by the native hub.
RSpec.describe "pgbus integration" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  HINT = "Must be :master (one shared LISTEN connection per web host) or :process (one per worker)"

  def probe(shape, eager:, hub_first:)
    standin = File.join(ROOT, "spec/support/pgbus_standin", shape, "lib")
    out, err, status = Open3.capture3({ "PGBUS_STANDIN_EAGER" => eager ? "1" : "0", "PGBUS_STREAMS_HUB_SOCKET" => nil },
                                      RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-I", standin,
                                      File.join(ROOT, "spec/support/pgbus_standin/probe.rb"), TestDatabase.url,
                                      hub_first ? "hub-first" : "pgbus-first")
    expect(status).to be_success, err
    JSON.parse(out.lines.last)
  end

  # pgbus-hub's ActionCable adapter beside a pgbus whose WakeMessage has no payload: its
  # messages are payloads, so its listener builds our WakeMessage, not pgbus's.
  it "ActionCable beside a pgbus before 0.13.1 (WakeMessage without a payload) delivers its messages" do
    skip "ActionCable not installed" unless Gem::Specification.find_all_by_name("actioncable").any?

    out, err, status = Open3.capture3({ "PGBUS_STREAMS_HUB_SOCKET" => nil }, RbConfig.ruby, "-I", File.join(ROOT, "lib"),
                                      "-I", File.join(ROOT, "spec/support/pgbus_standin/pre382/lib"),
                                      File.join(ROOT, "spec/support/pgbus_standin/cable_probe.rb"), TestDatabase.url)
    expect(status).to be_success, err
    report = JSON.parse(out.lines.last)
    expect(report["pgbus_wake_members"]).to eq(["queue_name"])
    expect(report.slice("confirmed", "got", "log")).to eq("confirmed" => true, "got" => "hello", "log" => [])
  end

  %w[pre382 v382].product([false, true], [false, true]).each do |shape, eager, hub_first|
    it "#{shape} (eager: #{eager}, pgbus-hub required #{hub_first ? 'first' : 'second'})" do
      r = probe(shape, eager: eager, hub_first: hub_first)
      expect(r["shape"]).to eq(shape)
      expect(r["installed"]).to eq(shape == "pre382" ? "pre_hub" : "hub_era")
      expect(r["default_scope"]).to eq("master")
      expect(r["errors"]).to eq(["Invalid streams_listen_scope type: Integer. #{HINT}",
                                 "Invalid streams_listen_scope: :nope. #{HINT}",
                                 "Invalid streams_listen_scope: :bogus. #{HINT}"])
      expect(r["string_scope"]).to eq("process")
      expect(r["no_socket_listener"]).to eq("Pgbus::Web::Streamer::Listener")
      # pre-hub pgbus gets our FailoverListener; 0.13.1+ keeps its own, over ours (as its hub client)
      expect(r["hub_listener"]).to eq(shape == "pre382" ? "Pgbus::Hub::FailoverListener" : "Pgbus::Web::Streamer::FailoverListener")
      expect(r["our_listener"]).to eq(shape == "pre382" ? "Pgbus::Hub::FailoverListener" : "Pgbus::Hub::FailoverListenerAsHubClient")
      expect(r["subscribe"]).to eq("done")
      expect(r["hub_workers"]).to eq(1)
      expect(r["failed_over"]).to be(true)
      expect(r["pgbus_failed_over"]).to be(false) # ours failed over; pgbus's, which never comes back, did not
      expect(r["socket_left"]).to be(false)
      expect(r["back_on_hub"]).to be(true) # the hub started again at the same socket
      expect(r["durable_after_fail_back"]).to include("queue_name" => "pgbus_probe")
      expect(r["hub_workers_after_fail_back"]).to eq(1)
      if shape == "pre382"
        expect(r["ephemeral"]).to eq({ "queue_name" => "pgbus_probe" }) # old WakeMessage: durable wake
        expect(r["durable_after_failover"]).to eq({ "queue_name" => "pgbus_probe" })
      else
        expect(r["ephemeral"]).to eq({ "queue_name" => "pgbus_probe", "payload" => "eph" })
        expect(r["durable_after_failover"]).to eq({ "queue_name" => "pgbus_probe", "payload" => nil })
        expect(r["pgbus_master_hub_native"]).to eq("Pgbus::Hub::MasterHub")
        expect(r["pgbus_master_hub_dropped"]).to eq(0)
        expect(r["pgbus_master_hub_socket_left"]).to be(false)
        # pgbus's MasterHub.new tuning where Pgbus::Hub.configure left the default; else ours, one WARN.
        expect([r["tuning_pgbus_only"], r["tuning_both"]]).to eq([7, 9])
        expect(r["tuning_warnings"]).to eq(["[pgbus-hub] durable_queue_limit: 9 from Pgbus::Hub.configure applies, " \
                                            "not 7 from pgbus's MasterHub.new"])
      end
    end
  end
end
