# frozen_string_literal: true

require_relative "hub/version"
require_relative "hub/native_path"
# The native extension (ext/pgbus_hub): Protocol, the errors, DEFAULTS and the native classes.
begin
  require File.exist?(Pgbus::Hub::NATIVE_DEV_PATH) ? Pgbus::Hub::NATIVE_DEV_PATH : "pgbus_hub"
rescue LoadError
  built = Dir[File.expand_path("../pgbus_hub/*/pgbus_hub.*", __dir__)].map { |path| File.basename(File.dirname(path)) }
  raise if built.empty? # the source gem's extension: the original error says why

  raise LoadError, "pgbus-hub has no native extension for Ruby #{RUBY_VERSION[/\A\d+\.\d+/]} here (built for " \
                   "#{built.sort.join(', ')}): install the source gem (gem install pgbus-hub --platform ruby), " \
                   "or run rake compile in a checkout"
end
require_relative "hub/configuration"
require_relative "hub/boot"
require_relative "hub/puma_plugin"
require_relative "hub/pgbus_surface"
require_relative "hub/pgbus_hub_client"
require_relative "hub/pgbus_adapter"
