# frozen_string_literal: true

require "json"
require "socket"
require "websocket/driver"

# A real ActionCable WebSocket client (websocket-driver over a TCPSocket):
# subscribes to RoomChannel rooms and records every message with its arrival
# time (CLOCK_REALTIME: the broadcaster stamps sent_at on the same host).
class CableClient
  attr_reader :url, :pid, :closed_at

  def initialize(port, connect_timeout: nil)
    @url = "ws://127.0.0.1:#{port}/cable"
    @socket = Socket.tcp("127.0.0.1", port, connect_timeout: connect_timeout)
    @lock = Mutex.new
    @messages = []
    @confirmed = {} # identifier => when (CLOCK_REALTIME)
    @driver = WebSocket::Driver.client(self)
    @driver.on(:message) { |event| receive(JSON.parse(event.data)) }
    @driver.start
    @reader = Thread.new do
      loop { @driver.parse(@socket.readpartial(1 << 16)) }
    rescue IOError, SystemCallError
      nil # closed
    ensure
      @closed_at = Process.clock_gettime(Process::CLOCK_REALTIME)
    end
  end

  # websocket-driver's socket interface.
  def write(data)
    @socket.write(data)
  end

  def subscribe(room)
    @driver.text(JSON.generate(command: "subscribe", identifier: identifier(room)))
  end

  def confirmed?(room) = @lock.synchronize { @confirmed.key?(identifier(room)) }

  # When the server confirmed the subscription to room (CLOCK_REALTIME), nil before.
  def confirmed_at(room) = @lock.synchronize { @confirmed[identifier(room)] }

  # The connection ended (either side): closed_at says when.
  def closed? = !@reader.alive?

  # [[room, message, received_at], ...]
  def messages = @lock.synchronize { @messages.dup }

  def close
    @socket.close
    @reader.join(5)
  end

  private

  def identifier(room) = JSON.generate(channel: "RoomChannel", room: room)

  def receive(frame)
    at = Process.clock_gettime(Process::CLOCK_REALTIME)
    @lock.synchronize do
      case frame["type"]
      when "confirm_subscription" then @confirmed[frame["identifier"]] = at
      when nil
        message = frame["message"]
        next @pid = message["pid"] if message.is_a?(Hash) && message.keys == ["pid"]

        @messages << [JSON.parse(frame["identifier"])["room"], message, at]
      end
    end
  end
end
