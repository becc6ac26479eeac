# frozen_string_literal: true

require "json"
require "socket"
require "websocket/driver"

# A real ActionCable WebSocket client (websocket-driver over a TCPSocket):
# subscribes to RoomChannel rooms and records every message with its arrival
# time (CLOCK_REALTIME: the broadcaster stamps sent_at on the same host).
class CableClient
  attr_reader :url, :pid

  def initialize(port)
    @url = "ws://127.0.0.1:#{port}/cable"
    @socket = TCPSocket.new("127.0.0.1", port)
    @lock = Mutex.new
    @messages = []
    @confirmed = []
    @driver = WebSocket::Driver.client(self)
    @driver.on(:message) { |event| receive(JSON.parse(event.data)) }
    @driver.start
    @reader = Thread.new do
      loop { @driver.parse(@socket.readpartial(1 << 16)) }
    rescue IOError, SystemCallError
      nil # closed
    end
  end

  # websocket-driver's socket interface.
  def write(data)
    @socket.write(data)
  end

  def subscribe(room)
    @driver.text(JSON.generate(command: "subscribe", identifier: identifier(room)))
  end

  def confirmed?(room) = @lock.synchronize { @confirmed.include?(identifier(room)) }

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
      when "confirm_subscription" then @confirmed << frame["identifier"]
      when nil
        message = frame["message"]
        next @pid = message["pid"] if message.is_a?(Hash) && message.keys == ["pid"]

        @messages << [JSON.parse(frame["identifier"])["room"], message, at]
      end
    end
  end
end
