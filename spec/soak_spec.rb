# frozen_string_literal: true

# The soak's short form (docs/soak.md, "The short form"): the
# Rails 7.2 app of spec/support/soak on a private cluster, 16 WebSocket + 16
# streaming HTTP clients, five faults 30 s apart (terminate the LISTEN backend,
# kill -9 a worker, SIGSTOP a worker for 15 s, USR2 to the master, the database
# path black-holed for 10 s: the hub's given-up connection hands its backlog
# over, nothing lost), pgbus_hub only. Opt-in (about 3 minutes, Rails 7.2: the
# trixie chroot): PGBUS_HUB_SOAK=1, or `rake soak SHORT=1`. PGBUS_SOAK_*
# variables override its settings.
RSpec.describe "soak, short form: a fault every 30 s on a Rails app", :soak do
  SHORT_FORM = { "PGBUS_SOAK_FAULTS" => "terminate_listen,kill9,sigstop,usr2,blackhole",
                 "PGBUS_SOAK_INTERVAL" => "30", "PGBUS_SOAK_MINUTES" => "2.5", "PGBUS_SOAK_CONTROL" => "0" }.freeze

  before do
    skip "opt-in: PGBUS_HUB_SOAK=1 or rake soak SHORT=1" unless ENV["PGBUS_HUB_SOAK"] == "1"
    require_relative "support/soak/runner" # needs pg, puma and Rails 7.2: loaded only when asked for
    skip "no PostgreSQL binaries for a private cluster" unless PrivateCluster.available?
  end

  it "loses no message while a client is connected, the census back to 1 after each fault" do
    settings = Soak::Settings.from_env(SHORT_FORM.merge(ENV.to_h.select { |key, _| key.start_with?("PGBUS_SOAK_") }))
    data = Soak::Runner.new(settings).run
    expect(data[:windows].map { |w| w[:fault] }).to eq(settings.faults.cycle.first(settings.fault_count))
    data[:windows].each do |window|
      hub = window[:apps].fetch("pgbus_hub")
      expect(hub[:census][:settle_s]).not_to be_nil, "census not back to 1 after #{window[:fault]}: #{hub[:census]}"
      # After a black hole the old backend lives until it has read up to the
      # handover marker the new one committed: two for a moment.
      expect(hub[:census][:peak]).to be <= (window[:fault] == "blackhole" ? 2 : 1)
      lost = hub[:lost_connected].values.sum
      if window[:fault] == "terminate_listen"
        # A NOTIFY committed in the reconnect's gap (~10 ms) reaches nobody: only those may be lost.
        expect(hub[:lost_span_s].max || 0).to be < 1.0, "lost while connected after #{window[:fault]}: #{hub[:lost_examples]}"
      else
        expect(lost).to eq(0), "lost while connected after #{window[:fault]}: #{hub[:lost_examples]}"
      end
      expect(hub[:duplicates]).to be_empty
      # ActionCable's callbacks run one at a time in arrival order (PgbusHub::InOrder): a burst keeps NOTIFY order.
      expect(hub[:out_of_order].values.sum).to eq(0), "out of order after #{window[:fault]}: #{hub[:out_of_order]}"
    end
    expect(data[:totals]["pgbus_hub"]).to include(stopped_cleanly: true)
  end

  # Issue 57: the LISTEN backend terminated under a stream fast enough that the re-LISTEN gap loses
  # messages without a standby (150 messages/s: 512 lost in 9 terminates, issue 57); with one, the
  # standby serves on from the serving connection's last notification.
  it "with a standby loses and doubles nothing while connected through terminate_listen at 150 messages/s" do
    standby_form = SHORT_FORM.merge("PGBUS_SOAK_STANDBY" => "1", "PGBUS_SOAK_FAULTS" => "terminate_listen",
                                    "PGBUS_SOAK_RATE" => "150", "PGBUS_SOAK_MINUTES" => "1", "PGBUS_SOAK_INTERVAL" => "20")
    settings = Soak::Settings.from_env(standby_form.merge(ENV.to_h.select { |key, _| key.start_with?("PGBUS_SOAK_") }))
    data = Soak::Runner.new(settings).run
    expect(data[:settings]).to include(standby: true)
    expect(data[:windows].map { |w| w[:fault] }).to eq(settings.faults.cycle.first(settings.fault_count))
    data[:windows].each do |window|
      hub = window[:apps].fetch("pgbus_hub")
      expect(hub[:census][:settle_s]).not_to be_nil, "census not back to 2 after #{window[:fault]}: #{hub[:census]}"
      expect(hub).to include(standby_promotions: 1, reconnects: 0) # the standby served on; no re-LISTEN
      expect(hub[:lost_connected].values.sum).to eq(0), "lost while connected after #{window[:fault]}: #{hub[:lost_examples]}"
      expect(hub[:duplicates]).to be_empty
      expect(hub[:out_of_order].values.sum).to eq(0), "out of order after #{window[:fault]}: #{hub[:out_of_order]}"
    end
    expect(data[:totals]["pgbus_hub"]).to include(stopped_cleanly: true)
  end

  # Issue 56: the hub as a `pgbus-hub serve` sidecar through its planned events, a deploy's new serve
  # replacing it and a stop with a new serve 20 s later: the workers move at markers both times.
  it "in serve mode loses and doubles nothing while connected through hub_restart and hub_stop" do
    serve_form = SHORT_FORM.merge("PGBUS_SOAK_HUB" => "serve", "PGBUS_SOAK_FAULTS" => "hub_restart,hub_stop",
                                  "PGBUS_SOAK_MINUTES" => "1.4", "PGBUS_SOAK_INTERVAL" => "40")
    settings = Soak::Settings.from_env(serve_form.merge(ENV.to_h.select { |key, _| key.start_with?("PGBUS_SOAK_") }))
    data = Soak::Runner.new(settings).run
    expect(data[:settings]).to include(hub: "serve")
    expect(data[:windows].map { |w| w[:fault] }).to eq(settings.faults.cycle.first(settings.fault_count))
    data[:windows].each do |window|
      hub = window[:apps].fetch("pgbus_hub")
      expect(hub[:census][:settle_s]).not_to be_nil, "census not back to 1 after #{window[:fault]}: #{hub[:census]}"
      expect(hub[:lost_connected].values.sum).to eq(0), "lost while connected after #{window[:fault]}: #{hub[:lost_examples]}"
      expect(hub[:duplicates]).to be_empty
      expect(hub[:out_of_order].values.sum).to eq(0), "out of order after #{window[:fault]}: #{hub[:out_of_order]}"
    end
    expect(data[:totals]["pgbus_hub"]).to include(stopped_cleanly: true)
  end
end
