# frozen_string_literal: true

# Run by spec/events_spec.rb in a Ruby of its own (ActiveSupport stays out of
# the suite's process): a MasterHub and a FailoverListener in this process, a
# real ActiveSupport::Notifications subscriber, and each fault the events
# report, made for real. Prints Marshal.dump of
# { events: [[name, payload, publishing thread's name], ...], steps: {...} }.
require "logger"
require "stringio"
require "timeout"
require "tmpdir"
require "active_support"
require "active_support/notifications"
require "pgbus/hub"
require_relative "database"

seen = Queue.new
ActiveSupport::Notifications.subscribe(/\.pgbus_hub\z/) do |name, _start, _finish, _id, payload|
  seen << [name, payload, Thread.current.name]
end
events = []
# Until +totals+ (name => count since the start) were seen, in any order
# (the hub's and the worker's events of one fault race each other).
await = lambda do |totals|
  Timeout.timeout(15) do
    events << seen.pop until totals.all? { |name, total| events.count { |event| event[0] == name } >= total }
  end
end
steps = {}
ours = -> { Thread.list.select { |t| t.alive? && t.name == Pgbus::Hub::Events::THREAD_NAME }.size }
quiet = Logger.new(StringIO.new)

Timeout.timeout(90) do
  Dir.mktmpdir("pgbus-hub-events") do |dir|
    socket = File.join(dir, "hub.sock")
    start_hub = lambda do
      Pgbus::Hub::MasterHub.new(connection: TestDatabase.url, socket_path: socket, logger: quiet,
                                durable_queue_limit: 4, hard_queue_limit: 256).start
    end
    hub = start_hub.call
    wait_for("hub healthy") { hub.stats[:listener_healthy] }
    begin
      hub.start # refused: the running hub keeps the thread
    rescue Pgbus::Hub::Error => e
      steps[:second_start] = e.message
    end
    steps[:threads_with_the_hub_alone] = ours.call
    # Only this hub's own LISTEN backend, in this run's database: a reconnect with no queue
    # subscribed is one too (queues: 0).
    terminate = -> { TestDatabase.with { |conn| conn.exec_params("select pg_terminate_backend($1)", [hub.stats[:backend_pid]]) } }
    terminate.call
    await.call("reconnect.pgbus_hub" => 1)
    wait_for("hub healthy again") { hub.stats[:listener_healthy] }
    listener = Pgbus::Hub::FailoverListener.new(socket_path: socket, connection: TestDatabase.url,
                                                dispatch_queue: Queue.new, logger: quiet).start
    steps[:threads_running] = ours.call
    listener.start # idempotent
    steps[:threads_after_second_starts] = ours.call
    steps[:ensure_listening] = listener.ensure_listening("ev_sub")
    await.call("subscribe.pgbus_hub" => 1)

    terminate.call
    await.call("reconnect.pgbus_hub" => 2, "hub_health.pgbus_hub" => 2) # false, then true

    # A worker that never reads: its socket fills, then its outbox: durable
    # wakes over the limit are dropped, then past the hard limit it is evicted.
    stuck = WirePeer.new(socket)
    stuck.subscribe("ev_flood")
    big = "e" * 7000
    sent = 0
    while hub.stats[:dropped_durable_wakes].zero? && sent < 3000
      TestDatabase.notify("ev_flood", big)
      TestDatabase.notify("ev_flood") # durable
      sent += 1
    end
    await.call("drop.pgbus_hub" => 1)
    TestDatabase.notify("ev_flood", big) while hub.stats[:evicted_workers].zero? && (sent += 1) < 6000
    await.call("evict.pgbus_hub" => 1)
    stuck.close

    hub.stop
    await.call("fail_over.pgbus_hub" => 1)
    steps[:threads_while_only_the_listener_runs] = ours.call
    hub = start_hub.call
    await.call("fail_back.pgbus_hub" => 1)
    steps[:state_after_fail_back] = listener.state

    # A listener with no hub to try: its own connection.
    standalone = Pgbus::Hub::Listener.new(connection: TestDatabase.url, dispatch_queue: Queue.new, logger: quiet).start
    standalone.ensure_listening("ev_own")
    await.call("subscribe.pgbus_hub" => 2)
    standalone.stop

    listener.stop
    hub.stop
    steps[:threads_after_stop] = ours.call
    steps[:enabled_after_stop] = Pgbus::Hub::Events.enabled?
    steps[:events_stats] = Pgbus::Hub::Events.stats
    events << seen.pop until seen.empty?
  rescue Exception # rubocop:disable Lint/RescueException -- what was seen says where it stopped
    warn "events seen: #{events.inspect}; steps: #{steps.inspect}; hub: #{hub&.stats.inspect}"
    raise
  ensure
    listener&.stop
    hub&.stop
  end
end
$stdout.binmode
$stdout.write(Marshal.dump(events: events, steps: steps))
