# frozen_string_literal: true

require_relative "hub/version"
# The native extension (ext/pgbus_hub): defines Pgbus::Hub::Protocol,
# Pgbus::Hub::Error, Pgbus::Hub::ProtocolError and the native classes
# that the files below give their Ruby keywords.
require "set"
require_relative "hub/native_path"
require File.exist?(Pgbus::Hub::NATIVE_DEV_PATH) ? Pgbus::Hub::NATIVE_DEV_PATH : "pgbus_hub"
require_relative "hub/options"
require_relative "hub/log_drain"
require_relative "hub/master_hub"
require_relative "hub/wake_message"
require_relative "hub/pump"
require_relative "hub/hub_client"
require_relative "hub/listener"
require_relative "hub/status"
require_relative "hub/failover_listener"
require_relative "hub/pgbus_integration"

module Pgbus
  # One PostgreSQL LISTEN connection per host, shared by Puma's workers.
  module Hub
  end
end
