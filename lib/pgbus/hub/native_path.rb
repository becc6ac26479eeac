# frozen_string_literal: true

require "rbconfig"

module Pgbus
  module Hub
    # Where `rake compile` puts the extension in a checkout: one directory per
    # Ruby minor, so one checkout serves several Rubies (the host's and the
    # Ruby 3.3 chroot's) without one build overwriting the other. An installed
    # gem has no such file and loads its extension as plain `pgbus_hub`.
    NATIVE_DEV_PATH = File.expand_path(
      "../../pgbus_hub/#{RUBY_VERSION[/\A\d+\.\d+/]}/pgbus_hub.#{RbConfig::CONFIG['DLEXT']}", __dir__
    )
  end
end
