# frozen_string_literal: true

require_relative "hub/version"
# The native extension (ext/pgbus_hub): defines Pgbus::Hub::Protocol,
# Pgbus::Hub::Error and Pgbus::Hub::ProtocolError.
require "pgbus_hub"

module Pgbus
  # One PostgreSQL LISTEN connection per host, shared by Puma's workers.
  module Hub
  end
end
