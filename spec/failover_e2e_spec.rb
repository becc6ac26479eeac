# frozen_string_literal: true

require "tmpdir"
require "timeout"
require_relative "support/database"
require_relative "support/hub_process"

# The worker's whole story against a real hub process and real PostgreSQL:
# the native FailoverListener: the hub client, then its own connection.
RSpec.describe "fail-over to a per-worker listener" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    Dir.mktmpdir("pgbus-hub-failover") do |dir|
      @socket_path = File.join(dir, "hub.sock")
      @hub = HubProcess.new(@socket_path)
      example.run
    ensure
      @failover&.stop
      @hub&.stop
    end
  end

  def pop(queue, timeout: 10)
    Timeout.timeout(timeout) { queue.pop }
  end

  def build_failover(queue)
    @failover = Pgbus::Hub::FailoverListener.new(socket_path: @socket_path, connection: TestDatabase.url,
                                                 dispatch_queue: queue, health_check_ms: 100).start
  end

  it "re-LISTENs every recorded sub locally after the hub is SIGKILLed; the next NOTIFY arrives" do
    queue = Queue.new
    wait_for("hub connected") { Pgbus::Hub.stats(socket_path: @socket_path)[:listener_healthy] }
    before = TestDatabase.census # includes the hub's one connection
    failover = build_failover(queue)
    %w[a b c].each { |q| expect(failover.ensure_listening("fo_#{q}")).to eq(:done) }
    failover.remove_listening("fo_c")
    TestDatabase.notify("fo_a", "via hub")
    expect(pop(queue).payload).to eq("via hub")
    expect(TestDatabase.census).to eq(before) # the worker added no connection

    @hub.kill("KILL")
    # the hub's connection is gone, the worker's own listener replaced it
    wait_for("fail-over") { failover.failed_over? && TestDatabase.census == before }
    wait_for("local listener connected") { failover.ensure_listening("fo_b") == :done }
    # Before any NOTIFY: one durable wake per replayed queue, to re-read what the hub missed.
    caught_up = Array.new(2) { pop(queue) }.map { |w| [w.queue_name, w.payload] }
    expect(caught_up).to contain_exactly(["fo_a", nil], ["fo_b", nil])
    TestDatabase.notify("fo_a", "via local")
    TestDatabase.notify("fo_b")
    TestDatabase.notify("fo_c", "not replayed")
    got = Array.new(2) { pop(queue) }.map { |w| [w.queue_name, w.payload] }
    expect(got).to contain_exactly(["fo_a", "via local"], ["fo_b", nil])
    sleep 0.3
    expect(queue.size).to eq(0)
  end
end
