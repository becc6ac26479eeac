# frozen_string_literal: true

module Pgbus
  # STAND-IN: the streams part of pgbus 0.13.1's Configuration.
  class Configuration
    attr_accessor :streams_enabled, :database_url, :streams_database_url, :queue_prefix, :worker_notify_scope
    attr_reader :streams_listen_health_check_ms, :streams_listen_scope

    VALID_STREAMS_LISTEN_SCOPES = %i[master process].freeze
    SCOPE_HINT = "Must be :master (one shared LISTEN connection per web host) or :process (one per worker)"

    def initialize
      @streams_enabled = false
      @database_url = nil
      @streams_database_url = nil
      @queue_prefix = "pgbus"
      @worker_notify_scope = :supervisor
      @streams_listen_health_check_ms = 250
      @streams_listen_scope = :master
    end

    def streams_listen_scope=(scope)
      unless scope.is_a?(Symbol) || scope.is_a?(String)
        raise ConfigurationError, "Invalid streams_listen_scope type: #{scope.class}. #{SCOPE_HINT}"
      end

      value = scope.to_sym
      raise ConfigurationError, "Invalid streams_listen_scope: #{value.inspect}. #{SCOPE_HINT}" unless
        VALID_STREAMS_LISTEN_SCOPES.include?(value)

      @streams_listen_scope = value
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
