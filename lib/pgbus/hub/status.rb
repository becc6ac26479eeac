# frozen_string_literal: true

require "tmpdir"

module Pgbus
  module Hub
    # DEFAULT_SOCKET_ENV, socket_name(pid) (pgbus's) and request_stats come from the Rust core.
    class << self
      def default_socket_pattern(dir = Dir.tmpdir) = File.join(dir, socket_name("*"))

      # Hub sockets at the default path, for an operator's shell (where the variable is unset).
      def default_sockets(dir = Dir.tmpdir) = Dir.glob(default_socket_pattern(dir)).select { |path| File.socket?(path) }.sort

      # A running hub's counters (our {"t":"stats"} frame), Symbol keys. Raises
      # HubUnavailableError when nothing there answers stats (pgbus's Ruby hub does not).
      def stats(socket_path: ENV.fetch(DEFAULT_SOCKET_ENV, nil), timeout: 2.0)
        raise HubUnavailableError, "no hub socket given (set #{DEFAULT_SOCKET_ENV} or pass socket_path:)" if socket_path.to_s.empty?

        request_stats(socket_path.to_s, Float(timeout))
      end
    end
  end
end
