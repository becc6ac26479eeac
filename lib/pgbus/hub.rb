# frozen_string_literal: true

require_relative "hub/version"
require_relative "hub/native_path"
# The native extension (ext/pgbus_hub): Protocol, the errors, DEFAULTS and the native classes.
begin
  require File.exist?(Pgbus::Hub::NATIVE_DEV_PATH) ? Pgbus::Hub::NATIVE_DEV_PATH : "pgbus_hub"
rescue LoadError => e
  libraries = Dir[File.expand_path("../pgbus_hub/*/pgbus_hub.*", __dir__)]
  raise if libraries.empty? # the source gem's extension: the original error says why

  minor = RUBY_VERSION[/\A\d+\.\d+/]
  built = libraries.map { |path| File.basename(File.dirname(path)) }
  # A library for this Ruby that exists but does not load: most likely a gem for
  # another libc or CPU (the glibc gem on a musl host says "Error loading shared
  # library libgcc_s.so.1"). The loader's own words come first.
  if built.include?(minor)
    raise LoadError, "#{e.message}\npgbus-hub's library for Ruby #{minor} is here but did not load: most likely this " \
                     "gem was built for another C library or CPU than this Ruby's (#{RUBY_PLATFORM}), e.g. the " \
                     "glibc gem on a musl host. Reinstall for this platform (gem install pgbus-hub --platform " \
                     "#{Gem::Platform.local}, RubyGems >= #{Pgbus::Hub::NATIVE_RUBYGEMS}), or build the source gem " \
                     "(gem install pgbus-hub --platform ruby)"
  end

  raise LoadError, "pgbus-hub has no native extension for Ruby #{minor} here (built for " \
                   "#{built.sort.join(', ')}): install the source gem (gem install pgbus-hub --platform ruby), " \
                   "or run rake compile in a checkout"
end
require_relative "hub/events"
require_relative "hub/configuration"
require_relative "hub/boot"
require_relative "hub/puma_plugin"
require_relative "hub/pgbus_surface"
require_relative "hub/pgbus_hub_client"
require_relative "hub/pgbus_adapter"
