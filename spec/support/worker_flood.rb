# frozen_string_literal: true

# Run by spec/worker_bounds_spec.rb in a Ruby of its own (its RSS is the worker's alone, and
# ActiveSupport stays out of the suite's process): a FailoverListener on its own connection (no
# hub) whose dispatch queue is blocked, flooded through real NOTIFYs. Prints Marshal.dump of
# { rss_kb: [after the first flood, after the second], dropped:, delivered:, events: }.
require "timeout"
require "active_support"
require "active_support/notifications"
require "pgbus/hub"
require_relative "database"

queue = ARGV.fetch(0)            # the payload queue; durable ones are "#{queue}_d0".."_d(K-1)"
floods = Integer(ARGV.fetch(1))  # payload wakes per flood (two floods)
durable_queues = Integer(ARGV.fetch(2))
channel = ->(q) { "pgmq.q_#{q}.INSERT" }
drops = Queue.new
ActiveSupport::Notifications.subscribe("drop.pgbus_hub") { |*, payload| drops << payload }

rss_kb = -> { File.read("/proc/self/status")[/^VmRSS:\s+(\d+)/, 1].to_i }
dispatch = SizedQueue.new(1)
dispatch << :plug # full: the pump blocks on the first wake it hands over
listener = Pgbus::Hub::FailoverListener.new(socket_path: File.join(Dir.tmpdir, "pgbus-hub-no-hub-#{Process.pid}.sock"),
                                            connection: TestDatabase.url, dispatch_queue: dispatch).start
durable = Array.new(durable_queues) { |i| "#{queue}_d#{i}" }
[queue, *durable].each { |q| raise "not listening to #{q}" unless listener.ensure_listening(q) == :done }
conn = TestDatabase.connect
received = ->(total) { Timeout.timeout(60) { sleep 0.05 until listener.stats[:notifications] >= total } }

conn.exec("select pg_notify('#{channel.call(queue)}', 'first')")
Timeout.timeout(10) { sleep 0.01 until dispatch.num_waiting == 1 } # the pump holds "first", blocked
sent = 1
rss = []
2.times do |round|
  # 4 kB payloads, each distinct (PostgreSQL folds equal ones within a transaction).
  conn.exec("select pg_notify('#{channel.call(queue)}', '#{round}:' || i || ':' || repeat('x', 4000)) " \
            "from generate_series(1, #{floods}) i")
  sent += floods
  received.call(sent)
  GC.start
  rss << rss_kb.call
end
# Durable wakes, one transaction each (equal ones in one transaction would be one NOTIFY).
conn.exec(<<~SQL)
  do $$ begin
    for i in 1..10 loop
      for q in 0..#{durable_queues - 1} loop
        perform pg_notify('pgmq.q_#{queue}_d' || q || '.INSERT', '');
        commit;
      end loop;
    end loop;
  end $$
SQL
sent += 10 * durable_queues
received.call(sent)
dropped = listener.stats[:dropped_payloads]

delivered = []
dispatch.pop # the plug: the pump goes on
loop do
  item = Timeout.timeout(2) { dispatch.pop }
  delivered << [item.queue_name, item.payload && item.payload[/\A[^:]*:?\d*/]]
rescue Timeout::Error
  break
end
events = []
Timeout.timeout(10) { events << drops.pop until events.sum { |e| e[:dropped] } >= dropped }
listener.stop
conn.close
$stdout.write(Marshal.dump({ rss_kb: rss, dropped: dropped, delivered: delivered, events: events }))
