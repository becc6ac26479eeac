# frozen_string_literal: true

# The soak's app (spec/support/soak, `rake soak`): a Rails 7.2 app served by a
# 4-worker Puma (spec/support/puma_apps/config.rb: preload_app!, plugin :pgbus_hub),
# on a private cluster reached through Soak::Proxy (DATABASE_URL).
#   /cable              ActionCable (config/cable.yml: adapter pgbus_hub, or Rails'
#                       postgresql for the control run); RoomChannel streams params[:room]
#   GET /stream?ch=NAME a streaming HTTP response (hijacked): "ready PID RESULT\n" once
#                       LISTEN NAME runs (Pgbus::Hub.listener: the hub, or the worker's own
#                       connection after a fail-over), then every NOTIFY payload on NAME, a line each
require_relative "config/application"

Rails.application.initialize!
run Rails.application
