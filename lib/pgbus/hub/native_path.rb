# frozen_string_literal: true

require "rbconfig"

module Pgbus
  module Hub
    # `rake compile` builds one extension per Ruby minor into the checkout (the
    # host's and the Ruby 3.3 chroot's side by side); an installed gem loads `pgbus_hub`.
    NATIVE_DEV_PATH = File.expand_path(
      "../../pgbus_hub/#{RUBY_VERSION[/\A\d+\.\d+/]}/pgbus_hub.#{RbConfig::CONFIG['DLEXT']}", __dir__
    )

    # The precompiled gems (`rake native`, `rake native:aarch64`, `rake native:musl`),
    # by C library. The glibc ones say -gnu, as nokogiri's and rake-compiler-dock's
    # do: RubyGems takes a libc-less `x86_64-linux` gem as fit for a musl host too
    # (rubygems#5914) and `gem install` there took whichever gem the index listed
    # last. Every one of them needs RubyGems >= NATIVE_RUBYGEMS (the gemspec says
    # so): older RubyGems (Debian 12's Ruby 3.1 has 3.3.15) cannot install a -gnu
    # gem and match any linux gem to any libc; they skip these and build the source gem.
    # The darwin ones are built only on a Mac (docs/development.md's recipe); none is published.
    NATIVE_PLATFORMS = { glibc: %w[x86_64-linux-gnu aarch64-linux-gnu],
                         musl: %w[x86_64-linux-musl aarch64-linux-musl],
                         darwin: %w[arm64-darwin x86_64-darwin] }.freeze
    # The first RubyGems that tells musl from glibc (rubygems#5852).
    NATIVE_RUBYGEMS = "3.3.22"

    # What differs per platform when cargo builds the extension for the Ruby at
    # hand: the one place extconf.rb (gem install) and the Rakefile (rake compile)
    # ask. `host_os` is RbConfig's: the OS this Ruby was built for.
    module CargoBuild
      module_function

      # nil where the extension can be built, else the sentence `gem install` stops with.
      def unsupported(host_os = RbConfig::CONFIG["host_os"])
        return unless host_os.match?(/mswin|mingw/)

        "pgbus-hub does not run on Windows: it shares one PostgreSQL LISTEN connection between the forked " \
          "workers of a preforking server over a Unix socket, and Windows has neither fork nor such servers (WSL works)."
      end

      # The file cargo writes for the cdylib. Cargo names it after the *target*
      # OS (Apple: lib<name>.dylib; Linux and the BSDs: lib<name>.so), which is
      # not what Ruby calls its extensions (DLEXT: `bundle` on macOS), so the
      # mapping is spelled out rather than taken from RbConfig.
      def library(host_os = RbConfig::CONFIG["host_os"])
        host_os.include?("darwin") ? "libpgbus_hub.dylib" : "libpgbus_hub.so"
      end

      # Extra `cargo build` arguments. A musl Ruby: Rust's musl targets link
      # statically by default (crt-static) and then build no cdylib at all
      # ("dropping unsupported crate type `cdylib`"), so crt-static is turned
      # off. Given as --config, which adds to a user's own config-file
      # rustflags; a RUSTFLAGS environment variable replaces every config
      # rustflags (cargo's rule), this one too. Alpine's own cargo defaults to
      # dynamic already; the flag changes nothing there.
      def cargo_args(host_os = RbConfig::CONFIG["host_os"])
        return [] unless host_os.include?("musl")

        ["--config", %(target.'cfg(target_env = "musl")'.rustflags = ["-C", "target-feature=-crt-static"])]
      end
    end
  end
end
