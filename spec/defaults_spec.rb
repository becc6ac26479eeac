# frozen_string_literal: true

# Every default is defined once, in the Rust core, and read from there by the
# Ruby classes (pgbus's values: it is what pgbus's own hub and clients use).
RSpec.describe "Pgbus::Hub::DEFAULTS" do
  it "holds pgbus's defaults, frozen, from the native core" do
    expect(Pgbus::Hub::DEFAULTS).to eq(health_check_ms: 250, channel_prefix: "pgmq.q_", channel_suffix: ".INSERT",
                                       durable_queue_limit: 256, hard_queue_limit: 1024, status_interval: 1.0,
                                       ack_timeout: 2.0)
    expect(Pgbus::Hub::DEFAULTS).to be_frozen
    expect(Pgbus::Hub::DEFAULTS.values.grep(String)).to all(be_frozen)
  end

  it "computes pgbus's ack budgets: the listener's health + 1 s, a worker's health + 2 s" do
    expect(Pgbus::Hub.listen_ack_timeout(250)).to eq(1.25)
    expect(Pgbus::Hub.hub_ack_timeout(250)).to eq(2.25)
    expect(Pgbus::Hub.hub_ack_timeout(1000)).to eq(3.0)
  end

  it "is what the classes default to, and no Ruby file repeats a default's literal" do
    expect(Pgbus::Hub::MasterHub::DEFAULTS).to include(Pgbus::Hub::DEFAULTS.except(:ack_timeout))
    expect(Pgbus::Hub::Listener::DEFAULTS).to include(Pgbus::Hub::DEFAULTS.slice(:health_check_ms, :channel_prefix,
                                                                                 :channel_suffix))
    expect(Pgbus::Hub::HubClient::DEFAULTS[:ack_timeout]).to eq(Pgbus::Hub::DEFAULTS[:ack_timeout])
    sources = Dir[File.expand_path("../lib/**/*.rb", __dir__)].to_h { |path| [path, File.read(path)] }
    ['"pgmq.q_"', '".INSERT"', "health_check_ms: 250", "/ 1000.0) +"].each do |literal|
      expect(sources.select { |_, text| text.include?(literal) }.keys).to be_empty, literal
    end
  end
end
