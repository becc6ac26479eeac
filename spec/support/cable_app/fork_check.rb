# frozen_string_literal: true

# Run by spec/action_cable_spec.rb in a Ruby of its own (ActiveSupport stays
# out of the suite's process): an adapter with cable.yml's url and no hub
# (a process LISTENing on its own connection, as in Puma's single mode)
# subscribes and receives in a parent, then in a forked child that inherited
# it; every step's outcome is printed as one JSON object.
require "json"
require "logger"
require "timeout"
require "action_cable"
require "active_support/all" # as in a Rails app (ActionCable alone expects its core extensions)

server = ActionCable::Server::Base.new
server.config.cable = ActiveSupport::HashWithIndifferentAccess.new(adapter: "pgbus_hub", url: ENV.fetch("CABLE_URL"))
server.config.logger = Logger.new($stderr, level: Logger::WARN)
adapter = server.pubsub
room = "fork_check_#{Process.pid}"

# [confirmed?, messages received] for a subscribe then broadcasts of +payloads+ on +room+.
exchange = lambda do |payloads|
  confirmed = Queue.new
  received = Queue.new
  adapter.subscribe(room, ->(message) { received << message }, -> { confirmed << true })
  Timeout.timeout(10) { confirmed.pop }
  payloads.each { |payload| adapter.broadcast(room, payload) }
  [true, Timeout.timeout(10) { Array.new(payloads.size) { received.pop } } == payloads]
end
ours = -> { Thread.list.select { |t| t.alive? && t.name.to_s.start_with?("pgbus-hub") }.map(&:name).sort }

report = { parent: exchange.call(["parent", "p" * 20_000]), parent_threads: ours.call }
reader, writer = IO.pipe
child = fork do
  reader.close
  inherited = ours.call # threads do not survive fork
  result = exchange.call(["child", "c" * 20_000])
  threads = ours.call
  adapter.shutdown
  writer.write(JSON.generate(inherited: inherited, child: result, child_threads: threads, after_shutdown: ours.call))
  writer.close
  exit!(0)
end
writer.close
report.merge!(JSON.parse(reader.read))
Process.wait(child)
adapter.shutdown
report[:parent_after_shutdown] = ours.call
puts JSON.generate(report)
