# frozen_string_literal: true

# The demo's ActionCable page (GET /cable.html), loaded by config.ru when
# ActionCable is installed (bin/setup installs it): `adapter: pgbus_hub` on
# the demo's database, so the same hub LISTEN connection serves the SSE
# streams and ActionCable. A broadcast of 8000 bytes or more goes through
# pgbus_hub_large_payloads.
require "logger"
require "active_support/all" # what a Rails app has loaded before ActionCable
require "action_cable"

class RoomChannel < ActionCable::Channel::Base
  def subscribed = stream_from("demo:#{params.fetch(:room)}")
end

ActionCable.server.config.tap do |config|
  config.cable = ActiveSupport::HashWithIndifferentAccess.new(adapter: "pgbus_hub", url: DATABASE_URL)
  config.logger = Logger.new($stdout, level: Logger::WARN)
  config.disable_request_forgery_protection = true # a local demo; a real app lists allowed_request_origins
end

module DemoCable
  PAGE = File.read(File.join(__dir__, "cable.html"))
  # Rails' browser client, as Debian's ruby-actioncable ships it.
  CLIENT = Dir["/usr/share/nodejs/@rails/actioncable/app/assets/javascripts/action_cable.js",
               "#{Gem.loaded_specs['actioncable']&.full_gem_path}/app/assets/javascripts/action_cable.js"].first
  # A page's broadcast: up to 1 MB (ActionCable frames it as one WebSocket message).
  MAX_BROADCAST_BYTES = 1 << 20

  def self.call(env)
    case [env["REQUEST_METHOD"], env["PATH_INFO"]]
    in ["GET", "/cable"] then ActionCable.server.call(env)
    in ["GET", "/cable.html"] then [200, { "content-type" => "text/html; charset=utf-8" }, [PAGE]]
    in ["GET", "/action_cable.js"] if CLIENT then [200, { "content-type" => "text/javascript" }, [File.read(CLIENT)]]
    in ["POST", %r{\A/cable/broadcast/\w+\z}]
      broadcast(env["PATH_INFO"].split("/").last, env["rack.input"].read(MAX_BROADCAST_BYTES).to_s)
    else nil
    end
  end

  def self.broadcast(room, text)
    ActionCable.server.broadcast("demo:#{room}", { pid: Process.pid, bytes: text.bytesize, text: text })
    [200, { "content-type" => "application/json" }, [JSON.generate(pid: Process.pid, bytes: text.bytesize)]]
  end
end
