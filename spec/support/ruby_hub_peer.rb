# frozen_string_literal: true

require "json"
require "socket"
require "timeout"

# Wire-compatibility peer written from the protocol description only (not
# pgbus's code and not our extension): framing with pack("N") + JSON.
module RubyWire
  module_function

  def write(io, message)
    body = JSON.generate(message).b
    io.write([body.bytesize].pack("N") + body)
  end

  def read(io)
    header = io.read(4)
    return nil unless header && header.bytesize == 4

    body = io.read(header.unpack1("N"))
    body && JSON.parse(body.force_encoding(Encoding::UTF_8))
  rescue Errno::ECONNRESET
    nil
  end
end

# A minimal pure-Ruby hub loop: acks every sub (unless ack: false), can push
# wakes to every connected peer, records what it received.
class RubyHubStub
  attr_reader :received

  def initialize(path, ack: true)
    @server = UNIXServer.new(path)
    @ack = ack
    @clients = Queue.new
    @received = Queue.new
    @accept = Thread.new do
      loop do
        client = @server.accept
        @clients << client
        RubyWire.write(client, { "t" => "status", "healthy" => true })
        Thread.new(client) { |c| serve(c) }
      end
    rescue IOError, Errno::EBADF
      nil
    end
  end

  def serve(client)
    while (frame = RubyWire.read(client))
      @received << frame
      RubyWire.write(client, { "t" => "ack", "q" => frame["q"] }) if @ack && frame["t"] == "sub"
    end
  rescue IOError, Errno::EBADF, Errno::EPIPE
    nil
  end

  def client
    @client ||= Timeout.timeout(5) { @clients.pop }
  end

  def wake(queue, payload = nil)
    RubyWire.write(client, { "t" => "wake", "q" => queue, "p" => payload })
  end

  def close
    @server.close
    @client&.close
    @accept.join(1)
  end
end
