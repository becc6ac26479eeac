# frozen_string_literal: true

require "socket"
require "tmpdir"

module Pgbus
  module Hub
    # DEFAULT_SOCKET_ENV and socket_name(pid), pgbus's, come from the Rust core.
    class << self
      def default_socket_pattern(dir = Dir.tmpdir) = File.join(dir, socket_name("*"))

      # Hub sockets at the default path, for an operator's shell (where the variable is unset).
      def default_sockets(dir = Dir.tmpdir) = Dir.glob(default_socket_pattern(dir)).select { |path| File.socket?(path) }.sort

      # A running hub's counters (our {"t":"stats"} frame), Symbol keys. Raises
      # HubUnavailableError when nothing there answers stats (pgbus's Ruby hub does not).
      def stats(socket_path: ENV.fetch(DEFAULT_SOCKET_ENV, nil), timeout: 2.0)
        raise HubUnavailableError, "no hub socket given (set #{DEFAULT_SOCKET_ENV} or pass socket_path:)" if socket_path.to_s.empty?

        UNIXSocket.open(socket_path) do |socket|
          socket.write(Protocol.encode({ "t" => "stats" }))
          deadline = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) + timeout
          loop do
            remaining = deadline - ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
            unless remaining.positive? && socket.wait_readable(remaining)
              raise HubUnavailableError, "the hub at #{socket_path} did not answer a stats request within #{timeout}s " \
                                         "(not a pgbus-hub MasterHub?)"
            end
            frame = Protocol.read_frame(socket) or raise Errno::ECONNRESET
            return frame["stats"].transform_keys(&:to_sym) if frame["t"] == "stats" && frame["stats"].is_a?(Hash)
          end
        end
      rescue Errno::EPIPE, Errno::ECONNRESET
        raise HubUnavailableError, "the hub at #{socket_path} closed the connection without answering " \
                                   "(it refuses peers of another uid: run this as the user that runs Puma)"
      rescue SystemCallError, ArgumentError => e
        raise HubUnavailableError, "cannot reach master hub at #{socket_path}: #{e.message}"
      end
    end
  end
end
