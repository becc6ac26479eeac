# frozen_string_literal: true

# Puma-cluster variants of the reliability scenarios (3p, 4p, 5p, 10p): a real
# `puma -C` cluster (spec/support/puma_apps, standalone mode) on the
# reliability database, whose workers RelInvariants checks like RelWorkers.
require_relative "helpers"
require_relative "../../support/puma_apps/e2e_helpers"

module RelPuma
  module_function

  # Over TCP: PumaCluster#census maps client ports to the cluster's processes.
  def url
    TestDatabase.keywords(host: "127.0.0.1", dbname: Rel::DB)
  end

  # PumaE2E#cluster options: standalone (channel = queue name), our database.
  def options(**extra)
    env = { "PGBUS_E2E_DATABASE_URL" => url }.merge(extra.delete(:env) || {})
    { mode: :standalone, env: env }.merge(extra)
  end

  def notify(queue, payload = "", conn: Rel.sql)
    Rel.notify(queue, payload, conn: conn, prefix: "", suffix: "")
  end

  # The hub's stats as the test app's master publishes them (every 0.2 s).
  def hub_stats(cluster)
    (cluster.hub_info || {}).fetch("stats", {})
  end

  # The hub's stats asked over its socket (current, unlike hub_stats). The
  # asking connection is a monitor, not counted in `workers`.
  def live_stats(cluster)
    Pgbus::Hub.stats(socket_path: cluster.socket_path)
  end

  # Waits for a stats snapshot taken after now (the file is rewritten every 0.2 s).
  def fresh_hub_stats(cluster)
    sleep 0.45
    hub_stats(cluster)
  end

  def views(cluster, pids = cluster.worker_pids)
    pids.map { |pid| PumaWorkerView.new(cluster, pid) }
  end

  # { view => acked queues } for every live worker that acked something.
  def acked(cluster, pids = cluster.worker_pids)
    views(cluster, pids).to_h { |v| [v, cluster.acked_subs(v.pid)] }.reject { |_, queues| queues.empty? }
  end

  # What the hub must route once the `dead` pids are gone: [workers, channels]
  # = the live workers that connected (subscribed) and the union of their acks.
  def expected_routes(cluster, dead = [])
    live = cluster.worker_pids - dead
    subscribed = live.select { |pid| File.exist?(File.join(cluster.state_dir, "subs-#{pid}.log")) }
    [subscribed.size, subscribed.flat_map { |pid| cluster.acked_subs(pid) }.uniq.size]
  end

  # Waits until the hub's live stats show exactly the expected routes.
  def wait_routes_released(cluster, dead = [], what: "hub routes", timeout: 10)
    wait_for(what, timeout: timeout, interval: 0.005) do
      workers, channels = expected_routes(cluster, dead)
      stats = live_stats(cluster)
      stats[:workers] == workers && stats[:channels] == channels
    end
  end

  def master_sample(cluster)
    Rel.proc_sample(cluster.pid)
  end
end

# One Puma worker seen through its wake log, with RelWorker's interface for
# RelInvariants#assert_acked_subs_get_wakes (size = a mark, wait_wake from it).
class PumaWorkerView
  attr_reader :pid

  def initialize(cluster, pid)
    @cluster = cluster
    @pid = pid
  end

  # The end of the last complete record (a mark never falls inside a record).
  def size
    @offset = @cluster.wake_records(@pid, from: @offset || 0).last
  end

  # Every wake recorded from mark `from` on, as RelWorker events.
  def wakes(from: 0)
    @cluster.wake_records(@pid, from: from).first.map { |q, p, t| { "ev" => "wake", "q" => q, "p" => p, "t" => t } }
  end

  def wait_wake(queue, payload, timeout: 10, from: 0)
    wait_for("worker #{@pid}: wake #{queue} #{payload.to_s[0, 40].inspect}", timeout: timeout, interval: 0.02) do
      wakes(from: from).find { |e| e["q"] == queue && e["p"] == payload }
    end
  end
end

module RelPumaInvariants
  # A started 4-worker cluster whose hub serves every worker, each subscribed
  # to "<stream>_shared" and to a queue of its own; census settled at 1.
  # Returns [cluster, shared queue, worker pids].
  def subscribed_hub_cluster(**options)
    c = cluster(**RelPuma.options(**options))
    c.wait_log(/master hub listening at/)
    shared = "#{unique_stream}_shared"
    pids = c.subscribe_all(shared, own: true).keys
    expect(c.census_settles_at(1)).to eq(1)
    [c, shared, pids]
  end

  # after-hook: resumes a process a failed example left SIGSTOPped, then stops
  # every cluster (no stray Puma process, no leftover socket).
  def resume_and_stop_clusters(stopped_pid)
    Process.kill("CONT", stopped_pid) if stopped_pid
  rescue Errno::ESRCH
    nil
  ensure
    stop_clusters
  end

  # Invariant 1 on a Puma cluster: every live worker's acked subscriptions get
  # a wake for a NOTIFY sent now. Another suite on the shared server may
  # pg_terminate_backend every pgbus-listen session; a NOTIFY during the hub's
  # reconnect is lost by design, so a miss is retried once only if the hub
  # reconnected meanwhile (counted in @foreign_reconnect_retries).
  def assert_cluster_subs_get_wakes(cluster, tag:, pids: cluster.worker_pids, timeout: 10)
    subs = RelPuma.acked(cluster, pids)
    expect(subs).not_to be_empty
    before = RelPuma.hub_stats(cluster)["reconnects"]
    begin
      assert_acked_subs_get_wakes(subs, tag: tag, timeout: timeout, notify: ->(q, p) { RelPuma.notify(q, p) })
    rescue RuntimeError => e
      raise unless e.message.include?("timed out") && RelPuma.fresh_hub_stats(cluster)["reconnects"] != before

      @foreign_reconnect_retries = (@foreign_reconnect_retries || 0) + 1
      assert_acked_subs_get_wakes(subs, tag: "#{tag}-retry", timeout: timeout, notify: ->(q, p) { RelPuma.notify(q, p) })
    end
  end
end

RSpec.configure do |config|
  config.include RelPumaInvariants, :reliability
end
