# frozen_string_literal: true

# pgbus-hub's Puma plugin (`plugin :pgbus_hub`, or `plugin :pgbus_streams`,
# the name pgbus's own plugin has: whichever file Puma finds first serves).
require "puma/plugin"
require "pgbus/hub"

Puma::Plugin.create do
  include Pgbus::Hub::PumaPlugin
end
