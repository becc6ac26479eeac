# frozen_string_literal: true

require "socket"
require "tmpdir"

module Pgbus
  module Hub
    # Hub sockets at the default location (Dir.tmpdir/pgbus-streams-hub-*.sock)
    # left by a hub that died without unlinking (kill -9). A hub starting
    # there (`pgbus-hub serve`, a Puma master's) removes them; `pgbus-hub
    # status` skips and names them.
    module StaleSockets
      def self.default_glob = File.join(Dir.tmpdir, Hub.socket_name("*"))

      def self.list(glob = default_glob)
        Dir.glob(glob).select { |path| File.socket?(path) && stale?(path) }.sort
      end

      # Unlinks each (one that vanished meanwhile is skipped), logging it.
      def self.remove(logger)
        list.each do |path|
          File.unlink(path)
          logger&.info("[pgbus-hub] removed a stale hub socket: #{path}")
        rescue Errno::ENOENT
          next
        end
      end

      # A socket named for a master pid is stale once that process is gone
      # (its forked workers may still hold the listening fd, so a connect
      # could succeed); serve's own name, once nothing answers on it. Live
      # hubs are never connected to, so none sees a stray connection.
      def self.stale?(path)
        pid = File.basename(path)[/\Apgbus-streams-hub-(\d+)\.sock\z/, 1]
        return !answers?(path) unless pid

        ::Process.kill(0, Integer(pid))
        false
      rescue Errno::ESRCH
        true
      rescue Errno::EPERM # alive, someone else's
        false
      end

      def self.answers?(path)
        UNIXSocket.new(path).close
        true
      rescue Errno::ECONNREFUSED, Errno::ENOENT
        false
      end
    end
  end
end
