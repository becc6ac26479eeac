# frozen_string_literal: true

require_relative "support/helpers"

# Scenarios 2 and 8 (non-UTF-8 part) on a throwaway private cluster
# (initdb in a temp dir, Unix socket only); the shared server is never touched.
RSpec.describe "reliability 2 + 8b: private PostgreSQL cluster", :reliability do
  before(:all) do
    next unless Rel.slow_requested? # the examples skip themselves; do not initdb for nothing
    skip "no PostgreSQL binaries for a private cluster" unless PrivateCluster.available?
    @cluster = PrivateCluster.new
    @cluster.start
  end

  after(:all) { @cluster&.destroy }

  def census(conn, db = "postgres")
    Rel.census(conn: conn, db: db)
  end

  def notify(conn, queue, payload)
    Rel.notify(queue, payload, conn: conn)
  end

  def reconnecting_sql(cluster, dbname: "postgres")
    conn = nil
    lambda do |&use|
      conn = nil if conn&.finished? || (conn && conn.status != PG::CONNECTION_OK)
      conn ||= cluster.connect(dbname: dbname)
      use.call(conn)
    rescue PG::Error
      conn = nil
      raise
    end
  end

  it "2a: PostgreSQL restarted under load: hub reconnects, re-LISTENs, acked subs keep getting wakes, no fail-over" do
    with_tmpdir do |dir|
      url = @cluster.url
      hub = RelHub.new(dir, url: url)
      workers = Array.new(3) { RelWorker.new(hub.socket_path, url: url) }
      subs = workers.each_with_index.to_h { |w, i| [w, ["r_shared", "r_#{i}"]] }
      subs.each { |w, qs| qs.each { |q| expect(w.sub(q)["result"]).to eq(":done") } }
      sql = reconnecting_sql(@cluster)
      load_errors = 0
      sent = 0
      stop = false
      load = Thread.new do
        until stop
          begin
            sql.call { |c| notify(c, "r_shared", "load-#{sent += 1}") }
          rescue PG::Error
            load_errors += 1
            sleep 0.05
          end
        end
      end
      sleep 0.5
      peer = WirePeer.new(hub.socket_path)
      t0 = Rel.now
      @cluster.restart("fast")
      restarted = Rel.now
      seen = []
      until seen.include?(false) && seen.last == true
        frame = peer.next_frame(timeout: 20)
        raise "hub closed the peer" unless frame

        seen << frame["healthy"] if frame["t"] == "status"
      end
      healthy_after_up = Rel.now - restarted
      sleep 0.3
      stop = true
      load.join
      latency = assert_acked_subs_get_wakes(subs, notify: ->(q, p) { sql.call { |c| notify(c, q, p) } })
      expect(workers.none?(&:failed_over?)).to be(true)
      expect(sql.call { |c| census(c) }).to eq(1)
      stats = hub.stats
      expect(stats[:reconnects]).to be >= 1
      Rel.record("s2a_restart_under_load", {
                   restart_took_s: (restarted - t0).round(2), healthy_after_server_up_s: healthy_after_up.round(3),
                   load_notifies: sent, load_errors: load_errors, wake_after_recovery_s: latency.round(4),
                   reconnects: stats[:reconnects], last_error: stats[:last_error]
                 })
      peer.close
      workers.each(&:stop)
      hub.stop
    end
  end

  it "2b: PostgreSQL down when the hub starts, up 10 s later: workers stay on the hub (census 1)" do
    with_tmpdir do |dir|
      @cluster.stop("fast")
      url = @cluster.url
      hub = RelHub.new(dir, url: url) # starts fine: the listener retries in the background
      expect(hub.stats[:listener_healthy]).to be(false)
      patient = RelWorker.new(hub.socket_path, url: url, ack_timeout: 20)
      hasty = RelWorker.new(hub.socket_path, url: url, ack_timeout: 2.0) # pgbus's budget
      # A database outage is not a hub failure: the hub keeps both subs and
      # LISTENs them on reconnect; each sub returns nil ("listening after the
      # reconnect") within the unhealthy grace, whatever the ack budget, and
      # no worker opens a connection of its own.
      %w[d_patient d_hasty].zip([patient, hasty]).each do |queue, worker|
        started = Rel.now
        ev = worker.sub(queue)
        expect(ev).to include("result" => "nil", "failed_over" => false)
        expect(Rel.now - started).to be < 1.0
      end
      sleep 10
      expect([patient, hasty].none?(&:failed_over?)).to be(true)
      t_up = Rel.now
      @cluster.start
      up_s = Rel.now - t_up
      wait_for("hub healthy", timeout: 15, interval: 0.05) { hub.stats[:listener_healthy] }
      healthy_after_up = Rel.now - t_up
      late = RelWorker.new(hub.socket_path, url: url)
      expect(late.sub("d_late")["result"]).to eq(":done")
      sql = reconnecting_sql(@cluster)
      assert_acked_subs_get_wakes({ patient => %w[d_patient], hasty => %w[d_hasty], late => %w[d_late] },
                                  notify: ->(q, p) { sql.call { |c| notify(c, q, p) } })
      expect([patient, hasty, late].none?(&:failed_over?)).to be(true)
      expect(sql.call { |c| census(c) }).to eq(1)
      Rel.record("s2b_down_at_start", { server_start_s: up_s.round(2), hub_healthy_after_server_up_s: healthy_after_up.round(2),
                                        stats: hub.stats.slice(:reconnects, :last_error) })
      [patient, hasty, late].each(&:stop)
      hub.stop
    end
  end

  it "8b: a non-UTF-8 payload from a trigger (SQL_ASCII database) does not kill the hub; it keeps serving" do
    with_tmpdir do |dir|
      admin = @cluster.connect
      admin.exec("create database latin encoding 'SQL_ASCII' lc_collate 'C' lc_ctype 'C' template template0")
      admin.close
      db = @cluster.connect(dbname: "latin")
      db.exec(<<~SQL)
        create table items (id serial primary key, label text);
        create function items_notify() returns trigger language plpgsql as $$
        begin
          perform pg_notify('pgmq.q_bin.INSERT', new.label);
          return new;
        end $$;
        create trigger items_notify after insert on items for each row execute function items_notify();
      SQL
      url = @cluster.url(dbname: "latin")
      hub = RelHub.new(dir, url: url)
      worker = RelWorker.new(hub.socket_path, url: url)
      worker.sub("bin")
      worker.sub("bystander")
      db.exec("insert into items (label) values ('plain ascii')")
      worker.wait_wake("bin", "plain ascii")
      db.exec("insert into items (label) values (E'caf\\xe9 \\xff\\xfe')") # Latin-1 bytes, invalid UTF-8
      db.exec("insert into items (label) values ('after the bad one')")
      got_after = begin
        worker.wait_wake("bin", "after the bad one", timeout: 5)
        true
      rescue RuntimeError
        false
      end
      wait_for("hub healthy again", timeout: 15) { hub.stats[:listener_healthy] }
      expect(hub.alive?).to be(true)
      expect(Process.waitpid(hub.pid, Process::WNOHANG)).to be_nil # still running
      latency = assert_acked_subs_get_wakes({ worker => %w[bin bystander] }, notify: ->(q, p) { Rel.notify(q, p, conn: db) })
      bad_wakes = worker.wakes("bin").map { |e| e["p"] } - ["plain ascii", "after the bad one"]
      stats = hub.stats
      expect(worker.failed_over?).to be(false)
      Rel.record("s8b_non_utf8", { hub_survived: true, wake_for_bad_payload: bad_wakes.first(2),
                                   notify_right_after_bad_delivered: got_after, reconnects: stats[:reconnects],
                                   last_error: stats[:last_error], wake_after_s: latency.round(4) })
      worker.stop
      hub.stop
      db.close
    end
  end
end
