# frozen_string_literal: true

require "socket"

# Clients of pgbus's SSE endpoint (real pgbus's StreamApp): raw HTTP/1.1
# connections, each `?client=K`, each read on a thread of its own; records the
# `<p>message</p>` payloads every client received.
class SseClients
  def initialize(port, token, count)
    @count = count
    @lock = Mutex.new
    @received = Hash.new { |h, k| h[k] = [] }
    @sockets = Array.new(count) { TCPSocket.new("127.0.0.1", port) }
    @threads = @sockets.each_with_index.map do |socket, k|
      socket.write("GET /pgbus/streams/#{token}?client=#{k} HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\n\r\n")
      Thread.new { read(socket, k) }
    end
  end

  # The clients that have not received `message`.
  def missing(message) = @lock.synchronize { (0...@count).reject { |k| @received[k].include?(message) } }

  def close
    @sockets.each(&:close)
    @threads.each(&:join)
  end

  private

  def read(socket, client)
    while (line = socket.gets)
      message = line[%r{\Adata: <p>(.*)</p>}, 1]
      @lock.synchronize { @received[client] << message } if message
    end
  rescue IOError, SystemCallError
    nil # closed
  end
end
