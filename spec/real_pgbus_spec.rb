# frozen_string_literal: true

require_relative "support/puma_apps/e2e_helpers"

# Opt-in: REAL pgbus (any version on PGBUS_HUB_REAL_PGBUS_LIBS, colon-separated
# lib dirs: pgbus, pgmq-ruby, fugit), never shipped with this project. pgbus
# needs Ruby >= 3.3, so run it in the Ruby 3.3 chroot, e.g.
#   PGBUS_HUB_CHROOT_BIND=/src PGBUS_HUB_REAL_PGBUS_LIBS=/src/pgbus/lib:/src/pgmq/lib:/src/fugit/lib \
#     bin/trixie rspec spec/real_pgbus_spec.rb
# A 4-worker Puma cluster (preload_app!, `plugin :pgbus_streams`) whose workers
# each build a pgbus Streamer::Instance and ensure_listening one stream, with
# only pgbus-hub added: census 1, every worker woken by one NOTIFY, in both
# $LOAD_PATH orders (both gems ship puma/plugin/pgbus_streams.rb) and both
# Gemfile orders; Puma exits 0 and leaves no socket.
RSpec.describe "real pgbus with pgbus-hub in a Puma cluster", :puma do
  include PumaE2E

  before do
    skip "set PGBUS_HUB_REAL_PGBUS_LIBS to real pgbus's lib dirs (see the header)" if ENV["PGBUS_HUB_REAL_PGBUS_LIBS"].to_s.empty?
    skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available?
  end

  after { stop_clusters }

  # NOTIFY on pgmq's channel for `queue` until every pid recorded a new durable wake (bounded).
  def wake_everywhere(cluster, pids, queue)
    missing = pids
    before = pids.to_h { |pid| [pid, cluster.wakes(pid).count([queue, nil])] }
    10.times do
      notify("pgmq.q_#{queue}.INSERT")
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1
      until (missing = pids.reject { |pid| cluster.wakes(pid).count([queue, nil]) > before[pid] }).empty? ||
            Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        sleep 0.05
      end
      return [] if missing.empty?
    end
    missing
  end

  [%i[ours_first pgbus_second], %i[pgbus_first pgbus_second], %i[ours_first hub_first]].each do |order, gemfile|
    it "census 1, every worker woken, exit 0 and no socket left ($LOAD_PATH #{order}, Gemfile #{gemfile})" do
      env = { "PGBUS_E2E_RACKUP" => File.join(ROOT, "spec/support/real_pgbus/config.ru"),
              "PGBUS_E2E_HUB_FIRST" => gemfile == :hub_first ? "1" : "0" }
      c = cluster(mode: :real, order: order, env: env)
      c.wait_log(/master hub listening at/)
      c.wait_log(/Worker \d \(PID: \d+\) booted/)
      expect(c.log.index(/master hub started before fork/)).to be < c.log.index(/Worker \d \(PID: \d+\) booted/)
      subs = c.subscribe_all(unique_stream)
      # pgbus with its own hub (0.13.1+) keeps its FailoverListener over our HubClient; older pgbus gets ours
      hub_era = ENV["PGBUS_HUB_REAL_PGBUS_LIBS"].split(File::PATH_SEPARATOR)
                                                .any? { |dir| File.exist?(File.join(dir, "pgbus/web/streamer/hub_client.rb")) }
      listener = hub_era ? "Pgbus::Web::Streamer::FailoverListener" : "Pgbus::Hub::FailoverListener"
      expect(subs.values.map { |s| s["listener"] }.uniq).to eq([listener])
      expect(subs.values.map { |s| s["result"] }.uniq).to eq(["done"])
      expect(c.census_settles_at(1)).to eq(1)
      queue = subs.values.first["queue"]
      expect(wake_everywhere(c, subs.keys, queue)).to be_empty
      socket = c.socket_path
      c.stop(signal: "INT")
      expect(c.exit_status).to be_success
      expect(File.exist?(socket)).to be(false)
      expect(c.final_log).not_to match(/Error|raised|failed to start/)
      puts "  [real pgbus #{order}/#{gemfile}: census 1, #{subs.size} workers woken, exit #{c.exit_status.exitstatus}]"
    end
  end

  it "hub stopped: every worker fails over (census 4) and keeps waking; started again: back to it (census 1)" do
    c = cluster(mode: :real, order: :ours_first, env: { "PGBUS_E2E_RACKUP" => File.join(ROOT, "spec/support/real_pgbus/config.ru") })
    c.wait_log(/master hub listening at/)
    subs = c.subscribe_all(unique_stream)
    queue = subs.values.first["queue"]
    expect(c.census_settles_at(1)).to eq(1)
    c.signal("WINCH") # the test app's master stops the native hub
    expect(c.census_settles_at(4)).to eq(4)
    expect(wake_everywhere(c, subs.keys, queue)).to be_empty
    c.signal("URG") # ... and starts it again at the same socket
    started = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
    expect(c.census_settles_at(1)).to eq(1)
    back_after = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - started
    expect(wake_everywhere(c, subs.keys, queue)).to be_empty
    c.stop(signal: "INT")
    expect(c.exit_status).to be_success
    puts "  [real pgbus, hub stopped: census 4, #{subs.size} workers woken on their own connections; " \
         "started again: census 1 within #{back_after.round(1)} s (incl. a 0.5 s settle), all woken; exit 0]"
  end
end
