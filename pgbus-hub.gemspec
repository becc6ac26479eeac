# frozen_string_literal: true

require_relative "lib/pgbus/hub/version"
require_relative "lib/pgbus/hub/native_path"

# Two gems from this file (rake gem / rake native, see the Rakefile):
# - the source gem (platform ruby): both crates, built by extconf.rb with cargo
#   at install time; `rake gem` adds the vendored crates (vendor/cargo), so it
#   builds offline;
# - PGBUS_HUB_NATIVE_PLATFORM=x86_64-linux-gnu (or another of
#   Pgbus::Hub::NATIVE_PLATFORMS): a precompiled gem carrying one library per
#   Ruby minor under lib/pgbus_hub/<minor>/; no compiler needed.
native_platform = ENV.fetch("PGBUS_HUB_NATIVE_PLATFORM", "")

Gem::Specification.new do |spec|
  spec.name = "pgbus-hub"
  spec.version = Pgbus::Hub::VERSION
  spec.authors = ["pgbus-hub developers"]
  spec.summary = "One shared PostgreSQL LISTEN connection per Puma host, for pgbus streams (Rust core)"
  spec.description = "A native (Rust) MasterHub, HubClient and HubProtocol, wire-compatible with pgbus 0.13.1, " \
                     "plus a Puma plugin: workers share one LISTEN connection over a Unix socket."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"
  spec.files = Dir["lib/**/*.rb", "exe/*", "README.md", "docs/*.md", "CHANGELOG.md", "LICENSE"]
  spec.require_paths = ["lib"]
  spec.bindir = "exe"
  spec.executables = ["pgbus-hub"]

  if native_platform.empty?
    # Exactly what the build needs: both crates, the workspace manifest and lock
    # file, and the vendored crates when `rake gem` put them there. Never
    # target/, tmp/, fuzz corpora or specs.
    spec.files += Dir["ext/pgbus_hub/extconf.rb", "ext/pgbus_hub/build.rs", "ext/pgbus_hub/Cargo.toml", "ext/pgbus_hub/src/**/*.rs",
                      "ext/pgbus_hub_core/Cargo.toml", "ext/pgbus_hub_core/src/**/*.rs", "Cargo.toml", "Cargo.lock"]
    spec.files += Dir.glob("vendor/cargo/**/*", File::FNM_DOTMATCH).select { |path| File.file?(path) }
    spec.extensions = ["ext/pgbus_hub/extconf.rb"]
  else
    # Named as the platform's Ruby names extensions: pgbus_hub.bundle on macOS,
    # else pgbus_hub.so (not this Ruby's DLEXT: the darwin gems are built on Linux).
    built_glob = "lib/pgbus_hub/*/pgbus_hub.#{native_platform.include?('darwin') ? 'bundle' : 'so'}"
    built = Dir[built_glob].sort
    minors = built.map { |path| Gem::Version.new(path[%r{pgbus_hub/(\d+\.\d+)/}, 1]) }
    known = Pgbus::Hub::NATIVE_PLATFORMS.values.flatten
    raise "PGBUS_HUB_NATIVE_PLATFORM=#{native_platform}: not one of #{known.join(', ')}" unless known.include?(native_platform)
    raise "PGBUS_HUB_NATIVE_PLATFORM: no #{built_glob} (run rake native)" if minors.empty?

    # From its parts: RubyGems before 3.3.22 (the host's 3.3.15 builds these) would
    # fold "x86_64-linux-gnu" into "x86_64-linux".
    spec.platform = Gem::Platform.new(native_platform.split("-", 3))
    # RubyGems before 3.3.22 reads any linux gem as fit for any libc and cannot
    # install a -gnu gem: such a RubyGems skips every precompiled gem for this
    # and installs the source gem (cargo builds it).
    spec.required_rubygems_version = ">= #{Pgbus::Hub::NATIVE_RUBYGEMS}"
    spec.files += built
    # The Rubies built for, from the oldest to the newest minor (a minor in
    # between without a build gets the load error naming the ones inside).
    newest_major, newest_minor = minors.max.segments
    spec.required_ruby_version = [">= #{minors.min}", "< #{newest_major}.#{newest_minor + 1}.dev"]
  end
end
