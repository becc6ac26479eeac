# frozen_string_literal: true

require "socket"
require_relative "../cable_client"

module Soak
  def self.now = Process.clock_gettime(Process::CLOCK_REALTIME)

  # One connection's life: the worker that served it, when it was confirmed
  # (subscribed: its LISTEN runs) and when it ended (nil: still open).
  Session = Struct.new(:pid, :confirmed_at, :ended_at)

  # A client that stays connected for the whole soak: on every disconnect it
  # connects again (0.2 s, then doubling to 1 s between attempts; stops at
  # `stop` or its deadline). Records each session and every message it got as
  # [seq, received_at, session index].
  class Client
    CONFIRM_TIMEOUT = 15

    attr_reader :name, :sessions

    def initialize(name, port, channel, deadline:)
      @name = name
      @port = port
      @channel = channel
      @deadline = deadline
      @sessions = []
      @arrivals = []
      @lock = Mutex.new
      @stopping = false
      @thread = Thread.new { run }
    end

    def arrivals = @lock.synchronize { @arrivals.dup }

    # The pid of the worker serving it now (nil while disconnected).
    def current_pid = @lock.synchronize { (s = @sessions.last) && s.ended_at.nil? ? s.pid : nil }

    def connected? = !current_pid.nil?

    def stop
      @stopping = true
      @thread.join(10) || @thread.kill
    end

    private

    def run
      pause = 0.2
      until @stopping || Soak.now > @deadline
        connection = index = started = nil
        begin
          connection = open_connection
          started = Soak.now
          if (confirmed = wait_confirmed(connection))
            pause = 0.2
            index = @lock.synchronize { (@sessions << Session.new(*confirmed, nil)).size - 1 }
            sleep 0.05 until @stopping || ended_at(connection) || Soak.now > @deadline
          end
        rescue IOError, SystemCallError
          nil # refused or reset: try again
        ensure
          finish(connection, index) if connection
        end
        break if @stopping

        sleep pause
        pause = [pause * 2, 1.0].min if started.nil? || Soak.now - started < 5
      end
    end

    # Closes the connection; a confirmed one's messages are recorded and its session ended.
    def finish(connection, index)
      ended = ended_at(connection)
      close_connection(connection)
      return unless index

      rows = messages_of(connection)
      @lock.synchronize do
        rows.each { |seq, at| @arrivals << [seq, at, index] }
        @sessions[index].ended_at = ended || ended_at(connection) || Soak.now
      end
    end

    # Returns [pid, confirmed_at] once subscribed, nil if it timed out or ended.
    def wait_confirmed(connection)
      give_up = Soak.now + CONFIRM_TIMEOUT
      until @stopping || Soak.now > give_up
        confirmed = confirmation(connection)
        return confirmed if confirmed
        return nil if ended_at(connection)

        sleep 0.005
      end
      nil
    end
  end

  # An ActionCable client (CableClient, websocket-driver) on RoomChannel.
  class CableSoakClient < Client
    private

    def open_connection
      CableClient.new(@port, connect_timeout: 2).tap { |c| c.subscribe(@channel) }
    end

    def confirmation(client)
      at = client.confirmed_at(@channel)
      [client.pid, at] if at && client.pid
    end

    def ended_at(client) = client.closed? ? client.closed_at : nil

    def close_connection(client) = client.close

    def messages_of(client)
      client.messages.filter_map { |_room, m, at| [m["seq"], at] if m.is_a?(Hash) && m["seq"] }
    end
  end

  # A streaming HTTP client of the app's /stream?ch=NAME (hijacked response):
  # "ready PID RESULT" once LISTEN runs, then "SEQ SENT_AT" lines.
  class StreamSoakClient < Client
    Conn = Struct.new(:socket, :reader, :ready, :ended_at, :rows)

    private

    def open_connection
      socket = Socket.tcp("127.0.0.1", @port, connect_timeout: 2)
      socket.write("GET /stream?ch=#{@channel} HTTP/1.1\r\nhost: 127.0.0.1\r\n\r\n")
      conn = Conn.new(socket, nil, nil, nil, [])
      conn.reader = Thread.new { read(conn) }
      conn
    end

    def read(conn)
      headers = true
      while (line = conn.socket.gets)
        at = Soak.now
        if headers
          headers = false if line == "\r\n"
        elsif line.start_with?("ready ")
          conn.ready = [Integer(line.split[1]), at]
        else
          seq = line.split.first
          @lock.synchronize { conn.rows << [Integer(seq), at] } if seq
        end
      end
    rescue IOError, SystemCallError, ArgumentError
      nil
    ensure
      conn.ended_at = Soak.now
    end

    def confirmation(conn) = conn.ready
    def ended_at(conn) = conn.ended_at

    def close_connection(conn)
      conn.socket.close rescue nil # rubocop:disable Style/RescueModifier
      conn.reader.join(2)
    end

    def messages_of(conn) = @lock.synchronize { conn.rows.dup }
  end
end
