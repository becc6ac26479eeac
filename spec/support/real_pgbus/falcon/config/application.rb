# frozen_string_literal: true

# The Rails app of spec/real_pgbus_falcon_spec.rb (tests only): real pgbus
# streams (SSE) with pgbus-hub added, as a Gemfile with both gems loads them.
require "logger"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "pgbus"
require "pgbus/hub"

module FalconStreams
  class Application < Rails::Application
    config.load_defaults 7.2
    config.eager_load = false
    config.secret_key_base = "x" * 64
    config.logger = Logger.new($stdout, level: Logger::WARN)
    config.hosts.clear
  end
end

Pgbus.configure do |c|
  c.database_url = ENV.fetch("DATABASE_URL")
  c.pgmq_schema_mode = :embedded
  c.streams_signed_name_secret = "real-pgbus-falcon-spec"
  c.streams_listen_scope = :master
  c.logger = Logger.new($stdout, level: Logger::INFO)
end
Rails.application.initialize!
