# frozen_string_literal: true

require "open3"
require "rbconfig"
require "tmpdir"
require_relative "support/database"
require_relative "support/pgbus_calls"
require_relative "support/pgbus_surface_doc"

# The contract with pgbus, release by release, from one list (spec/support/pgbus_calls.rb, which
# docs/pgbus-surface.md shows): in a child process per release with that release's stand-in
# (spec/support/pgbus_standin; 0.15+ adds #threads and the shutdown that reports threads still
# alive), every object pgbus-hub hands pgbus is built as pgbus builds it, taken through its states
# (failed over at start, on the hub after a fail-back, on the hub, failed over, stopped; named by
# our listener's #state there, which is checked too) and asked every call the list names for
# that release. A missing method, another kind of result or another value fails its row.
RSpec.describe "the pgbus surface" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  releases = { "0.13.0" => "pre382", "0.13.1" => "v382", "0.14.1" => "v382", "0.15.0" => "v382", "0.17.0" => "v382" }

  def probe(shape, version)
    Dir.mktmpdir("pgbus-surface") do |dir|
      out, err, status = Open3.capture3(
        { "PGBUS_STANDIN_VERSION" => version, "PGBUS_STREAMS_HUB_SOCKET" => nil },
        RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-I", File.join(ROOT, "spec/support/pgbus_standin", shape, "lib"),
        File.join(ROOT, "spec/support/pgbus_standin/surface_probe.rb"), TestDatabase.url, dir
      )
      expect(status).to be_success, err
      JSON.parse(out.lines.last)
    end
  end

  # What is wrong with +got+ for +call+ in +state+ (nil: nothing).
  def wrong(call, state, got)
    return "no answer" if got.nil?
    return got["error"] if got["error"]

    live = state != :stopped
    ok = case call.result
         when :self then got["self"]
         when :done_or_nil then got["value"] == (live ? "done" : nil)
         when :nil then got["class"] == "NilClass"
         when :boolean then %w[TrueClass FalseClass].include?(got["class"]) && got["value"] == call.values.fetch(state)
         when :threads then got["class"] == "Array" && got["threads"] && (live ? got["size"].positive? : got["size"].zero?)
         when :integer then got["class"] == "Integer"
         when :string then got["class"] == "String"
         end
    "expected #{call.result}#{" #{call.values[state]}" if call.values}, got #{got}" unless ok
  end

  releases.each do |version, shape|
    it "pgbus #{version}: every call it makes answers with pgbus's meaning in every state" do
      report = probe(shape, version)
      expect(report["version"]).to eq(version)
      expect(report["installed"]).to eq(shape == "pre382" ? "pre_hub" : "hub_era")
      calls = PgbusCalls.calls(version)
      expect(calls.map(&:object).uniq.sort).to eq(shape == "pre382" ? %i[listener] : %i[hub_client master_hub])
      problems = calls.flat_map do |call|
        call.states.filter_map do |state|
          got = report.dig("objects", call.object.to_s, state.to_s, call.method.to_s)
          problem = wrong(call, state, got)
          "#{call.object}##{call.method} (#{state}): #{problem}" if problem
        end
      end
      expect(problems).to eq([])
      # Our listener's #state, FailoverState's word, in each state the list names.
      listener = calls.map(&:object).find { |o| o != :master_hub }
      expect(report.dig("states", listener.to_s))
        .to eq(PgbusCalls::STATES.fetch(listener).to_h { |s| [s.to_s, PgbusCalls::LISTENER_STATE.fetch(s).to_s] })
      # pgbus's FailoverListener is never told of a failure: ours fails over and back by itself.
      expect(report["on_failure_calls"]).to eq(0) unless shape == "pre382"
      if Gem::Version.new(version) >= Gem::Version.new("0.15")
        # pgbus's shutdown takes the streamer's threads (ours among them) before the stops and
        # reports any still alive after them: none, with the hub up and after a fail-over.
        expect(report["shutdowns"].map { |s| [s["state"], s["threads_before"].positive?, s["leaked"]] })
          .to eq([["on_hub", true, []], ["failed_over", true, []]])
      end
      puts "  [pgbus #{version}: #{calls.sum { |c| c.states.size }} calls answered]"
    end
  end

  # A pgbus whose HubClient takes other keywords (a release after the tested range, say).
  UNKNOWN_PGBUS = <<~RUBY
    require "pgbus"
    require "stringio"
    Pgbus::Web::Streamer::HubClient.class_eval { def initialize(path: nil, queue: nil, **) = nil }
    log = StringIO.new
    Pgbus.logger = Logger.new(log)
    Pgbus.configure { |c| c.streams_enabled = true; c.database_url = ARGV[0] }
    require "pgbus/hub"
    Pgbus::Hub::PgbusAdapter.install!
    streamer = Pgbus::Web::Streamer
    prepended = [streamer::HubClient, streamer::MasterHub].any? { |k| k.singleton_class.ancestors.any? { |m| m.name.to_s.start_with?("Pgbus::Hub") } }
    ENV["PGBUS_STREAMS_HUB_SOCKET"] = File.join(Dir.tmpdir, "pgbus-surface-none-\#{Process.pid}.sock")
    instance = streamer::Instance.new
    puts JSON.generate(shape: Pgbus::Hub::PgbusAdapter.shape, prepended: prepended, options: Pgbus::Hub.master_options,
                       listener: instance.listener.class.name, errors: log.string.lines.grep(/ERROR/))
    instance.shutdown!
  RUBY

  it "an unknown pgbus: one logged error naming its version and what it lacks; pgbus left as it is" do
    out, err, status = Open3.capture3({ "PGBUS_STANDIN_VERSION" => "9.0.0" }, RbConfig.ruby, "-rjson", "-I", File.join(ROOT, "lib"),
                                      "-I", File.join(ROOT, "spec/support/pgbus_standin/v382/lib"),
                                      "-e", UNKNOWN_PGBUS, TestDatabase.url)
    expect(status).to be_success, err
    report = JSON.parse(out.lines.last)
    expect(report).to include("shape" => "unsupported", "prepended" => false, "options" => nil,
                              "listener" => "Pgbus::Web::Streamer::Listener") # pgbus's own, as without pgbus-hub
    expect(report["errors"].size).to eq(1)
    expect(report["errors"].first).to include("pgbus 9.0.0 is not the shape pgbus-hub", "(pgbus #{Pgbus::Hub::PgbusSurface::SUPPORTED})",
                                              "Pgbus::Web::Streamer::HubClient.new(socket_path:)",
                                              "HubClient.new(dispatch_queue:)")
  end

  # pgbus's streams on a shared ActiveRecord connection (a Proc): no listener of ours can be built
  # from it, so pgbus's own classes serve, as without this gem (pgbus's own specs run that way).
  PROC_CONNECTION = <<~RUBY
    require "pgbus"
    require "pgbus/hub"
    Pgbus.logger = Logger.new(File::NULL)
    Pgbus.configure { |c| c.streams_enabled = true; c.database_url = -> { nil } }
    ENV["PGBUS_STREAMS_HUB_SOCKET"] = "/nonexistent/hub.sock"
    streamer = Pgbus::Web::Streamer
    built = if defined?(streamer::HubClient)
              streamer::HubClient.new(socket_path: ENV["PGBUS_STREAMS_HUB_SOCKET"], dispatch_queue: Queue.new)
            else
              streamer::Listener.new(pg_connection: nil, dispatch_queue: Queue.new, health_check_ms: 250)
            end
    puts built.class.name
  RUBY

  %w[pre382 v382].each do |shape|
    it "#{shape}: with a Proc connection pgbus's own hub client or listener is built, not ours" do
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"),
                                        "-I", File.join(ROOT, "spec/support/pgbus_standin", shape, "lib"),
                                        "-e", PROC_CONNECTION)
      expect(status).to be_success, err
      expect(out.strip).to eq(shape == "pre382" ? "Pgbus::Web::Streamer::Listener" : "Pgbus::Web::Streamer::HubClient")
    end
  end

  it "docs/pgbus-surface.md shows the list as it is (rake docs:surface writes its tables)" do
    expect(PgbusSurfaceDoc.current?).to be(true), "run rake docs:surface"
  end
end
