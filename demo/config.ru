# frozen_string_literal: true

# The demo app (bin/demo). Per worker: one Pgbus::Hub.listener (hub client with
# fail-over, or a local listener) subscribed from boot to every topic, one
# dispatcher thread counting its wakes and fanning them to the worker's open
# SSE connections.
#   GET  /streams/:topic    Server-Sent Events (hijacked socket), one event per wake
#   POST /broadcast/:topic  NOTIFY topic (empty body: durable) / pg_notify(topic, body)
#   POST /send/:topic       the page's broadcast: {"sent_at": ms, "text": ...} (?bytes=N pads it;
#                           "large" goes through pgbus_hub_large_payloads, as ActionCable's do)
#   POST /hub/stop|start    the master's hub stopped / started again (a signal to the master)
#   GET  /stats.json        census, every worker's counters, hub stats
#   GET  /                  the live page
require "json"
require "logger"
require "pg"
require "pgbus/hub"

DATABASE_URL = ENV.fetch("DEMO_DATABASE_URL")
Pgbus::Hub.configure do |c|
  c.connection = DATABASE_URL
  c.listen_scope = ENV.fetch("DEMO_SCOPE", "master")
  c.channel_prefix = ""
  c.channel_suffix = ""
  c.health_check_ms = 100
  c.logger = Logger.new($stdout, level: Logger::INFO)
end

# One hijacked SSE connection with its own writer thread, so neither the
# dispatcher nor another client ever waits on it. Events queue up to a bound
# and are written in order; a client that stops reading is dropped, never
# silently skipped: more than MAX_PENDING_BYTES unsent, or a write that
# cannot make progress for STALL_SECONDS, closes it (the browser's
# EventSource then reconnects and gets a fresh "ready").
class SseStream
  MAX_PENDING_BYTES = 1 << 20
  STALL_SECONDS = 10

  def initialize(io, on_close:)
    @io = io
    @on_close = on_close
    @queue = Queue.new
    @pending = 0
    @lock = Mutex.new
    @writer = Thread.new { write_loop }
  end

  # Never blocks. False once the stream is closed (or closes on this chunk).
  def push(chunk)
    @lock.synchronize do
      return false if @queue.closed?

      if @pending + chunk.bytesize > MAX_PENDING_BYTES
        warn "[demo] SSE client #{Process.pid}: more than #{MAX_PENDING_BYTES} bytes unsent — dropping it"
        @queue.close
        @io.close rescue nil # rubocop:disable Style/RescueModifier
        return false
      end
      @pending += chunk.bytesize
      @queue << chunk
    end
    true
  end

  def close
    @queue.close
    @io.close unless @io.closed?
  rescue IOError
    nil
  end

  private

  def write_loop
    while (chunk = @queue.pop)
      write_fully(chunk)
      @lock.synchronize { @pending -= chunk.bytesize }
    end
  rescue IOError, SystemCallError => e
    warn "[demo] SSE client #{Process.pid}: #{e.message} — dropping it" unless e.is_a?(Errno::EPIPE) || e.is_a?(Errno::ECONNRESET) || @queue.closed?
  ensure
    close
    @on_close.call(self)
  end

  def write_fully(chunk)
    until chunk.empty?
      written = @io.write_nonblock(chunk, exception: false)
      if written == :wait_writable
        raise IOError, "client read nothing for #{STALL_SECONDS}s" unless @io.wait_writable(STALL_SECONDS)
      else
        chunk = chunk.byteslice(written..)
      end
    end
  end
end

# Everything that must not cross fork: built lazily, once per worker pid.
class DemoWorker
  TOPIC = /\A[a-z0-9_]{1,40}\z/.freeze
  # What every worker subscribes to from boot: two queues, and a raw channel
  # for payloads NOTIFY cannot carry (read once, by the hub, from the table).
  SUBSCRIPTIONS = { "alpha" => "alpha", "beta" => "beta", "large" => Pgbus::Hub.channel_key("demo_large") }.freeze
  STATE_DIR = ENV.fetch("DEMO_STATE_DIR", nil)

  def self.current
    @lock ||= Mutex.new
    @lock.synchronize do
      @instances ||= {}
      @instances[Process.pid] ||= new
    end
  end

  attr_reader :listener

  def initialize
    @wakes = Queue.new
    @streams = Hash.new { |h, k| h[k] = [] } # topic => [io]
    @lock = Mutex.new
    @db_lock = Mutex.new
    @delivered = 0
    @received = 0
    @listener = Pgbus::Hub.listener(dispatch_queue: @wakes)
    SUBSCRIPTIONS.each_value { |key| @listener.listen(key) }
    @dispatcher = Thread.new { dispatch_loop }
    @ticker = Thread.new { loop { sleep 1; @wakes << :tick } }
  end

  def self.key_for(topic) = SUBSCRIPTIONS.fetch(topic, topic)

  # Hijacks the socket, registers it, LISTENs (through the hub), then sends
  # a "ready" event: everything NOTIFYed after that event reaches this stream.
  def stream(env, topic)
    env["rack.hijack"].call
    io = env["rack.hijack_io"]
    io.write("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n" \
             "X-Accel-Buffering: no\r\nConnection: close\r\n\r\n")
    sse = SseStream.new(io, on_close: ->(closed) { forget(closed) })
    @lock.synchronize { @streams[DemoWorker.key_for(topic)] << sse }
    result = @listener.ensure_listening(DemoWorker.key_for(topic))
    send_event(sse, "ready", { pid: Process.pid, topic: topic, listen: result.to_s, listener: listener_kind })
  rescue StandardError
    sse ? sse.close : io&.close
  end

  def broadcast(topic, body)
    with_db do |db|
      if body.empty?
        db.exec("NOTIFY #{db.quote_ident(topic)}")
      else
        db.exec_params("select pg_notify($1, $2)", [topic, body])
      end
    end
  end

  # The page's message: when it was sent (ms since the epoch, for the page's
  # latency histogram), padded to `bytes`. "large" is a raw channel: a payload
  # of 8000 bytes or more goes into pgbus_hub_large_payloads and its id is NOTIFYed.
  def send_stamped(topic, bytes)
    sent_at = Process.clock_gettime(Process::CLOCK_REALTIME, :float_millisecond)
    text = "sent from worker #{Process.pid}"
    payload = JSON.generate({ sent_at: sent_at, text: text })
    payload = JSON.generate({ sent_at: sent_at, text: text + ("." * (bytes - payload.bytesize)) }) if bytes > payload.bytesize
    return broadcast(topic, payload) unless topic == "large"

    with_db do |db|
      if payload.bytesize >= Pgbus::Hub::NOTIFY_PAYLOAD_LIMIT
        db.exec(Pgbus::Hub::LARGE_PAYLOAD_DDL)
        payload = "#{Pgbus::Hub::LARGE_PAYLOAD_MARK}#{db.exec_params(Pgbus::Hub::LARGE_PAYLOAD_INSERT, [payload]).getvalue(0, 0)}"
      end
      db.exec_params("select pg_notify($1, $2)", ["demo_large", payload])
    end
  end

  def census
    with_db do |db|
      db.exec("select count(*) from pg_stat_activity where application_name = 'pgbus-listen'").getvalue(0, 0).to_i
    end
  end

  # This worker's connection for NOTIFY and the census; one fresh retry when
  # the server dropped it (e.g. PostgreSQL restarted).
  def with_db
    @db_lock.synchronize do
      attempts = 0
      begin
        @db = nil if @db&.finished?
        @db ||= PG.connect(DATABASE_URL)
        yield @db
      rescue PG::ConnectionBad, PG::UnableToSend
        @db&.close rescue nil # rubocop:disable Style/RescueModifier
        @db = nil
        retry if (attempts += 1) < 2
        raise
      end
    end
  end

  def listener_kind
    return "local (own connection)" if @listener.is_a?(Pgbus::Hub::Listener)

    @listener.failed_over? ? "failed over (own connection)" : "hub"
  end

  def info
    { pid: Process.pid, listener: listener_kind, open_streams: @lock.synchronize { @streams.values.sum(&:size) },
      received: @received, delivered: @delivered }
  end

  # Every live worker's info, as each last wrote it (the page shows them all,
  # whichever worker answers its request).
  def self.all_infos
    return [current.info] unless STATE_DIR

    Dir[File.join(STATE_DIR, "worker-*.json")].filter_map do |path|
      info = JSON.parse(File.read(path), symbolize_names: true)
      ::Process.kill(0, info[:pid]) && info
    rescue Errno::ESRCH, Errno::ENOENT, JSON::ParserError
      nil
    end.sort_by { |info| info[:pid] }
  end

  private

  def dispatch_loop
    ticks = 0
    loop do
      wake = @wakes.pop
      if wake == :tick
        each_stream(nil) { |sse| sse.push(": keepalive\n\n") } if ((ticks += 1) % 15).zero?
        write_state
        next
      end
      @received += 1
      data = { pid: Process.pid, topic: SUBSCRIPTIONS.key(wake.queue_name) || wake.queue_name, payload: wake.payload,
               durable: wake.payload.nil?, at: Process.clock_gettime(Process::CLOCK_REALTIME) }
      each_stream(wake.queue_name) { |sse| send_event(sse, "wake", data) && (@delivered += 1) }
      write_state if @wakes.empty?
    rescue StandardError => e
      warn "[demo] dispatcher: #{e.class}: #{e.message}"
    end
  end

  def write_state
    return unless STATE_DIR

    path = File.join(STATE_DIR, "worker-#{Process.pid}.json")
    File.write("#{path}.tmp", JSON.generate(info))
    File.rename("#{path}.tmp", path)
  end

  def each_stream(topic, &block)
    streams = @lock.synchronize { topic ? @streams[topic].dup : @streams.values.flatten }
    streams.each(&block)
  end

  def send_event(sse, name, data)
    sse.push("event: #{name}\ndata: #{JSON.generate(data)}\n\n")
  end

  def forget(sse)
    @lock.synchronize { @streams.each_value { |list| list.delete(sse) } }
  end
end

PAGE = File.read(File.join(__dir__, "index.html"))

def json(status, body)
  [status, { "content-type" => "application/json", "cache-control" => "no-cache" }, [JSON.generate(body)]]
end

def stats_body
  worker = DemoWorker.current
  socket = ENV.fetch(Pgbus::Hub::DEFAULT_SOCKET_ENV, nil)
  hub = begin
    Pgbus::Hub.stats(socket_path: socket, timeout: 1.0)
  rescue Pgbus::Hub::HubUnavailableError => e
    { error: e.message }
  end
  { census: worker.census, scope: Pgbus::Hub.configuration.listen_scope, socket: socket, hub: hub,
    worker: worker.info, workers: DemoWorker.all_infos, worker_count: Integer(ENV.fetch("DEMO_WORKERS", "4")) }
end

# The page's hub buttons: a signal to the Puma master (demo/puma.rb traps them).
HUB_SIGNALS = { "stop" => "WINCH", "start" => "URG" }.freeze

# The ActionCable page, when ActionCable is installed.
CABLE = begin
  require_relative "cable"
  DemoCable
rescue LoadError
  nil
end

run lambda { |env|
  cable = CABLE&.call(env)
  next cable if cable

  method = env["REQUEST_METHOD"]
  path = env["PATH_INFO"]
  case [method, path]
  in ["GET", "/"]
    [200, { "content-type" => "text/html; charset=utf-8", "cache-control" => "no-cache" }, [PAGE]]
  in ["GET", "/health"]
    json(200, { pid: Process.pid })
  in ["GET", "/stats.json"]
    json(200, stats_body)
  in ["GET", %r{\A/streams/([^/]+)\z}]
    topic = path.split("/").last
    next json(400, { error: "bad topic" }) unless topic.match?(DemoWorker::TOPIC)

    DemoWorker.current.stream(env, topic)
    [200, {}, []] # ignored: the socket was hijacked
  in ["POST", %r{\A/send/(alpha|beta|large)\z}]
    bytes = env["QUERY_STRING"].to_s[/(?:\A|&)bytes=(\d{1,7})/, 1].to_i
    DemoWorker.current.send_stamped(path.split("/").last, bytes)
    json(200, { pid: Process.pid, bytes: bytes })
  in ["POST", %r{\A/hub/(stop|start)\z}]
    ::Process.kill(HUB_SIGNALS.fetch(path.split("/").last), ::Process.ppid)
    json(200, { pid: Process.pid, master: ::Process.ppid })
  in ["POST", %r{\A/broadcast/([^/]+)\z}]
    topic = path.split("/").last
    next json(400, { error: "bad topic" }) unless topic.match?(DemoWorker::TOPIC)

    body = env["rack.input"].read.to_s.dup.force_encoding(Encoding::UTF_8) # NullIO gives a frozen ""
    next json(400, { error: "payload must be UTF-8, at most 7999 bytes" }) unless body.valid_encoding? && body.bytesize < 8000

    DemoWorker.current.broadcast(topic, body)
    json(200, { pid: Process.pid, topic: topic, durable: body.empty? })
  else
    json(404, { error: "not found" })
  end
}
