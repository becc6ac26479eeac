# frozen_string_literal: true

require "socket"
require "tmpdir"

module Pgbus
  module Hub
    DEFAULT_SOCKET_ENV = "PGBUS_STREAMS_HUB_SOCKET"

    # Hub sockets at the default path (Dir.tmpdir/pgbus-streams-hub-<master pid>.sock),
    # for an operator's shell, where PGBUS_STREAMS_HUB_SOCKET (set inside Puma) is unset.
    def self.default_sockets(dir = Dir.tmpdir)
      Dir.glob(default_socket_pattern(dir)).select { |path| File.socket?(path) }.sort
    end

    def self.default_socket_pattern(dir = Dir.tmpdir)
      File.join(dir, socket_name("*"))
    end

    # pgbus's hub socket name (its MasterHubBoot's): one per Puma master pid.
    def self.socket_name(pid)
      "pgbus-streams-hub-#{pid}.sock"
    end

    # Asks a running master hub for its counters over its socket (our
    # `{"t":"stats"}` extension frame). Returns a Hash with Symbol keys.
    # Raises HubUnavailableError when nothing serves the socket, or when the
    # hub there does not answer stats (e.g. pgbus's own Ruby hub).
    def self.stats(socket_path: ENV.fetch(DEFAULT_SOCKET_ENV, nil), timeout: 2.0)
      raise HubUnavailableError, "no hub socket given (set #{DEFAULT_SOCKET_ENV} or pass socket_path:)" if socket_path.to_s.empty?

      socket = begin
        UNIXSocket.new(socket_path)
      rescue SystemCallError, ArgumentError => e
        raise HubUnavailableError, "cannot reach master hub at #{socket_path}: #{e.message}"
      end
      begin
        socket.write(Protocol.encode({ "t" => "stats" }))
        deadline = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) + timeout
        loop do
          remaining = deadline - ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
          unless remaining.positive? && socket.wait_readable(remaining)
            raise HubUnavailableError, "the hub at #{socket_path} did not answer a stats request within #{timeout}s " \
                                       "(not a pgbus-hub MasterHub?)"
          end
          frame = Protocol.read_frame(socket)
          raise Errno::ECONNRESET if frame.nil?
          return frame["stats"].transform_keys(&:to_sym) if frame["t"] == "stats" && frame["stats"].is_a?(Hash)
        end
      rescue Errno::EPIPE, Errno::ECONNRESET
        raise HubUnavailableError, "the hub at #{socket_path} closed the connection without answering " \
                                   "(it refuses peers of another uid: run this as the user that runs Puma)"
      ensure
        socket.close
      end
    end
  end
end
