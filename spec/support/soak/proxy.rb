# frozen_string_literal: true

require "socket"

module Soak
  # A TCP proxy on 127.0.0.1 in front of a PostgreSQL cluster (the app connects
  # through it from the start). `black_hole!` stops forwarding both ways with
  # every socket left open (a firewall or NAT entry gone, no RST); `restore!`
  # forwards again what was buffered meanwhile (the path is back). Threads:
  # one acceptor, two per connection; `close` ends them all.
  class Proxy
    attr_reader :connections

    def initialize(target_host, target_port)
      @target = [target_host, target_port]
      @server = TCPServer.new("127.0.0.1", 0)
      @lock = Mutex.new
      @open = ConditionVariable.new
      @holed = false
      @sockets = []
      @connections = 0
      @threads = [Thread.new { accept_loop }]
    end

    def port = @server.addr[1]

    def black_hole! = @lock.synchronize { @holed = true }

    def restore!
      @lock.synchronize do
        @holed = false
        @open.broadcast
      end
    end

    def close
      restore!
      @server.close rescue nil # rubocop:disable Style/RescueModifier
      @lock.synchronize { @sockets.dup }.each { |s| s.close rescue nil } # rubocop:disable Style/RescueModifier
      @threads.each { |t| t.join(2) || t.kill }
    end

    private

    def accept_loop
      loop do
        client = @server.accept
        begin
          upstream = Socket.tcp(*@target, connect_timeout: 2)
        rescue SystemCallError, IOError
          client.close # the cluster is down: the app sees a refused/closed connection, as without the proxy
          next
        end
        pair = [client, upstream]
        @lock.synchronize do
          @sockets.concat(pair)
          @connections += 1
          @threads.reject!(&:stop?) if @threads.size > 256 # finished pipe threads (bounded list)
        end
        @threads << Thread.new { pipe(client, upstream) } << Thread.new { pipe(upstream, client) }
      end
    rescue IOError, SystemCallError
      nil # closed
    end

    def pipe(from, to)
      loop do
        data = from.readpartial(65_536)
        @lock.synchronize { @open.wait(@lock) while @holed } # held: nothing forwarded, nothing closed
        to.write(data)
      end
    rescue IOError, SystemCallError
      @lock.synchronize { @open.wait(@lock) while @holed } # a close crosses the hole only once it is gone
      [from, to].each { |s| s.close rescue nil } # rubocop:disable Style/RescueModifier
      @lock.synchronize { @sockets.delete(from) && @sockets.delete(to) }
    end
  end
end
