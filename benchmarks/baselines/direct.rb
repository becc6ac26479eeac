# frozen_string_literal: true

# ============================================================================
# BENCHMARK BASELINE — NOT PRODUCT CODE.
#
# Per-worker LISTEN: one ruby-pg connection per worker process and one thread
# that owns it (what pgbus did before 0.13.1, and what ActionCable's
# PostgreSQL adapter does): drain commands, LISTEN, then block in
# wait_for_notify(health_check); a timeout runs SELECT 1.
# ============================================================================

require "pg"

module DirectBaseline
  PREFIX = "pgmq.q_"
  SUFFIX = ".INSERT"

  class Listener
    def initialize(url:, dispatch_queue:, wake_class:, health_check_ms: 250)
      @url = url
      @dispatch = dispatch_queue
      @wake = wake_class
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

    # :done once LISTEN ran (the ack is given on the thread's next cycle).
    def ensure_listening(queue)
      done = Queue.new
      @commands << [:listen, queue, done]
      # Wake the thread out of wait_for_notify so setup does not wait a full cycle.
      PG.connect(@url).tap { |c| c.exec("NOTIFY pgbus_bench_poke") }.close
      done.pop
    end

    # ensure_listening for many queues with one wake-up of the thread: an
    # answer per queue, in order.
    def ensure_listening_all(queues)
      done = queues.map do |queue|
        Queue.new.tap { |answer| @commands << [:listen, queue, answer] }
      end
      PG.connect(@url).tap { |c| c.exec("NOTIFY pgbus_bench_poke") }.close
      done.map(&:pop)
    end

    def stop
      @running = false
      @commands << [:stop]
      @thread&.join(@timeout + 2)
    end

    private

    def run
      @conn.exec("LISTEN pgbus_bench_poke")
      while @running
        until @commands.empty?
          cmd, queue, done = @commands.pop
          break @running = false if cmd == :stop

          channel = "#{PREFIX}#{queue}#{SUFFIX}"
          @conn.exec(%(LISTEN "#{channel}")) unless @listening[channel]
          @listening[channel] = true
          done << :done
        end
        break unless @running

        got = @conn.wait_for_notify(@timeout) do |channel, _pid, payload|
          next unless channel.start_with?(PREFIX) && channel.end_with?(SUFFIX)

          @dispatch << @wake.new(queue_name: channel[PREFIX.size...-SUFFIX.size],
                                 payload: payload.nil? || payload.empty? ? nil : payload)
        end
        @conn.exec("SELECT 1") if got.nil? && @running
      end
    ensure
      @conn&.close
    end
  end
end
