# frozen_string_literal: true

module Pgbus
  # STAND-IN: pgbus's DedicatedConnection (census tag application_name=pgbus-listen).
  module DedicatedConnection
    APP_NAME = "pgbus-listen"

    module_function

    def connect(options)
      case options
      when String
        PG.connect(tag(options))
      when Hash
        opts = options.transform_keys(&:to_sym)
        variables = opts.delete(:variables) || {}
        opts[:fallback_application_name] = APP_NAME unless opts.key?(:application_name) || opts.key?(:fallback_application_name)
        PG.connect(**opts).tap do |conn|
          variables.each { |name, value| conn.exec("SET #{name} = #{conn.escape_literal(value.to_s)}") }
        end
      when Proc
        raise ConfigurationError, "Streamer cannot use a Proc-based connection_options (a shared connection)"
      else
        raise ConfigurationError, "unsupported connection options: #{options.class}"
      end
    end

    def tag(url)
      return url if url.include?("application_name")
      return "#{url}#{url.include?('?') ? '&' : '?'}fallback_application_name=#{APP_NAME}" if url.include?("://")

      "#{url} fallback_application_name=#{APP_NAME}"
    end
  end
end
