# frozen_string_literal: true

require "socket"

module Soak
  # A TCP proxy on 127.0.0.1 in front of a PostgreSQL cluster (the app connects
  # through it from the start). `black_hole!` is a path that drops every packet
  # (a paused database VM, a firewall or NAT fault; no RST): nothing is
  # forwarded either way, every socket is left open, and no new connection
  # reaches the server (one made meanwhile waits in the listen backlog, its
  # bytes unanswered); `restore!` forwards again what was buffered meanwhile,
  # and connects what waited (the path is back). `black_hole!(existing_only:
  # true)` holds only the connections open now (a NAT entry lost: new ones
  # pass). Threads: one acceptor, two per connection; `close` ends them all.
  class Proxy
    attr_reader :connections

    def initialize(target_host, target_port)
      @target = [target_host, target_port]
      @server = TCPServer.new("127.0.0.1", 0)
      @lock = Mutex.new
      @open = ConditionVariable.new
      @holed = false
      @held = [] # the sockets of an existing_only hole
      @sockets = []
      @connections = 0
      @threads = [Thread.new { accept_loop }]
    end

    def port = @server.addr[1]

    def black_hole!(existing_only: false)
      @lock.synchronize { existing_only ? @held = @sockets.dup : @holed = true }
    end

    def restore!
      @lock.synchronize do
        @holed = false
        @held = []
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
        pass_hole # nothing reaches the server through a hole: not even a connect
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

    # Returns once no hole holds `socket` (nil: a connect).
    def pass_hole(socket = nil) = @lock.synchronize { @open.wait(@lock) while @holed || @held.include?(socket) }

    def pipe(from, to)
      loop do
        data = from.readpartial(65_536)
        pass_hole(from) # held: nothing forwarded, nothing closed
        to.write(data)
      end
    rescue IOError, SystemCallError
      pass_hole(from) # a close crosses the hole only once it is gone
      [from, to].each { |s| s.close rescue nil } # rubocop:disable Style/RescueModifier
      @lock.synchronize { @sockets.delete(from) && @sockets.delete(to) }
    end
  end
end
