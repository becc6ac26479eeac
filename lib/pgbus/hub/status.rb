# frozen_string_literal: true

require "socket"

module Pgbus
  module Hub
    DEFAULT_SOCKET_ENV = "PGBUS_STREAMS_HUB_SOCKET"

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
        deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
        loop do
          remaining = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
          unless remaining.positive? && socket.wait_readable(remaining)
            raise HubUnavailableError, "the hub at #{socket_path} did not answer a stats request within #{timeout}s " \
                                       "(not a pgbus-hub MasterHub?)"
          end
          frame = Protocol.read_frame(socket)
          raise HubUnavailableError, "the hub at #{socket_path} closed the connection" if frame.nil?
          return frame["stats"].transform_keys(&:to_sym) if frame["t"] == "stats" && frame["stats"].is_a?(Hash)
        end
      ensure
        socket.close
      end
    end
  end
end
