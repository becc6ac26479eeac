# frozen_string_literal: true

require_relative "hub/version"
require_relative "hub/native_path"
# The native extension (ext/pgbus_hub): Protocol, the errors, DEFAULTS and the native classes.
begin
  require File.exist?(Pgbus::Hub::NATIVE_DEV_PATH) ? Pgbus::Hub::NATIVE_DEV_PATH : "pgbus_hub"
rescue LoadError => e
  libraries = Dir[File.expand_path("../pgbus_hub/*/pgbus_hub.*", __dir__)]
  raise if libraries.empty? # the source gem's extension: the original error says why

  # A library for this Ruby that exists but does not load (another libc or CPU, a
  # macOS too old), or none for this Ruby: the loader's words, then why and what to do.
  raise LoadError, Pgbus::Hub::LoadFailure.message(e.message, minor: RUBY_VERSION[/\A\d+\.\d+/],
                                                               built: libraries.map { |path| File.basename(File.dirname(path)) })
end
require_relative "hub/events"
require_relative "hub/configuration"
require_relative "hub/boot"
require_relative "hub/pgbus_adapter"
