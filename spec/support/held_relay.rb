# frozen_string_literal: true

require "socket"
require_relative "database"

# A relay in front of the test server: it accepts one client, holds it (for
# `hold` seconds, or until `release`), then pipes it to the server both ways.
# A connection through it comes up late, as a slow first connection does.
#
# It ends both sides when either ends, and shuts its sockets down before it
# closes them: a socket closed while another thread is blocked reading it
# (IO#close under IO.copy_stream) stays connected with no descriptor, so no
# process owns it and its backend lives until this process exits (the census
# 2 CI once saw in later examples). `close` fails if the relay's backend
# outlives it.
class HeldRelay
  def initialize(hold: nil)
    @server = TCPServer.new("127.0.0.1", 0)
    @sockets = []
    @released = Queue.new
    @thread = Thread.new { run(hold) }
  end

  def port = @server.addr[1]

  # Lets the held client through (the relay then connects to the server).
  def release = @released << true

  def close
    end_both # wakes the relay's reads: they end, and the relay with them
    @thread.join(5) || @thread.kill.join # still accepting or holding: nothing to wake
    database_port = @sockets[1]&.local_address&.ip_port
    @sockets.each(&:close)
    @server.close
    return unless database_port

    wait_for("the relay's backend (client port #{database_port}) gone", timeout: 5) do
      TestDatabase.with do |conn|
        conn.exec_params("select count(*) from pg_stat_activity where client_port = $1", [database_port])
            .getvalue(0, 0).to_i.zero?
      end
    end
  end

  private

  def run(hold)
    @sockets << (client = @server.accept)
    hold ? sleep(hold) : @released.pop
    @sockets << (database = TestDatabase.server_socket)
    [[client, database], [database, client]].map do |from, to|
      Thread.new do
        IO.copy_stream(from, to)
      rescue IOError, SystemCallError
        nil
      ensure
        end_both
      end
    end.each(&:join)
  end

  def end_both
    @sockets.each { |socket| socket.shutdown rescue nil } # rubocop:disable Style/RescueModifier
  end
end
