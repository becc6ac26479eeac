# frozen_string_literal: true

require "rbconfig"

module Pgbus
  module Hub
    # The library for this Ruby minor under lib/pgbus_hub/<minor>/: what `rake compile` builds
    # into a checkout (the host's and the Ruby 3.3 chroot's side by side) and every precompiled gem
    # carries, one per minor. Only the source gem has none there: it compiles on install and
    # `require "pgbus_hub"` finds that one.
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
    # The darwin ones are cross-built on Linux by `rake native:darwin` from Ruby's source
    # (or on a Mac: docs/development.md); none is published yet.
    NATIVE_PLATFORMS = { glibc: %w[x86_64-linux-gnu aarch64-linux-gnu],
                         musl: %w[x86_64-linux-musl aarch64-linux-musl],
                         darwin: %w[arm64-darwin x86_64-darwin] }.freeze
    # The first RubyGems that tells musl from glibc (rubygems#5852).
    NATIVE_RUBYGEMS = "3.3.22"
    # The oldest macOS each darwin gem's bundles load on (their LC_BUILD_VERSION
    # minos: rustc's default for the target; bin/cross-darwin builds for it and checks it).
    DARWIN_MIN_MACOS = { "arm64-darwin" => "11.0", "x86_64-darwin" => "10.12" }.freeze

    # What lib/pgbus/hub.rb says when the library a precompiled gem carries does
    # not load: the loader's words (`error`), then the likely cause and the way
    # out. `minor` is this Ruby's, `built` the minors the gem carries, `platform`
    # this Ruby's RUBY_PLATFORM (given, so a spec can ask as a Mac would).
    module LoadFailure
      module_function

      # dyld's words for a bundle of another CPU (macOS 11+ and the older form).
      DARWIN_WRONG_CPU = /incompatible architecture|missing compatible arch/
      # ... and for one built for a newer macOS (dyld 4, and older dyld meeting
      # load commands it does not know).
      DARWIN_TOO_OLD = /newer than running OS|built for newer macOS|load command 0x\h+ is unknown|unknown required load command/

      def message(error, minor:, built:, platform: RUBY_PLATFORM)
        unless built.include?(minor)
          return "pgbus-hub has no native extension for Ruby #{minor} here (built for #{built.sort.join(', ')}): " \
                 "install the source gem (gem install pgbus-hub --platform ruby), or run rake compile in a checkout"
        end

        "#{error}\npgbus-hub's library for Ruby #{minor} is here but did not load: #{cause(error, minor, platform)}"
      end

      def cause(error, minor, platform)
        if platform.include?("darwin")
          cpu = platform[/\A[^-]+/]
          if error.match?(DARWIN_WRONG_CPU)
            return "it was built for another CPU than this #{cpu} Ruby's (#{platform}): one Ruby installed it and " \
                   "another of the other CPU loads it (an x86_64 Ruby under Rosetta and an arm64 one sharing gems); reinstall it with " \
                   "this Ruby (gem install pgbus-hub picks #{cpu}-darwin), or build the source gem (gem install pgbus-hub --platform ruby)"
          end
          if error.match?(DARWIN_TOO_OLD)
            oldest = DARWIN_MIN_MACOS.map { |gem, macos| "#{gem} #{macos}" }.join(", ")
            return "it needs a newer macOS than this Mac runs (the precompiled gems need at least: #{oldest}); " \
                   "build the source gem for this macOS (gem install pgbus-hub --platform ruby), " \
                   "which needs a Rust toolchain (cargo 1.85+)"
          end
        end
        # Most likely a gem for another libc or CPU (the glibc gem on a musl host
        # says "Error loading shared library libgcc_s.so.1").
        "most likely this gem was built for another C library or CPU than this Ruby's (#{platform}), e.g. the glibc " \
          "gem on a musl host. Reinstall for this platform (gem install pgbus-hub --platform #{Gem::Platform.local}, " \
          "RubyGems >= #{NATIVE_RUBYGEMS}), or build the source gem (gem install pgbus-hub --platform ruby)"
      end
    end

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
