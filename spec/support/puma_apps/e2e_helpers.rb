# frozen_string_literal: true

require "set"
require_relative "harness"

# Shared helpers for the spec/puma_*_spec.rb e2e files.
module PumaE2E
  def self.database_available?
    return @available unless @available.nil?

    @available = TestDatabase.answers?(PumaCluster::DATABASE_URL)
  end

  def cluster(wait: true, **options)
    c = PumaCluster.new(**options)
    (@clusters ||= []) << c
    c.start(wait: wait)
  end

  def stop_clusters
    (@clusters || []).each do |c|
      socket = c.pid && c.socket_path
      c.stop
      expect(c.group_pids).to be_empty
      expect(File.exist?(socket)).to be(false) if socket
    ensure
      c.cleanup
    end
    @clusters = []
  end

  # The clock the apps' wake and sub records use.
  def monotonic = Process.clock_gettime(Process::CLOCK_MONOTONIC)

  def unique_stream
    "e2e_#{Process.pid}_#{rand(1 << 30).to_s(36)}"
  end

  def channel_for(options, stream)
    options[:mode] == :pgbus ? "pgmq.q_pgbus_#{stream}.INSERT" : stream
  end

  def queue_for(options, stream)
    options[:mode] == :pgbus ? "pgbus_#{stream}" : stream
  end

  def notify(channel, payload = "")
    PG.connect(PumaCluster::DATABASE_URL) { |conn| conn.exec_params("select pg_notify($1, $2)", [channel, payload]) }
  end

  # Sends a NOTIFY and waits until every pid recorded a wake for it. Re-sent
  # once a second (bounded, 10 s): a concurrent suite on the same PostgreSQL
  # may terminate pgbus-listen backends, and a NOTIFY during a reconnect is lost.
  def expect_wake_everywhere(c, pids, stream, payload)
    queue = queue_for(c.options, stream)
    expected = c.options[:shape] == "pre382" || payload.empty? ? nil : payload
    missing = pids
    10.times do
      notify(channel_for(c.options, stream), payload)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 1
      until (missing = pids.reject { |pid| c.wakes(pid).include?([queue, expected]) }).empty? ||
            Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
        sleep 0.05
      end
      break if missing.empty?
    end
    expect(missing).to be_empty, "workers #{missing} got no wake for #{queue}"
  end
end
