# frozen_string_literal: true

module Pgbus
  # STAND-IN: the streams part of pgbus's Configuration before #382.
  class Configuration
    attr_accessor :streams_enabled, :database_url, :streams_database_url, :queue_prefix, :worker_notify_scope
    attr_reader :streams_listen_health_check_ms

    def initialize
      @streams_enabled = false
      @database_url = nil
      @streams_database_url = nil
      @queue_prefix = "pgbus"
      @worker_notify_scope = :supervisor
      @streams_listen_health_check_ms = 250
    end

    def streams_listen_health_check_ms=(value)
      raise ConfigurationError, "streams_listen_health_check_ms must be a positive Integer" unless
        value.is_a?(Integer) && value.positive?

      @streams_listen_health_check_ms = value
    end

    def connection_options
      database_url
    end

    def streams_connection_options
      # A Proc (a shared ActiveRecord connection) is returned as it is, as pgbus does: its streamer
      # refuses it where it connects (DedicatedConnection here).
      streams_database_url || connection_options
    end

    def queue_name(stream)
      "#{queue_prefix}_#{stream}"
    end
  end
end
