# frozen_string_literal: true

# E2E rack app for spec/real_pgbus_spec.rb (tests only): REAL pgbus, whatever
# version is on the load path, with pgbus-hub added. Each worker builds one
# pgbus Streamer::Instance (its listener comes from pgbus's own
# build_listener, i.e. pgbus-hub's wiring) and ensure_listening's the stream's
# physical queue. GET /sub?q=STREAM -> {pid, listener, queue, result}. Every
# wake is appended to $PGBUS_E2E_STATE_DIR/wakes-<pid>.log as [queue, payload, t].
require "json"
require "logger"

state_dir = ENV.fetch("PGBUS_E2E_STATE_DIR")
libs = ENV["PGBUS_E2E_HUB_FIRST"] == "1" ? ["pgbus/hub", "pgbus"] : ["pgbus", "pgbus/hub"] # Gemfile order
libs.each { |lib| require lib }

Pgbus.configure do |c|
  c.database_url = ENV.fetch("PGBUS_E2E_DATABASE_URL")
  c.streams_enabled = true
  c.streams_listen_health_check_ms = 100
  c.streams_listen_scope = :master
  c.logger = Logger.new($stdout, level: Logger::INFO)
end

record = lambda do |queue, payload|
  row = JSON.generate([queue, payload, Process.clock_gettime(Process::CLOCK_MONOTONIC)])
  File.open(File.join(state_dir, "wakes-#{Process.pid}.log"), "a") { |f| f.syswrite("#{row}\n") }
end
lock = Mutex.new
instances = {}
instance_for_this_worker = lambda do
  lock.synchronize do
    instances[Process.pid] ||= begin
      wakes = Queue.new # pgbus's dispatcher is not started: this thread drains the wakes instead
      instance = Pgbus::Web::Streamer::Instance.new(dispatch_queue: wakes)
      instance.listener.start
      Thread.new { loop { wake = wakes.pop and record.call(wake.queue_name, wake.payload) } }
      instance
    end
  end
end

run lambda { |env|
  req = Rack::Request.new(env)
  body = if req.path == "/sub"
           instance = instance_for_this_worker.call
           queue = Pgbus.configuration.queue_name(req.params.fetch("q"))
           result = instance.listener.ensure_listening(queue)
           sleep Float(req.params.fetch("hold", "0"))
           { pid: Process.pid, listener: instance.listener.class.name, queue: queue, result: result }
         else
           { pid: Process.pid }
         end
  [200, { "content-type" => "application/json" }, [JSON.generate(body)]]
}
