# frozen_string_literal: true

# Every default is defined once, in the Rust core, and read from there by the
# Ruby classes (pgbus's values: it is what pgbus's own hub and clients use).
RSpec.describe "Pgbus::Hub::DEFAULTS" do
  it "holds pgbus's defaults, frozen, from the native core" do
    expect(Pgbus::Hub::DEFAULTS).to eq(health_check_ms: 250, channel_prefix: "pgmq.q_", channel_suffix: ".INSERT",
                                       durable_queue_limit: 256, hard_queue_limit: 1024,
                                       max_channels_per_connection: 10_000, max_channels: 50_000,
                                       status_interval: 1.0, metrics_port: nil, metrics_bind: "127.0.0.1",
                                       standby: false, ack_timeout: 2.0)
    expect(Pgbus::Hub::DEFAULTS).to be_frozen
    expect(Pgbus::Hub::DEFAULTS.values.grep(String)).to all(be_frozen)
  end

  it "computes pgbus's ack budgets: the listener's health + 1 s, a worker's health + 2 s" do
    expect(Pgbus::Hub.listen_ack_timeout(250)).to eq(1.25)
    expect(Pgbus::Hub.hub_ack_timeout(250)).to eq(2.25)
    expect(Pgbus::Hub.hub_ack_timeout(1000)).to eq(3.0)
  end

  it "is what the classes default to (options are resolved in Rust), and no Ruby file repeats a default's literal" do
    hub = Pgbus::Hub.options("MasterHub", { connection: "dbname=x", socket_path: "/tmp/x.sock" })
    expect(hub).to include(Pgbus::Hub::DEFAULTS.except(:ack_timeout)).and be_frozen
    listener = Pgbus::Hub.options("Listener", { connection: "dbname=x", dispatch_queue: Queue.new })
    expect(listener).to include(Pgbus::Hub::DEFAULTS.slice(:health_check_ms, :channel_prefix, :channel_suffix))
    client = Pgbus::Hub.options("HubClient", { socket_path: "/tmp/x.sock", dispatch_queue: [] })
    expect(client).to include(ack_timeout: Pgbus::Hub::DEFAULTS[:ack_timeout], on_failure: nil, logger: nil)
    expect(Pgbus::Hub.configuration.status_interval).to eq(Pgbus::Hub::DEFAULTS[:status_interval])
    sources = Dir[File.expand_path("../lib/**/*.rb", __dir__)].to_h { |path| [path, File.read(path)] }
    ['"pgmq.q_"', '".INSERT"', "health_check_ms: 250", "/ 1000.0) +", "256", "1024"].each do |literal|
      expect(sources.select { |_, text| text.include?(literal) }.keys).to be_empty, literal
    end
  end

  # One definition per default: each option of DEFAULTS is a MasterHub keyword and a
  # Pgbus::Hub.configure setting, and neither takes a tuning key DEFAULTS lacks (ack_timeout is a
  # worker's: HubClient's keyword, derived from health_check_ms under the hub).
  it "refuses a MasterHub log_file: beside a logger:, or one that is not a path" do
    keywords = { connection: "dbname=x", socket_path: "/tmp/x.sock" }
    expect { Pgbus::Hub::MasterHub.new(**keywords, log_file: "/tmp/x.log", logger: Object.new) }
      .to raise_error(ArgumentError, "MasterHub: give logger: or log_file:, not both")
    expect { Pgbus::Hub::MasterHub.new(**keywords, log_file: 1) }.to raise_error(TypeError, /log_file must be a String/)
    expect(Pgbus::Hub::MasterHub.new(**keywords, log_file: "-").threads).to eq([])
  end

  it "names the same options in DEFAULTS, MasterHub's keywords and Pgbus::Hub.configure, both ways" do
    tuning = Pgbus::Hub::DEFAULTS.keys - %i[ack_timeout]
    hub = Pgbus::Hub.options("MasterHub", { connection: "dbname=x", socket_path: "/tmp/x.sock" })
    expect(hub.keys - %i[connection socket_path logger log_file]).to match_array(tuning) # where, not how much
    expect(Pgbus::Hub::Configuration.members - %i[logger connection listen_scope socket_path]).to match_array(tuning)
    expect(Pgbus::Hub.options("HubClient", { socket_path: "/x", dispatch_queue: [] })).to include(:ack_timeout)
    first_cells = File.read(File.expand_path("../docs/configuration.md", __dir__)).scan(/^\|([^|]+)\|/).flatten
    documented = first_cells.flat_map { |cell| cell.scan(/`(\w+):?`/).flatten }.map(&:to_sym)
    expect(tuning - documented).to eq([])
  end

  # docs/architecture.md's chain 4b: an option the workers must honour reaches every worker's listener
  # only through Pgbus::Hub.listener_keywords. The keyword lists are the schema's (options.rs), read
  # through Pgbus::Hub.options: its Hash has every keyword of the class, defaults filled.
  it "passes the workers, through listener_keywords, every hub option both listener classes take, and no other" do
    keywords = ->(owner, required) { Pgbus::Hub.options(owner, required).keys }
    listener = keywords.call("Listener", { connection: "dbname=x", dispatch_queue: [] })
    failover = keywords.call("FailoverListener", { connection: "dbname=x", dispatch_queue: [], socket_path: "/x" })
    hub = keywords.call("MasterHub", { connection: "dbname=x", socket_path: "/x" }) | Pgbus::Hub::Configuration.members
    # Every key a hub's options can hold (master_options' shape adds :scope and :source), each its own value.
    options = (hub | listener | failover | Pgbus::Hub.configuration.master_options.keys).to_h { |key| [key, key] }
    passed = Pgbus::Hub.listener_keywords(options)
    expect(passed.keys - (listener & failover)).to eq([]) # each one reaches both classes
    expect(passed).to eq(passed.keys.to_h { |key| [key, key] }) # as given
    # The worker's own objects: worker_listener's caller gives them (a logger: Pgbus::Hub.listener).
    given_by_the_worker = %i[dispatch_queue logger on_listening]
    expect((listener & failover & hub) - given_by_the_worker - passed.keys).to eq([]) # none stays behind
    doc = File.read(File.expand_path("../docs/configuration.md", __dir__))
    honoured = doc[/^\*\*The workers honour\*\* ([^:]*):/, 1].to_s.scan(/`(\w+)`/).flatten.map(&:to_sym)
    expect(honoured).to match_array(passed.keys)
  end

  it "refuses a bad keyword by name, in every constructor and in configure" do
    expect { Pgbus::Hub.options("HubClient", { socket_path: "/x" }) }
      .to raise_error(ArgumentError, "HubClient: missing required option(s) :dispatch_queue")
    expect { Pgbus::Hub.options("HubClient", { socket_path: "/x", dispatch_queue: nil }) }
      .to raise_error(ArgumentError, "HubClient: dispatch_queue must respond to <<")
    expect { Pgbus::Hub.options("HubClient", { socket_path: 7, dispatch_queue: [] }) }
      .to raise_error(TypeError, "HubClient: socket_path must be a String, got Integer")
    expect { Pgbus::Hub.options("HubClient", { socket_path: "/x", dispatch_queue: [], ack_timeout: 0 }) }
      .to raise_error(ArgumentError, "HubClient: ack_timeout must be a positive number, got 0")
    expect(Pgbus::Hub.options("HubClient", { socket_path: "/x", dispatch_queue: [], ack_timeout: 3 })[:ack_timeout]).to eq(3.0)
    expect { Pgbus::Hub.configure { |c| c.durable_queue_limit = 0 } }
      .to raise_error(ArgumentError, "Pgbus::Hub.configure: durable_queue_limit must be a positive Integer, got 0")
    expect { Pgbus::Hub.check_option("Pgbus::Hub.configure", :nope, 1) }.to raise_error(ArgumentError, /unknown option :nope/)
  ensure
    Pgbus::Hub.instance_variable_set(:@configuration, nil)
  end

  it "takes an ActiveRecord configuration's url, else its libpq keywords by their libpq names" do
    config = { adapter: "postgresql", database: "app", username: "u", host: "h", port: 5433, pool: 5,
               encoding: "unicode", password: nil, variables: { statement_timeout: 1 } }
    expect(Pgbus::Hub.active_record_connection(config))
      .to eq({ dbname: "app", user: "u", host: "h", port: "5433", variables: { statement_timeout: 1 } })
    expect(Pgbus::Hub.check_connection(Pgbus::Hub.active_record_connection(config))).to include("dbname=app", "port=5433")
    expect(Pgbus::Hub.active_record_connection({ url: "postgres://x/y", database: "z" })).to eq("postgres://x/y")
  end
end
