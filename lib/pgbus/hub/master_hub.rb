# frozen_string_literal: true

module Pgbus
  module Hub
    # The native master hub (ext/pgbus_hub/src/master_hub.rs): one PostgreSQL
    # LISTEN connection, fanned out to workers over a Unix socket. This file
    # only owns the keywords, their defaults and the log thread.
    class MasterHub
      DEFAULTS = {
        connection: Options::REQUIRED,
        socket_path: Options::REQUIRED,
        **Hub::DEFAULTS.slice(:health_check_ms, :status_interval, :durable_queue_limit, :hard_queue_limit,
                              :channel_prefix, :channel_suffix),
        logger: nil
      }.freeze

      attr_reader :socket_path

      def initialize(**options)
        opts = Options.resolve("MasterHub", options, DEFAULTS)
        @socket_path = Options.string("MasterHub", :socket_path, opts[:socket_path])
        @logger = opts[:logger]
        @native_options = {
          connection: opts[:connection],
          socket_path: @socket_path,
          health_check_ms: Options.positive_integer("MasterHub", :health_check_ms, opts[:health_check_ms]),
          status_interval: Options.positive_number("MasterHub", :status_interval, opts[:status_interval]),
          durable_queue_limit: Options.positive_integer("MasterHub", :durable_queue_limit, opts[:durable_queue_limit]),
          hard_queue_limit: Options.positive_integer("MasterHub", :hard_queue_limit, opts[:hard_queue_limit]),
          channel_prefix: Options.string("MasterHub", :channel_prefix, opts[:channel_prefix]),
          channel_suffix: Options.string("MasterHub", :channel_suffix, opts[:channel_suffix])
        }.freeze
        @owner_pid = ::Process.pid
      end

      # Binds the socket and starts the hub's native thread. Raises
      # Pgbus::Hub::Error with the reason (path not a socket, too long, in use...).
      def start
        native_start(@native_options)
        @log_thread = LogDrain.start(@logger, "pgbus-hub log") { native_next_logs }
        self
      end

      # Idempotent. In a forked child it does nothing to the parent's hub.
      def stop
        return self unless ::Process.pid == @owner_pid

        native_stop
        @log_thread&.join(5)
        @log_thread = nil
        self
      end

      def stats
        native_stats
      end
    end
  end
end
