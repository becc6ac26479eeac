# frozen_string_literal: true

# ActionCable e2e app (tests only), served by spec/support/puma_apps/config.rb:
# ActionCable.server at /cable with one channel, RoomChannel (streams
# params[:room], then tells the client its worker pid); GET /broadcast?room=R&bytes=N&seq=S
# broadcasts {seq, pid, sent_at, body: N bytes} through the adapter
# $PGBUS_E2E_CABLE_ADAPTER (pgbus_hub or Rails' postgresql) on the run's database.
require "json"
require "logger"
require "pg"
require "active_record"
require "action_cable"

conninfo = PG::Connection.conninfo_parse(ENV.fetch("PGBUS_E2E_DATABASE_URL")).to_h { |o| [o[:keyword], o[:val]] }
ActiveRecord::Base.establish_connection(adapter: "postgresql", host: conninfo["host"], port: conninfo["port"],
                                        database: conninfo["dbname"], username: conninfo["user"],
                                        password: conninfo["password"])

class RoomChannel < ActionCable::Channel::Base
  def subscribed
    stream_from params.fetch(:room)
    transmit({ "pid" => Process.pid })
  end
end

config = ActionCable.server.config
# What Rails' engine does with config/cable.yml: an indifferent Hash.
config.cable = ActiveSupport::HashWithIndifferentAccess.new(
  adapter: ENV.fetch("PGBUS_E2E_CABLE_ADAPTER", "pgbus_hub"), channel_prefix: ENV.fetch("PGBUS_E2E_CABLE_PREFIX", nil)
)
config.logger = Logger.new($stdout, level: Logger::INFO)
config.disable_request_forgery_protection = true # the test client sends no Origin
config.connection_class = -> { ActionCable::Connection::Base }

run lambda { |env|
  request = Rack::Request.new(env)
  case request.path
  when "/cable"
    ActionCable.server.call(env)
  when "/broadcast"
    room = request.params.fetch("room")
    ActionCable.server.broadcast(room, { "seq" => Integer(request.params.fetch("seq", "0")), "pid" => Process.pid,
                                         "body" => "x" * Integer(request.params.fetch("bytes", "0")) })
    [200, { "content-type" => "application/json" }, [JSON.generate(pid: Process.pid)]]
  else
    [200, { "content-type" => "application/json" }, [JSON.generate(pid: Process.pid)]]
  end
}
