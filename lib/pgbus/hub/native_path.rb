# frozen_string_literal: true

require "rbconfig"

module Pgbus
  module Hub
    # `rake compile` builds one extension per Ruby minor into the checkout (the
    # host's and the Ruby 3.3 chroot's side by side); an installed gem loads `pgbus_hub`.
    NATIVE_DEV_PATH = File.expand_path(
      "../../pgbus_hub/#{RUBY_VERSION[/\A\d+\.\d+/]}/pgbus_hub.#{RbConfig::CONFIG['DLEXT']}", __dir__
    )
  end
end
