# frozen_string_literal: true

# `plugin :pgbus_hub`: the unambiguous name for pgbus-hub's Puma plugin (same
# behaviour as our pgbus_streams.rb, whichever pgbus_streams.rb won the
# $LOAD_PATH; listing both plugins still runs one hub).
require "puma/plugin"
require "pgbus/hub"

pgbus_plugin_class = Pgbus::Hub::PumaPlugin.load_pgbus_plugin(__FILE__)

Puma::Plugin.create do
  include Pgbus::Hub::PumaPlugin
  self.composed_class = pgbus_plugin_class
end
