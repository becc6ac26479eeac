# frozen_string_literal: true

require_relative "lib/pgbus/hub/version"

Gem::Specification.new do |spec|
  spec.name = "pgbus-hub"
  spec.version = Pgbus::Hub::VERSION
  spec.authors = ["pgbus-hub developers"]
  spec.summary = "One shared PostgreSQL LISTEN connection per Puma host, for pgbus streams (Rust core)"
  spec.description = "A native (Rust) MasterHub, HubClient and HubProtocol, wire-compatible with pgbus 0.13.1, " \
                     "plus a Puma plugin: workers share one LISTEN connection over a Unix socket."
  spec.license = "MIT"
  spec.required_ruby_version = ">= 3.1"

  # Exactly what the build needs: Ruby sources, both crates, the workspace
  # manifest and lock file. Never target/, tmp/, fuzz corpora or specs.
  spec.files = Dir[
    "lib/**/*.rb",
    "exe/*",
    "ext/pgbus_hub/extconf.rb",
    "ext/pgbus_hub/Cargo.toml",
    "ext/pgbus_hub/src/**/*.rs",
    "ext/pgbus_hub_core/Cargo.toml",
    "ext/pgbus_hub_core/src/**/*.rs",
    "Cargo.toml",
    "Cargo.lock",
    "README.md",
    "CHANGELOG.md",
    "LICENSE"
  ]
  spec.require_paths = ["lib"]
  spec.bindir = "exe"
  spec.executables = ["pgbus-hub"]
  spec.extensions = ["ext/pgbus_hub/extconf.rb"]
end
