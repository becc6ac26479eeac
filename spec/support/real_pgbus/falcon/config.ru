# frozen_string_literal: true

require_relative "config/application"

state_dir = ENV.fetch("PGBUS_E2E_STATE_DIR")
# The authorize hook runs in the process serving the stream: which client (?client=K) it serves.
record_client = lambda do |env, _name|
  client = Rack::Utils.parse_query(env["QUERY_STRING"])["client"]
  File.open(File.join(state_dir, "clients-#{Process.pid}.log"), "a") { |f| f.syswrite("#{client}\n") }
  true
end
params = ->(env) { Rack::Utils.parse_query(env["QUERY_STRING"]) }
map("/pgbus/streams") { run Pgbus::Web::StreamApp.new(authorize: record_client) }
map("/token") { run ->(env) { [200, {}, [Pgbus::Streams::SignedName.sign(params.(env).fetch("s"))]] } }
map("/broadcast") do
  run lambda { |env|
    Pgbus.stream(params.(env).fetch("s")).broadcast("<p>#{params.(env).fetch('m')}</p>")
    [200, {}, [Process.pid.to_s]]
  }
end
map("/pid") { run ->(_env) { [200, {}, [Process.pid.to_s]] } }
