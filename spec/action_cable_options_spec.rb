# frozen_string_literal: true

# cable.yml's keys that reach the hub (ActionCable::SubscriptionAdapter::PgbusHub.master_options):
# standby (issue 57) among them, checked where the hub takes it.
begin
  require "action_cable"
  require "action_cable/subscription_adapter/pgbus_hub"
rescue LoadError => e
  CABLE_OPTIONS_MISSING = e.message
end

RSpec.describe "ActionCable adapter pgbus_hub's cable.yml options" do
  before { skip "needs actioncable: #{CABLE_OPTIONS_MISSING}" if defined?(CABLE_OPTIONS_MISSING) }

  def master_options(cable) = ActionCable::SubscriptionAdapter::PgbusHub.master_options(cable)

  it "passes standby to the hub (default off), and the hub refuses anything but true or false" do
    cable = { adapter: "pgbus_hub", url: "postgres://localhost/cable" }
    expect(master_options(cable)).to include(standby: false, source: "actioncable")
    expect(master_options(cable.merge(standby: true))).to include(standby: true)
    expect(master_options(cable.merge("standby" => true))).to include(standby: true)
    options = master_options(cable.merge(standby: "true")).except(:scope, :source)
    expect { Pgbus::Hub::MasterHub.new(socket_path: "/x", **options) }
      .to raise_error(ArgumentError, 'MasterHub: standby must be true or false, got "true"')
  end
end
