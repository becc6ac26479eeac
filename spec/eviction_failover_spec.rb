# frozen_string_literal: true

require "tmpdir"
require "timeout"
require_relative "support/database"

# A worker process that stops draining (SIGSTOP) is evicted by the hub at the
# hard limit; on SIGCONT its client sees the severed socket, fails over, and
# its local listener delivers the next NOTIFY.
RSpec.describe "eviction then fail-over" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  it "evicts a stopped worker process, which then serves wakes from its own listener" do
    Dir.mktmpdir("pgbus-hub-evict") do |dir|
      hub = Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: File.join(dir, "hub.sock"),
                                      durable_queue_limit: 4, hard_queue_limit: 16).start
      report_r, report_w = IO.pipe
      child = fork do
        report_r.close
        queue = Queue.new
        failover = Pgbus::Hub::FailoverListener.new(socket_path: hub.socket_path, connection: TestDatabase.url,
                                                    dispatch_queue: queue).start
        failover.ensure_listening("evict_me")
        report_w.puts "subscribed"
        report_w.flush
        Timeout.timeout(30) do
          loop do
            wake = queue.pop
            next unless wake.payload == "after failover"

            report_w.puts(failover.failed_over? ? "failed over and got it" : "got it via the hub?!")
            break
          end
        end
        exit!(0)
      rescue StandardError => e
        report_w.puts "error #{e.class}: #{e.message}"
        exit!(1)
      end
      report_w.close
      expect(report_r.gets&.strip).to eq("subscribed")
      Process.kill("STOP", child)
      payload = "e" * 7000
      sent = 0
      while hub.stats[:evicted_workers].zero? && sent < 3000
        TestDatabase.notify("evict_me", payload)
        sent += 1
      end
      expect(hub.stats[:evicted_workers]).to eq(1)
      Process.kill("CONT", child)
      wait_for("fail-over listener", timeout: 15) do
        TestDatabase.notify("evict_me", "after failover")
        report_r.wait_readable(0.2)
      end
      expect(report_r.gets&.strip).to eq("failed over and got it")
      Process.wait(child)
      hub.stop
    ensure
      Process.kill("KILL", child) rescue nil # rubocop:disable Style/RescueModifier
      Process.wait(child) rescue nil # rubocop:disable Style/RescueModifier
    end
  end
end
