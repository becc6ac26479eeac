# frozen_string_literal: true

require_relative "support/puma"
require_relative "../support/serve_process"
require_relative "../support/soak/proxy"

# Scenario 14 (issue 46 item 3): the hub's process SIGSTOPped for 15 s while a
# numbered ephemeral stream (100 a second, one queue every worker subscribes)
# runs before, during and after: `pgbus-hub serve`, and the Puma master that
# runs the hub. Time the hub did not run is not held against anyone: on
# SIGCONT no worker is evicted (the 1,500 NOTIFYs of the stop are more than
# the hard queue limit of 1,024 frames), none fails over, the listener keeps
# its connection (no deadline is judged on time it was stopped), and every
# worker gets every number exactly once, in order. No sub is made during the
# stop: one would wait its ack budget and fail over (scenario 5). And a stop
# in the middle of a handover (docs/architecture.md, "Handover"): the budget
# that passed meanwhile is not held against the given-up connection.
module S14
  STOP_SECONDS = 15
  STREAM_EVERY = 0.01 # 100 NOTIFYs a second
  STEADY_SECONDS = 2

  # NOTIFYs "s14-0", "s14-1"... on `queue` every STREAM_EVERY from a connection
  # of its own until stopped; returns how many committed.
  class Stream
    def initialize(queue)
      @sent = 0
      @stop = false
      @thread = Thread.new do
        conn = PG.connect(Rel.url)
        next_at = Rel.now
        until @stop
          Rel.notify(queue, "s14-#{@sent}", conn: conn, prefix: "", suffix: "")
          @sent += 1
          next_at += STREAM_EVERY
          sleep [next_at - Rel.now, 0].max
        end
      ensure
        conn&.close
      end
    end

    def stop
      @stop = true
      @thread.join
      @sent
    end
  end
end

RSpec.describe "reliability 14: the hub's process SIGSTOPped for 15 s under a stream", :reliability do
  include PumaE2E

  # The numbers of `wakes` (each {"q", "p"}) on `queue`, in order of arrival.
  def numbers(wakes, queue)
    wakes.filter_map { |e| e["p"].delete_prefix("s14-").to_i if e["q"] == queue && e["p"].to_s.start_with?("s14-") }
  end

  # Stream, stop `pid` for S14::STOP_SECONDS, continue it, stream on; returns how many were sent.
  def stop_under_a_stream(queue, pid)
    stream = S14::Stream.new(queue)
    sleep S14::STEADY_SECONDS
    Rel.sigstop(pid)
    @stopped = pid
    sleep S14::STOP_SECONDS
    Process.kill("CONT", pid)
    @stopped = nil
    sleep S14::STEADY_SECONDS
    stream.stop
  end

  after do
    Process.kill("CONT", @stopped) if @stopped
  rescue Errno::ESRCH
    nil
  end

  it "under pgbus-hub serve: no worker evicted or failed over, the connection kept, every number once, in order" do
    serve = ServeProcess.new(Rel.url)
    with_tmpdir do
      queue = "s14_#{Process.pid}_serve"
      workers = Array.new(4) { RelWorker.new(serve.socket, ack_timeout: 0.25 + 2.0) }
      workers.each { |w| expect(w.sub(queue)["result"]).to eq(":done") }
      wait_for("census 1") { Rel.census == 1 }
      before = Pgbus::Hub.stats(socket_path: serve.socket)
      sent = stop_under_a_stream(queue, serve.pid)
      workers.each { |w| w.wait_wake(queue, "s14-#{sent - 1}", timeout: 30) }
      received = workers.map { |w| numbers(w.wakes(queue), queue) }
      stats = Pgbus::Hub.stats(socket_path: serve.socket)
      Rel.record("s14_serve_sigstop", { sent: sent, received: received.map(&:size), evicted: stats[:evicted_workers],
                                        reconnects: stats[:reconnects] - before[:reconnects] })
      received.each { |got| expect(got).to eq((0...sent).to_a) }
      expect(workers.map(&:failed_over?)).to all(be(false))
      expect(stats).to include(evicted_workers: 0, workers: 4, listener_healthy: true, reconnects: before[:reconnects])
      expect(Rel.census).to eq(1)
      workers.each(&:stop)
    end
  ensure
    serve&.stop
    serve&.cleanup
  end

  it "under pgbus-hub serve, stopped during a handover past its budget: handed over, every number once, in order" do
    proxy = Soak::Proxy.new("127.0.0.1", Integer(TestDatabase.conninfo[:port] || 5432))
    serve = ServeProcess.new(TestDatabase.keywords(host: "127.0.0.1", port: proxy.port, dbname: Rel::DB))
    with_tmpdir do
      queue = "s14_#{Process.pid}_handover"
      workers = Array.new(2) { RelWorker.new(serve.socket, ack_timeout: 0.25 + 2.0) }
      workers.each { |w| expect(w.sub(queue)["result"]).to eq(":done") }
      wait_for("census 1") { Rel.census == 1 }
      stream = S14::Stream.new(queue)
      sleep S14::STEADY_SECONDS
      # The open flow freezes (new connections pass): the hub gives its
      # connection up, the next one comes up at once and commits the marker;
      # the frozen one has 40 health checks (10 s) to read up to it.
      proxy.black_hole!(existing_only: true)
      wait_for("the new connection up", timeout: 15) do
        stats = Pgbus::Hub.stats(socket_path: serve.socket)
        stats[:reconnects] == 1 && stats[:listener_healthy]
      end
      Rel.sigstop(@stopped = serve.pid)
      sleep 1
      proxy.restore! # while the hub does not run: the marker waits in its socket
      sleep S14::STOP_SECONDS - 1 # past the budget
      Process.kill("CONT", serve.pid)
      @stopped = nil
      sleep S14::STEADY_SECONDS
      sent = stream.stop
      workers.each { |w| w.wait_wake(queue, "s14-#{sent - 1}", timeout: 30) }
      received = workers.map { |w| numbers(w.wakes(queue), queue) }
      stats = Pgbus::Hub.stats(socket_path: serve.socket)
      Rel.record("s14_serve_sigstop_in_handover", { sent: sent, received: received.map(&:size),
                                                    handovers: stats[:handovers], abandoned: stats[:abandoned_connections] })
      expect(stats).to include(handovers: 1, abandoned_connections: 0, evicted_workers: 0)
      received.each { |got| expect(got).to eq((0...sent).to_a) }
      expect(serve.log).to include("the handover's budget passed while this process did not run")
      workers.each(&:stop)
    end
  ensure
    serve&.stop
    serve&.cleanup
    proxy&.close
  end

  it "in Puma (the master): no worker evicted or failed over, the connection kept, every number once, in order" do
    c, shared, pids = subscribed_hub_cluster
    before = RelPuma.live_stats(c)
    views = RelPuma.views(c, pids)
    sent = stop_under_a_stream(shared, c.pid)
    views.each { |v| v.wait_wake(shared, "s14-#{sent - 1}", timeout: 30) }
    received = views.map { |v| numbers(v.wakes, shared) }
    stats = RelPuma.live_stats(c)
    Rel.record("s14p_puma_master_sigstop", { sent: sent, received: received.map(&:size), evicted: stats[:evicted_workers],
                                             reconnects: stats[:reconnects] - before[:reconnects] })
    received.each { |got| expect(got).to eq((0...sent).to_a) }
    expect(c.log).not_to include("failed over")
    expect(stats).to include(evicted_workers: 0, workers: 4, listener_healthy: true, reconnects: before[:reconnects])
    expect(c.census_settles_at(1)).to eq(1)
  ensure
    stop_clusters
  end
end
