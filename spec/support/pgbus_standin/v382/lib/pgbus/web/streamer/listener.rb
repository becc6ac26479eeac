# frozen_string_literal: true

module Pgbus
  module Web
    module Streamer
      # STAND-IN: pgbus's per-worker ruby-pg Listener of 0.13.1 (one thread owns
      # the connection; LISTEN via a command queue, acked; wakes -> dispatch queue).
      class Listener
        CHANNEL_PREFIX = "pgmq.q_"
        CHANNEL_SUFFIX = ".INSERT"
        # Data.define(:queue_name, :payload) in pgbus; Struct on Ruby 3.1.
        WakeMessage = Struct.new(:queue_name, :payload, keyword_init: true)

        attr_reader :listening_to

        def initialize(pg_connection:, dispatch_queue:, health_check_ms:, connection_factory:,
                       dispatch_queue_limit: 0, maintenance: nil, logger: Pgbus.logger, clock: nil)
          raise ArgumentError, "connection_factory is required" unless connection_factory.respond_to?(:call)

          @connection_factory = connection_factory # reconnects are not rendered in this stand-in
          @conn = pg_connection
          @dispatch_queue = dispatch_queue
          @health_check_ms = health_check_ms
          @logger = logger
          @commands = Queue.new
          @listening_to = Set.new
          @running = false
        end

        def start
          return self if @running

          @running = true
          @thread = Thread.new { run }
          self
        end

        def ensure_listening(queue)
          ack = Queue.new
          @commands << [:listen, queue, ack]
          deadline = (@health_check_ms / 1000.0) + 1.0
          waited = 0.0
          while ack.empty?
            return nil if waited >= deadline

            sleep 0.01
            waited += 0.01
          end
          ack.pop
        end

        def remove_listening(queue)
          @commands << [:unlisten, queue]
        end

        def stop
          @running = false
          @commands << [:stop]
          @thread&.join((@health_check_ms / 1000.0) + 5)
          self
        end

        def alive?
          @thread&.alive? || false
        end

        # 0.15+: its thread while alive (kept past a timed-out stop join, so a leak stays visible).
        def threads = [@thread].compact.select(&:alive?)

        def connected?
          !@conn.nil?
        end

        private

        def run
          while @running
            drain_commands
            break unless @running

            @conn.wait_for_notify(@health_check_ms / 1000.0) do |channel, _pid, payload|
              wake(channel, payload)
            end
          end
        rescue StandardError => e
          @logger.warn("[Pgbus::Streamer::Listener] #{e.class}: #{e.message}")
        ensure
          @listening_to.clear
          @conn&.close unless @conn.nil? || @conn.finished?
        end

        def drain_commands
          loop do
            command = @commands.pop(true)
            case command[0]
            when :listen
              channel = "#{CHANNEL_PREFIX}#{command[1]}#{CHANNEL_SUFFIX}"
              begin
                @conn.exec(%(LISTEN "#{channel}")) unless @listening_to.include?(channel)
                @listening_to << channel
              ensure
                command[2] << :done
              end
            when :unlisten
              channel = "#{CHANNEL_PREFIX}#{command[1]}#{CHANNEL_SUFFIX}"
              @conn.exec(%(UNLISTEN "#{channel}")) if @listening_to.delete?(channel)
            when :stop
              @running = false
            end
          end
        rescue ThreadError
          nil
        end

        def wake(channel, payload)
          return unless channel.start_with?(CHANNEL_PREFIX) && channel.end_with?(CHANNEL_SUFFIX)

          queue = channel.delete_prefix(CHANNEL_PREFIX).delete_suffix(CHANNEL_SUFFIX)
          @dispatch_queue << build_wake(queue, payload)
        end

        def build_wake(queue, payload)
          WakeMessage.new(queue_name: queue, payload: payload.nil? || payload.empty? ? nil : payload)
        end
      end
    end
  end
end
