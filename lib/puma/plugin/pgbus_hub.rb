# frozen_string_literal: true

# `plugin :pgbus_hub` (or :pgbus_streams): lib/pgbus/hub/boot.rb (PumaPlugin).
require "puma/plugin"
require "pgbus/hub"

Puma::Plugin.create { include Pgbus::Hub::PumaPlugin }
