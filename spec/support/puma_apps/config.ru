# frozen_string_literal: true

# E2E rack app (tests only). Per process: GET /sub?q=STREAM[,STREAM...]&hold=SECONDS
# subscribes (pgbus: Streamer.current.subscribe; standalone: Pgbus::Hub.listener)
# and reports {pid, listener, result}; `bg=Q1,Q2` then subscribes those in a
# background thread after the response (a worker killed mid-subscription).
# Every wake is appended to $PGBUS_E2E_STATE_DIR/wakes-<pid>.log as JSON
# [queue, payload, CLOCK_MONOTONIC], every subscription's outcome to
# subs-<pid>.log as [queue, result, CLOCK_MONOTONIC].
require "json"

state_dir = ENV.fetch("PGBUS_E2E_STATE_DIR")
database_url = ENV.fetch("PGBUS_E2E_DATABASE_URL")
scope = ENV.fetch("PGBUS_E2E_SCOPE", "master")
append = lambda do |kind, row|
  row << Process.clock_gettime(Process::CLOCK_MONOTONIC)
  File.open(File.join(state_dir, "#{kind}-#{Process.pid}.log"), "a") { |f| f.syswrite("#{JSON.generate(row)}\n") }
end
record = ->(queue, payload) { append.call("wakes", [queue, payload]) }

if ENV.fetch("PGBUS_E2E_MODE") == "pgbus"
  # Gemfile order: pgbus-hub before or after pgbus.
  libs = ENV["PGBUS_E2E_HUB_FIRST"] == "1" ? ["pgbus/hub", "pgbus"] : ["pgbus", "pgbus/hub"]
  libs.each { |lib| require lib }
  Pgbus.configure do |c|
    c.streams_enabled = true
    c.database_url = database_url
    c.streams_listen_health_check_ms = 100
    c.streams_listen_scope = scope if ENV["PGBUS_E2E_SET_SCOPE"] == "1"
  end
  Pgbus.logger.level = Logger::INFO
  Pgbus::Web::Streamer.on_wake = ->(m) { record.call(m.queue_name, m.respond_to?(:payload) ? m.payload : nil) }
  subscribe = lambda do |stream|
    instance = Pgbus::Web::Streamer.current
    [instance.listener.class.name, instance.subscribe(stream)]
  end
else
  require "pgbus/hub"
  require "logger"
  Pgbus::Hub.configure do |c|
    c.connection = database_url
    c.listen_scope = scope
    c.channel_prefix = ""
    c.channel_suffix = ""
    c.health_check_ms = 100
    c.logger = Logger.new($stdout)
    c.socket_path = ENV["PGBUS_E2E_APP_SOCKET"] if ENV["PGBUS_E2E_APP_SOCKET"] # set in the app, after the plugin armed
  end
  listeners = {}
  lock = Mutex.new
  # PGBUS_E2E_DISPATCH_LIMIT bounds the dispatch queue as pgbus's
  # streams_dispatch_queue_limit does; `stall` pauses the app's consumer of it.
  limit = ENV["PGBUS_E2E_DISPATCH_LIMIT"]
  stalled_until = 0.0
  subscribe = lambda do |queue|
    listener = lock.synchronize do
      listeners[Process.pid] ||= begin
        wakes = limit ? SizedQueue.new(Integer(limit)) : Queue.new
        Thread.new do
          loop do
            sleep 0.01 while Process.clock_gettime(Process::CLOCK_MONOTONIC) < stalled_until
            m = wakes.pop
            record.call(m.queue_name, m.payload)
          end
        end
        Pgbus::Hub.listener(dispatch_queue: wakes)
      end
    end
    [listener.class.name, listener.ensure_listening(queue)]
  end
  stall = ->(seconds) { stalled_until = Process.clock_gettime(Process::CLOCK_MONOTONIC) + seconds }
end

run lambda { |env|
  req = Rack::Request.new(env)
  body = case req.path
         when "/sub"
           listener = result = nil
           req.params.fetch("q").split(",").each do |queue|
             listener, result = subscribe.call(queue)
             append.call("subs", [queue, result.to_s])
           end
           # stall=S (standalone): the app stops draining its wakes for S seconds, from now.
           stall.call(Float(req.params["stall"])) if req.params["stall"]
           background = req.params.fetch("bg", "").split(",")
           unless background.empty?
             delay = Float(req.params.fetch("bg_after", "0"))
             Thread.new do
               sleep delay
               background.each do |queue|
                 started = Process.clock_gettime(Process::CLOCK_MONOTONIC)
                 result = subscribe.call(queue).last.to_s
                 append.call("subs", [queue, result, Process.clock_gettime(Process::CLOCK_MONOTONIC) - started])
               end
             end
           end
           sleep Float(req.params.fetch("hold", "0"))
           { pid: Process.pid, listener: listener, result: result, socket: ENV["PGBUS_STREAMS_HUB_SOCKET"] }
         else
           { pid: Process.pid, native: $LOADED_FEATURES.grep(%r{pgbus_hub\.so\z}).first }
         end
  [200, { "content-type" => "application/json" }, [JSON.generate(body)]]
}
