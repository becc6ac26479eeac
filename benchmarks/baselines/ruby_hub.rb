# frozen_string_literal: true

# ============================================================================
# BENCHMARK BASELINE — NOT PRODUCT CODE.
#
# A small plain-Ruby hub and client of pgbus 0.13.1's design, written from the
# behaviour description in /work/shared/pgbus-contract.md §2, §3, §5 (not from
# pgbus's code, not using our extension). Used only by benchmarks/run.rb to
# compare the native MasterHub / HubClient against the design they replace:
#
#   hub:    one ruby-pg LISTEN thread (drains commands, then blocks in
#           wait_for_notify(health_check); a timeout runs SELECT 1; a sub's ack
#           is pushed when the command is drained, i.e. after the current
#           wait_for_notify cycle), a fan-out thread, a status thread, an accept
#           thread, and a reader + a writer thread per worker; frames are
#           JSON-encoded by each worker's writer (re-encoded per worker);
#           durable_queue_limit / hard_queue_limit drop and evict like pgbus.
#   client: one reader thread; ensure_listening registers a waiter, writes
#           `sub`, waits for the ack with a timeout.
#
# Run as a process:  ruby benchmarks/baselines/ruby_hub.rb SOCKET DATABASE_URL [HEALTH_MS]
# prints "ready"; stdin line "stats" -> one JSON line; EOF/"quit" -> stop, exit.
# ============================================================================

require "json"
require "socket"
require "pg"
require "set"

module RubyHubBaseline
  PREFIX = "pgmq.q_"
  SUFFIX = ".INSERT"
  Wake = Struct.new(:queue_name, :payload, keyword_init: true)

  # A one-shot value with a timed wait (Ruby 3.1 has no Queue#pop(timeout:)).
  class Latch
    def initialize
      @lock = Mutex.new
      @cond = ConditionVariable.new
      @value = nil
    end

    def set(value)
      @lock.synchronize do
        @value = value
        @cond.broadcast
      end
    end

    def wait(timeout)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      @lock.synchronize do
        while @value.nil?
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          break if left <= 0

          @cond.wait(@lock, left)
        end
        @value
      end
    end
  end

  module Wire
    module_function

    def encode(message)
      body = JSON.generate(message).b
      [body.bytesize].pack("N") << body
    end

    def read(io)
      header = io.read(4)
      return nil unless header && header.bytesize == 4

      body = io.read(header.unpack1("N"))
      return nil unless body

      JSON.parse(body.force_encoding(Encoding::UTF_8))
    rescue Errno::ECONNRESET, IOError
      nil
    end
  end

  # pgbus 0.13.1's Listener shape: one thread owns the connection.
  class Listener
    def initialize(url, dispatch_queue, health_check_ms)
      @url = url
      @dispatch = dispatch_queue
      @timeout = health_check_ms / 1000.0
      @commands = Queue.new
      @listening = {}
      @running = true
    end

    def start
      @conn = PG.connect(@url, fallback_application_name: "pgbus-listen") # URL or keywords
      @thread = Thread.new { run }
      self
    end

    def alive? = @thread&.alive?
    def connected? = !@conn.nil?

    def ensure_listening(queue, ack_timeout = @timeout + 1.0)
      ack = Latch.new
      @commands << [:listen, queue, ack]
      ack.wait(ack_timeout)
    end

    def remove_listening(queue) = @commands << [:unlisten, queue]

    def stop
      @running = false
      @commands << [:stop]
      @thread&.join(@timeout + 5)
    end

    private

    def run
      while @running
        until @commands.empty?
          cmd, queue, ack = @commands.pop
          channel = "#{PREFIX}#{queue}#{SUFFIX}"
          case cmd
          when :listen
            begin
              @conn.exec(%(LISTEN "#{channel}")) unless @listening[channel]
              @listening[channel] = true
            ensure
              ack.set(:done)
            end
          when :unlisten
            @conn.exec(%(UNLISTEN "#{channel}")) if @listening.delete(channel)
          when :stop then @running = false
          end
        end
        break unless @running

        got = @conn.wait_for_notify(@timeout) do |channel, _pid, payload|
          next unless channel.start_with?(PREFIX) && channel.end_with?(SUFFIX)

          q = channel[PREFIX.size...-SUFFIX.size]
          @dispatch << Wake.new(queue_name: q, payload: payload.nil? || payload.empty? ? nil : payload)
        end
        @conn.exec("SELECT 1") if got.nil? && @running
      end
    ensure
      @conn&.close
    end
  end

  # pgbus 0.13.1's MasterHub shape.
  class Hub
    Entry = Struct.new(:id, :sock, :subs, :outbox, :durable, :open, :lock, :cond)

    attr_reader :dropped_durable_wakes, :evicted_workers

    def initialize(url:, socket_path:, health_check_ms: 250, status_interval: 1.0,
                   durable_queue_limit: 256, hard_queue_limit: 1024)
      @url = url
      @path = socket_path
      @health = health_check_ms
      @status_interval = status_interval
      @durable_limit = durable_queue_limit
      @hard_limit = hard_queue_limit
      @table = Mutex.new
      @workers = {}
      @refs = Hash.new { |h, k| h[k] = Set.new }
      @next_id = 0
      @dropped_durable_wakes = 0
      @evicted_workers = 0
      @dispatch = Queue.new
      @stop_latch = Latch.new
    end

    def start
      @running = true
      @listener = Listener.new(@url, @dispatch, @health).start
      File.delete(@path) if File.exist?(@path)
      @server = UNIXServer.new(@path)
      File.chmod(0o600, @path)
      @accept = Thread.new { accept_loop }
      @fanout = Thread.new { fanout_loop }
      @status = Thread.new { status_loop }
      self
    end

    def stop
      return self unless @running

      @running = false
      @stop_latch.set(:stop)
      @server.close
      @dispatch << :stop
      @table.synchronize { @workers.keys }.each { |id| cleanup(id) }
      [@accept, @fanout, @status].each { |t| t.join(2) }
      @listener.stop
      File.delete(@path) if File.exist?(@path)
      self
    end

    private

    def accept_loop
      while @running
        sock = @server.accept
        entry = @table.synchronize do
          @next_id += 1
          @workers[@next_id] = Entry.new(@next_id, sock, Set.new, [], 0, true, Mutex.new, ConditionVariable.new)
        end
        Thread.new(entry) { |e| reader(e) }
        Thread.new(entry) { |e| writer(e) }
      end
    rescue IOError, Errno::EBADF
      nil
    end

    def reader(entry)
      while (frame = Wire.read(entry.sock))
        case frame["t"]
        when "sub"
          q = frame["q"]
          @table.synchronize do
            entry.subs << q
            @refs[q] << entry.id
          end
          @listener.ensure_listening(q) # result ignored, as in pgbus 0.13.1
          enqueue(entry, { "t" => "ack", "q" => q }, false)
        when "unsub"
          q = frame["q"]
          release = @table.synchronize do
            entry.subs.delete(q)
            refs = @refs[q]
            refs.delete(entry.id)
            refs.empty? ? (@refs.delete(q) && true) : false
          end
          @listener.remove_listening(q) if release
        end
      end
    rescue IOError, Errno::EBADF, Errno::ECONNRESET
      nil
    ensure
      cleanup(entry.id)
    end

    def writer(entry)
      loop do
        frame, droppable = entry.lock.synchronize do
          entry.cond.wait(entry.lock) while entry.open && entry.outbox.empty?
          break nil unless entry.open

          item = entry.outbox.shift
          entry.durable -= 1 if item[1]
          item
        end
        break if frame.nil? && droppable.nil?

        entry.sock.write(Wire.encode(frame)) # blocking write, as in pgbus 0.13.1
      end
    rescue Errno::EPIPE, Errno::ECONNRESET, IOError, Errno::EBADF
      nil
    ensure
      cleanup(entry.id)
    end

    def enqueue(entry, frame, droppable)
      evict = false
      entry.lock.synchronize do
        return unless entry.open

        if droppable && entry.durable >= @durable_limit
          @dropped_durable_wakes += 1
          return
        end
        entry.outbox << [frame, droppable]
        entry.durable += 1 if droppable
        entry.cond.signal
        evict = entry.outbox.size > @hard_limit
      end
      return unless evict

      @evicted_workers += 1
      cleanup(entry.id)
    end

    def fanout_loop
      while (wake = @dispatch.pop) != :stop
        targets = @table.synchronize do
          ids = @refs.key?(wake.queue_name) ? @refs[wake.queue_name].to_a : []
          ids.filter_map { |id| @workers[id] }
        end
        frame = { "t" => "wake", "q" => wake.queue_name, "p" => wake.payload }
        targets.each { |entry| enqueue(entry, frame, wake.payload.nil?) }
      end
    end

    def status_loop
      last = nil
      tick = 0
      while @running
        healthy = @listener.alive? && @listener.connected?
        if healthy != last || (tick % 5).zero?
          @table.synchronize { @workers.values }.each { |e| enqueue(e, { "t" => "status", "healthy" => healthy }, false) }
          last = healthy
        end
        tick += 1
        break if @stop_latch.wait(@status_interval)
      end
    end

    def cleanup(id)
      entry = @table.synchronize { @workers.delete(id) }
      return unless entry

      entry.lock.synchronize do
        entry.open = false
        entry.cond.broadcast
      end
      entry.sock.close unless entry.sock.closed?
      released = @table.synchronize do
        entry.subs.select do |q|
          refs = @refs[q]
          refs.delete(id)
          refs.empty? && @refs.delete(q)
        end
      end
      released.each { |q| @listener.remove_listening(q) }
    rescue IOError
      nil
    end
  end

  # pgbus 0.13.1's HubClient shape.
  class Client
    class Unavailable < StandardError; end

    def initialize(socket_path:, dispatch_queue:, ack_timeout: 2.0)
      @path = socket_path
      @dispatch = dispatch_queue
      @ack_timeout = ack_timeout
      @lock = Mutex.new
      @cond = ConditionVariable.new
      @pending = Hash.new { |h, k| h[k] = [] }
      @write_lock = Mutex.new
      @healthy = true
      @dead = false
    end

    def connect
      @sock = UNIXSocket.new(@path)
      @reader = Thread.new { read_loop }
      self
    end

    def ensure_listening(queue)
      raise Unavailable, "dead" if @dead

      slot = [nil]
      @lock.synchronize { @pending[queue] << slot }
      write({ "t" => "sub", "q" => queue })
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + @ack_timeout
      @lock.synchronize do
        while slot[0].nil?
          left = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          if left <= 0
            @pending[queue].delete(slot)
            raise Unavailable, "master hub ack timeout for #{queue}"
          end
          @cond.wait(@lock, left)
        end
      end
      raise Unavailable, "master hub died while awaiting ack for #{queue}" if slot[0] == :dead

      :done
    end

    def remove_listening(queue)
      write({ "t" => "unsub", "q" => queue }) unless @dead
      nil
    rescue Unavailable
      nil
    end

    def stop
      @dead = true
      @sock&.close
      @reader&.join(2)
      self
    end

    private

    def write(message)
      data = Wire.encode(message)
      @write_lock.synchronize do
        until data.empty?
          n = @sock.write_nonblock(data, exception: false)
          if n == :wait_writable
            raise Unavailable, "write stalled" unless @sock.wait_writable(@ack_timeout)
          else
            data = data.byteslice(n..)
          end
        end
      end
    rescue IOError, SystemCallError => e
      raise Unavailable, e.message
    end

    def read_loop
      while (frame = Wire.read(@sock))
        case frame["t"]
        when "wake" then @dispatch << Wake.new(queue_name: frame["q"], payload: frame["p"])
        when "ack"
          @lock.synchronize do
            slot = @pending[frame["q"]].shift
            if slot
              slot[0] = :ack
              @cond.broadcast
            end
          end
        when "status" then @healthy = frame["healthy"]
        end
      end
    rescue IOError, SystemCallError
      nil
    ensure
      @lock.synchronize do
        @dead = true
        @pending.each_value { |slots| slots.each { |s| s[0] = :dead } }
        @cond.broadcast
      end
    end
  end
end

if $PROGRAM_NAME == __FILE__
  path, url, health = ARGV
  hub = RubyHubBaseline::Hub.new(url: url, socket_path: path, health_check_ms: Integer(health || 250)).start
  $stdout.sync = true
  $stdout.puts "ready"
  while (line = $stdin.gets)
    case line.strip
    when "stats"
      $stdout.puts JSON.generate({ dropped_durable_wakes: hub.dropped_durable_wakes,
                                   evicted_workers: hub.evicted_workers })
    when "quit" then break
    end
  end
  hub.stop
  exit!(0)
end
