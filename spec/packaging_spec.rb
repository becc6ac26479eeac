# frozen_string_literal: true

require "tmpdir"
require "fileutils"
require "open3"
require "rbconfig"
require "rubygems/package"
require_relative "support/puma_apps/e2e_helpers"
require_relative "support/gem_source"

# The gems `rake gem` and `rake native` put in pkg/ (run with PGBUS_HUB_PKG=1
# after building them; `rake packaging` does, on Ruby 3.1 and, in the chroot, 3.3):
# - the precompiled x86_64-linux-gnu gem (RubyGems >= 3.3.22: Ruby 3.3 here) installs
#   with no Rust toolchain on PATH into an empty GEM_HOME, loads its library from
#   there and serves a 4-worker Puma cluster on one LISTEN connection; an older
#   RubyGems (Debian 12's Ruby 3.1: 3.3.15) refuses it, saying which it needs;
# - the musl gems (no musl Ruby here): their platform, the RubyGems they need, one
#   library per minor, each passing bin/cross-musl's checks against Debian 12's musl;
# - the source gem installs with crates.io unreachable (an empty CARGO_HOME,
#   CARGO_NET_OFFLINE=true): everything it compiles is inside it. On a RubyGems
#   older than 3.3.22, `gem install pgbus-hub` among all the gems takes it.
RSpec.describe "packaged gems", :puma do
  include PumaE2E

  PKG = File.join(ROOT, "pkg")
  MINOR = RUBY_VERSION[/\A\d+\.\d+/]

  before { skip "set PGBUS_HUB_PKG=1 after rake gem native (see the header)" unless ENV["PGBUS_HUB_PKG"] == "1" }
  after { stop_clusters }

  # PATH without any directory that has cargo or rustc.
  def path_without_rust
    ENV.fetch("PATH").split(File::PATH_SEPARATOR).reject do |dir|
      %w[cargo rustc].any? { |tool| File.executable?(File.join(dir, tool)) }
    end.join(File::PATH_SEPARATOR)
  end

  # `gem install --local GEM_FILE`, or with `source:` (a gem source's URL) `gem install
  # pgbus-hub` from there alone; `isolated:` with no network at all (a network namespace
  # of its own), where unshare(1) can. [output, status]
  def try_install(gem, home, env = {}, isolated: false, source: nil)
    no_network = isolated && system("unshare", "--net", "true", err: File::NULL) ? %w[unshare --net] : []
    from = source ? ["--clear-sources", "--source", source] : ["--local"]
    Open3.capture2e({ "GEM_HOME" => home, "GEM_PATH" => home }.merge(env),
                    *no_network, GEM_COMMAND, "install", *from, "--no-document", gem, chdir: Dir.tmpdir)
  end

  def install(...)
    out, status = try_install(...)
    expect(status).to be_success, out
    out
  end

  NATIVE_RUBYGEMS = Gem::Version.new(Pgbus::Hub::NATIVE_RUBYGEMS)
  GLIBC_GEM = File.join(PKG, "pgbus-hub-#{Pgbus::Hub::VERSION}-x86_64-linux-gnu.gem")

  # The library a fresh Ruby (no RUBYLIB) loads from `home`, and its version.
  def loaded_from(home, env = {})
    script = 'require "pgbus/hub"; puts [Pgbus::Hub::VERSION, $LOADED_FEATURES.grep(/pgbus_hub\.so\z/).first].join("|")'
    out, status = Open3.capture2e({ "GEM_HOME" => home, "GEM_PATH" => home, "RUBYLIB" => nil, "RUBYOPT" => nil }.merge(env),
                                  RbConfig.ruby, "-e", script, chdir: Dir.tmpdir)
    expect(status).to be_success, out
    out.strip.split("|")
  end

  if Gem.rubygems_version < NATIVE_RUBYGEMS
    it "precompiled: RubyGems #{Gem::VERSION} refuses the x86_64-linux-gnu gem, naming the RubyGems it needs" do
      expect(File.exist?(GLIBC_GEM)).to be(true), "no precompiled gem in pkg/ (rake native)"
      Dir.mktmpdir("pgbus-hub-native") do |home|
        out, status = try_install(GLIBC_GEM, home)
        expect(status).not_to be_success
        expect(out).to include("requires RubyGems version >= #{NATIVE_RUBYGEMS}")
        expect(Dir[File.join(home, "gems", "*")]).to be_empty
      end
    end
  end

  it "precompiled: installs without a Rust toolchain, loads its #{MINOR} build, census 1 under Puma" do
    skip "RubyGems #{Gem::VERSION} < #{NATIVE_RUBYGEMS} refuses it (the example above)" if Gem.rubygems_version < NATIVE_RUBYGEMS
    gem_file = GLIBC_GEM
    expect(File.exist?(gem_file)).to be(true), "no precompiled gem in pkg/ (rake native)"
    Dir.mktmpdir("pgbus-hub-native") do |home|
      no_rust = { "PATH" => path_without_rust }
      expect(system(no_rust, "sh", "-c", "command -v cargo || command -v rustc", out: File::NULL)).to be(false)
      install(gem_file, home, no_rust)
      version, feature = loaded_from(home, no_rust)
      expect(version).to eq(Pgbus::Hub::VERSION)
      expect(feature).to start_with(home).and end_with("lib/pgbus_hub/#{MINOR}/pgbus_hub.so")
      expect(Dir[File.join(home, "extensions", "**", "*")]).to be_empty # nothing was compiled

      env = no_rust.merge("RUBYLIB" => nil, "GEM_HOME" => home, "GEM_PATH" => [home, *Gem.path].join(File::PATH_SEPARATOR))
      c = cluster(mode: :standalone, env: env)
      c.wait_log(/master hub started before fork/)
      expect(c.get("/pid")["native"]).to start_with(home)
      c.subscribe_all(unique_stream)
      expect(c.census_settles_at(1)).to eq(1)
      c.wait_for("4 workers on the hub", timeout: 10) { c.hub_info&.dig("stats", "workers") == 4 }
      c.stop

      # A Ruby this gem has no build for gets a LoadError naming the builds inside.
      FileUtils.rm_rf(Dir[File.join(home, "gems", "pgbus-hub-*", "lib", "pgbus_hub", MINOR)])
      out, status = Open3.capture2e(env, RbConfig.ruby, "-e", 'require "pgbus/hub"', chdir: Dir.tmpdir)
      expect(status).not_to be_success
      expect(out).to match(/pgbus-hub has no native extension for Ruby #{MINOR} here \(built for \d+\.\d+.*\): install the source gem/)
      puts "  [precompiled gem on Ruby #{RUBY_VERSION}: installed without cargo, census 1, 4 workers on the hub]"
    end
  end

  it "musl gems: platform, RubyGems >= 3.3.22, a library per minor needing musl's libc alone" do
    Pgbus::Hub::NATIVE_PLATFORMS.fetch(:musl).each do |platform|
      gem_file = File.join(PKG, "pgbus-hub-#{Pgbus::Hub::VERSION}-#{platform}.gem")
      expect(File.exist?(gem_file)).to be(true), "no #{platform} gem in pkg/ (rake native)"
      package = Gem::Package.new(gem_file)
      expect(package.spec.platform.to_s).to eq(platform)
      expect(package.spec.required_rubygems_version.to_s).to eq(">= 3.3.22")
      libraries = package.contents.grep(%r{\Alib/pgbus_hub/})
      expect(libraries).to eq(%w[3.1 3.3 3.4].map { |minor| "lib/pgbus_hub/#{minor}/pgbus_hub.so" })
      Dir.mktmpdir("pgbus-hub-musl") do |dir|
        package.extract_files(dir)
        out, status = Open3.capture2e(File.join(ROOT, "bin", "cross-musl"), platform[/\A[^-]+/], "check",
                                      *libraries.map { |lib| File.join(dir, lib) })
        expect(status).to be_success, out
        expect(out.lines.grep(/needs \[libc\.so\] only/).size).to eq(3), out
      end
    end
  end

  # Built only where darwin Rubies were given (rake native:darwin: sources, or macOS Rubies' exported
  # files; .ci/run has neither, the hosted workflows the latter).
  it "darwin gems, where built: platform, RubyGems >= 3.3.22, a .bundle per minor passing bin/cross-darwin's Mach-O checks" do
    gems = Pgbus::Hub::NATIVE_PLATFORMS.fetch(:darwin).to_h do |platform|
      [platform, File.join(PKG, "pgbus-hub-#{Pgbus::Hub::VERSION}-#{platform}.gem")]
    end
    skip "no darwin gem in pkg/ (rake native:darwin needs PGBUS_HUB_RUBY_SRC_* or PGBUS_HUB_DARWIN_RUBIES)" unless gems.values.any? { |file| File.exist?(file) }

    gems.each do |platform, gem_file|
      expect(File.exist?(gem_file)).to be(true), "no #{platform} gem in pkg/ beside the other darwin one"
      package = Gem::Package.new(gem_file)
      expect(package.spec.platform.to_s).to eq(platform)
      expect(package.spec.required_rubygems_version.to_s).to eq(">= 3.3.22")
      libraries = package.contents.grep(%r{\Alib/pgbus_hub/})
      expect(libraries).not_to be_empty
      expect(libraries).to all(match(%r{\Alib/pgbus_hub/\d+\.\d+/pgbus_hub\.bundle\z}))
      Dir.mktmpdir("pgbus-hub-darwin") do |dir|
        package.extract_files(dir)
        out, status = Open3.capture2e(File.join(ROOT, "bin", "cross-darwin"), platform[/\A[^-]+/], "check",
                                      *libraries.map { |lib| File.join(dir, lib) })
        expect(status).to be_success, out
        expect(out.lines.grep(%r{loads \[/usr/lib/libSystem\.B\.dylib\] only}).size).to eq(libraries.size), out
      end
    end
  end

  # Below NATIVE_RUBYGEMS the gem is asked for by name from a gem source holding every
  # gem in pkg/ (spec/support/gem_source.rb), as `gem install pgbus-hub` asks a gem
  # server: such a RubyGems skips the precompiled ones (each requires NATIVE_RUBYGEMS)
  # and builds this one.
  it "source: installs with crates.io unreachable (vendored crates; no network where unshare can)" do
    gem_file = File.join(PKG, "pgbus-hub-#{Pgbus::Hub::VERSION}.gem")
    expect(File.exist?(gem_file)).to be(true), "no source gem in pkg/ (rake gem)"
    Dir.mktmpdir("pgbus-hub-offline") do |dir|
      home = File.join(dir, "home")
      cargo_home = File.join(dir, "cargo-home") # no registry index, no cached crates
      Dir.mkdir(cargo_home)
      offline = { "CARGO_HOME" => cargo_home, "CARGO_NET_OFFLINE" => "true", "CARGO_TARGET_DIR" => nil,
                  "RUSTUP_HOME" => ENV.fetch("RUSTUP_HOME") { File.join(Dir.home, ".rustup") } }
      by_name = Gem.rubygems_version < NATIVE_RUBYGEMS
      if by_name
        gems = Dir[File.join(PKG, "pgbus-hub-#{Pgbus::Hub::VERSION}{,-*}.gem")].sort
        expect(gems.size).to be >= 4 # the source gem, x86_64 glibc, both musl
        source = GemSource.write(File.join(dir, "source"), gems.map { |file| [Gem::Package.new(file).spec, file] })
      end
      t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
      install(by_name ? "pgbus-hub" : gem_file, home, offline, isolated: true, source: source)
      seconds = (Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0).round
      expect(Dir.children(File.join(home, "gems"))).to eq(["pgbus-hub-#{Pgbus::Hub::VERSION}"]) # no platform: the source gem
      expect(Dir[File.join(cargo_home, "registry", "**", "*.crate")]).to be_empty
      version, feature = loaded_from(home)
      expect(version).to eq(Pgbus::Hub::VERSION)
      expect(feature).to start_with(home)
      puts "  [source gem #{(File.size(gem_file) / 1048576.0).round(1)} MB: built offline in #{seconds} s on Ruby #{RUBY_VERSION}" \
           "#{" (RubyGems #{Gem::VERSION}, asked by name from a source of #{gems.size} gems)" if by_name}]"
    end
  end
end
