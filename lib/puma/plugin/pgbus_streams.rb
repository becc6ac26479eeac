# frozen_string_literal: true

# pgbus-hub's `plugin :pgbus_streams`. pgbus ships a file with the same path;
# whichever comes first on $LOAD_PATH is the one Puma requires. When this one
# wins it loads pgbus's file too (registering pgbus's plugin class first) and
# runs it from ours, so pgbus's teardown (and, #382, its MasterHubBoot — backed
# by our native hub) still run; exactly one native hub serves the host.
# When pgbus's file wins, see Pgbus::Hub::PgbusIntegration (MasterHubSwap for
# #382, the preload-time auto boot for pre-#382).
require "puma/plugin"
require "pgbus/hub"

pgbus_plugin_class = Pgbus::Hub::PumaPlugin.load_pgbus_plugin(__FILE__)

Puma::Plugin.create do
  include Pgbus::Hub::PumaPlugin
  self.composed_class = pgbus_plugin_class
end
