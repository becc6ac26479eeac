# frozen_string_literal: true

module Pgbus
  # STAND-IN: only pgbus's "Connection budget" check, 0.13.1 wording.
  class Doctor
    Check = Struct.new(:name, :status, :detail, keyword_init: true)

    def initialize(config: Pgbus.configuration)
      @config = config
    end

    def checks
      [connection_budget]
    end

    private

    def connection_budget
      detail = "1 direct LISTEN connection(s) pinned (scope=#{@config.worker_notify_scope}; capsules share it)"
      detail += streams_budget_clause if @config.streams_enabled
      Check.new(name: "Connection budget", status: :ok, detail: detail)
    rescue StandardError => e
      Check.new(name: "Connection budget", status: :warn, detail: "#{e.class}: #{e.message}")
    end

    def streams_budget_clause
      return " + 1 per web-server process (streams)" unless @config.streams_listen_scope == :master

      " + 1 per web host (streams master hub; per-worker fallback during a hub outage costs 1 per web process)"
    end
  end
end
