# frozen_string_literal: true

# Opt-in (SOAK_PGBUS_SSE=1: `rake stops` with PGBUS_HUB_REAL_PGBUS_LIBS, spec/support/stops/pgbus_sse.rb):
# real pgbus's SSE streams in the soak's app, as an app with the pgbus gem serves them. pgbus is
# required before pgbus-hub (a Gemfile listing pgbus first); its pgmq schema is the harness's
# (pgmq_schema_mode :embedded, installed in this database before boot).
require "pgbus"

Pgbus.configure do |c|
  c.database_url = ENV.fetch("DATABASE_URL")
  c.pgmq_schema_mode = :embedded
  c.streams_signed_name_secret = ENV.fetch("SOAK_PGBUS_SECRET")
  c.logger = Logger.new($stdout, level: Logger::WARN)
end

# pgbus's StreamApp at /pgbus/streams. Its authorize hook runs in the worker that serves the
# stream, before the hijack: it records that worker's pid as STATE_DIR/sse-KEY for the client's
# ?session=KEY (the harness reads it once pgbus's `pgbus:connected` event arrives).
module SoakPgbusSse
  def self.app
    state_dir = ENV.fetch("PGBUS_E2E_STATE_DIR")
    Pgbus::Web::StreamApp.new(authorize: lambda do |env, _stream|
      key = Rack::Utils.parse_query(env["QUERY_STRING"])["session"].to_s
      File.write(File.join(state_dir, "sse-#{key}"), ::Process.pid.to_s) if key.match?(/\A[\w-]+\z/)
      true
    end)
  end
end
