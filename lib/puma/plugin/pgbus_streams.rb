# frozen_string_literal: true

# `plugin :pgbus_streams`, pgbus's plugin name: whichever file Puma finds first serves.
require "puma/plugin"
require "pgbus/hub"

Puma::Plugin.create { include Pgbus::Hub::PumaPlugin }
