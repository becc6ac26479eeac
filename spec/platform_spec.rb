# frozen_string_literal: true

require "tmpdir"
require "open3"
require "rbconfig"
require "shellwords"

# platform => required_rubygems_version of each precompiled gem, as
# pgbus-hub.gemspec makes it (the platform checked too).
module NativeGemRequirements
  def self.all
    @all ||= Pgbus::Hub::NATIVE_PLATFORMS.values.flatten.to_h do |platform|
      out, status = Open3.capture2e({ "PGBUS_HUB_NATIVE_PLATFORM" => platform }, RbConfig.ruby, "-e",
                                    'spec = Gem::Specification.load("pgbus-hub.gemspec") or abort "gemspec did not load"
                                     print spec.platform, "|", spec.required_rubygems_version', chdir: ROOT)
      raise out unless status.success?

      built, requirement = out.split("|")
      raise "#{platform}: the gemspec made a #{built} gem" unless built == platform

      [platform, Gem::Requirement.new(*requirement.split(", "))]
    end
  end
end

# What each platform gets from the gems (issue 45).
RSpec.describe "platforms" do
  # The source gem's extconf.rb, run for real in a temp dir by this Ruby, which is
  # told it was built for another OS: a -r file rewrites RbConfig::CONFIG before
  # extconf.rb reads it. The Makefile it writes is what `gem install` would run.
  describe "the source gem's extconf.rb" do
    def extconf(host_os, dlext: RbConfig::CONFIG["DLEXT"], soext: RbConfig::CONFIG["SOEXT"])
      Dir.mktmpdir("pgbus-hub-extconf") do |dir|
        fake = File.join(dir, "fake_rbconfig.rb")
        File.write(fake, "RbConfig::CONFIG.update(#{{ 'host_os' => host_os, 'DLEXT' => dlext, 'SOEXT' => soext }.inspect})\n")
        out, status = Open3.capture2e({ "CARGO_TARGET_DIR" => File.join(dir, "target") }, RbConfig.ruby, "-r", fake,
                                      File.join(ROOT, "ext", "pgbus_hub", "extconf.rb"), chdir: dir)
        makefile = File.join(dir, "Makefile")
        yield out, status, File.exist?(makefile) && File.read(makefile)
      end
    end

    # The cargo command line and the copy of the Makefile's build rule, as words.
    def build_rule(makefile)
      recipe = makefile[/^\$\(DLIB\):\n((?:\t.*\n)+)/, 1].lines.map(&:strip)
      [Shellwords.split(recipe.grep(/ build /).first), Shellwords.split(recipe.grep(/\Acp /).first)]
    end

    it "Linux (glibc): copies libpgbus_hub.so to pgbus_hub.so, nothing added to cargo's flags" do
      extconf("linux-gnu", dlext: "so", soext: "so") do |out, status, makefile|
        expect(status).to be_success, out
        cargo, copy = build_rule(makefile)
        expect(makefile).to include("DLIB = pgbus_hub.so")
        expect(copy.values_at(0, 2)).to eq(["cp", "$(DLIB)"])
        expect(copy[1]).to end_with("/release/libpgbus_hub.so")
        expect(cargo.join(" ")).not_to include("crt-static")
      end
    end

    it "macOS: copies the libpgbus_hub.dylib cargo writes there to pgbus_hub.bundle" do
      extconf("darwin23", dlext: "bundle", soext: "dylib") do |out, status, makefile|
        expect(status).to be_success, out
        cargo, copy = build_rule(makefile)
        expect(makefile).to include("DLIB = pgbus_hub.bundle")
        expect(copy[1]).to end_with("/release/libpgbus_hub.dylib")
        expect(cargo.join(" ")).not_to include("crt-static")
      end
      # The link: Apple's linker refuses undefined symbols in a dylib unless told
      # they come from the loading process (Ruby); the binding's build script says so.
      expect(File.read(File.join(ROOT, "ext", "pgbus_hub", "build.rs")))
        .to include('"apple"', "cargo:rustc-cdylib-link-arg=-Wl,-undefined,dynamic_lookup")
    end

    it "musl (Alpine): cargo builds with crt-static off, so a rustup musl toolchain makes a cdylib" do
      extconf("linux-musl", dlext: "so", soext: "so") do |out, status, makefile|
        expect(status).to be_success, out
        cargo, copy = build_rule(makefile)
        expect(copy[1]).to end_with("/release/libpgbus_hub.so")
        config = cargo[cargo.index("--config") + 1]
        expect(config).to eq(%(target.'cfg(target_env = "musl")'.rustflags = ["-C", "target-feature=-crt-static"]))
      end
    end

    %w[mingw32 mswin64].each do |host_os|
      it "Windows (#{host_os}): stops with one sentence saying why, and writes no Makefile" do
        extconf(host_os, dlext: "so", soext: "dll") do |out, status, makefile|
          expect(status).not_to be_success
          expect(makefile).to be(false)
          expect(out.strip).to eq(Pgbus::Hub::CargoBuild.unsupported(host_os))
          expect(out).to match(/\Apgbus-hub does not run on Windows: .*fork.*\.\Z/)
        end
      end
    end
  end

  # Which precompiled gem RubyGems (this Ruby's own) installs on each host,
  # asked through its public API: Gem::Platform.match_gem? with Gem.platforms set
  # to that host's (what `gem install` and Bundler filter candidates with), then
  # the gems whose required_rubygems_version this RubyGems does not meet dropped
  # (as its installer does). The gems' platforms and requirements come from
  # pgbus-hub.gemspec itself (NativeGemRequirements). Hosts as RbConfig::CONFIG["arch"] names them.
  describe "RubyGems #{Gem::VERSION} picking a precompiled gem" do
    GLIBC_HOSTS = { "x86_64-linux-gnu" => "Debian/Ubuntu's Ruby", "x86_64-linux" => "a Ruby built from source",
                    "aarch64-linux-gnu" => "Debian's arm64 Ruby", "aarch64-linux" => "an arm64 Ruby built from source" }.freeze
    MUSL_HOSTS = { "x86_64-linux-musl" => "Alpine", "aarch64-linux-musl" => "Alpine on arm64" }.freeze
    # RubyGems tells musl from glibc from this release on (rubygems/rubygems#5852).
    MUSL_AWARE = Gem::Version.new("3.3.22")

    def picks(host)
      saved = Gem.platforms
      Gem.platforms = [Gem::Platform::RUBY, Gem::Platform.new(host)]
      NativeGemRequirements.all.select do |platform, requirement|
        Gem::Platform.match_gem?(Gem::Platform.new(platform), "pgbus-hub") && requirement.satisfied_by?(Gem.rubygems_version)
      end.keys
    ensure
      Gem.platforms = saved
    end

    def gem_for(host, libc)
      Pgbus::Hub::NATIVE_PLATFORMS.fetch(libc).find { |platform| platform.start_with?("#{host[/\A[^-]+/]}-") }
    end

    GLIBC_HOSTS.each do |host, what|
      it "#{host} (#{what}): the glibc gem, never a musl one" do
        expect(picks(host)).to eq([gem_for(host, :glibc)])
      end
    end

    # Bundler's choice among the gems RubyGems lets through: the most specific
    # platform (Bundler::GemHelpers.platform_specificity_match; Bundler 2.3.7 and 2.5.22 here).
    def bundler_pick(host)
      require "bundler"
      picks(host).min_by do |platform|
        Bundler::GemHelpers.platform_specificity_match(Gem::Platform.new(platform), Gem::Platform.new(host))
      end
    end

    MUSL_HOSTS.each do |host, what|
      if Gem.rubygems_version >= MUSL_AWARE
        # RubyGems lets a libc-less linux gem onto musl hosts too (platform.rb: a
        # nil version matches "musl"); Bundler then takes the exact platform, and
        # `gem install` takes the musl gem as well (the next group installs).
        it "#{host} (#{what}): the musl gem is fit, and Bundler takes it over the glibc one" do
          expect(picks(host)).to include(gem_for(host, :musl))
          expect(bundler_pick(host)).to eq(gem_for(host, :musl))
        end
      else
        # Older RubyGems read any linux gem as fit for any libc: the musl gem's
        # required_rubygems_version keeps it from glibc hosts, but on musl such
        # a RubyGems takes the glibc gem. Musl users need RubyGems >= 3.3.22.
        it "#{host} (#{what}) with RubyGems < #{MUSL_AWARE}: not the musl gem (it needs #{MUSL_AWARE}); the glibc gem, as before musl gems" do
          expect(picks(host)).to eq([gem_for(host, :glibc)])
        end
      end
    end
  end

  # The same question asked of RubyGems' installer end to end: `gem install pgbus-hub`
  # from a gem source (file://, written here in RubyGems' index format) holding a
  # source gem and the four precompiled ones, empty stand-ins carrying the real
  # gemspec's platform and required_rubygems_version; the host's identity is
  # RbConfig::CONFIG["arch"], rewritten before RubyGems reads it.
  describe "`gem install` (RubyGems #{Gem::VERSION}) from a source with every gem" do
    require "rubygems/package"
    require "zlib"

    before(:all) do
      @source = Dir.mktmpdir("pgbus-hub-gem-source")
      gems = { "ruby" => Gem::Requirement.default }.merge(NativeGemRequirements.all)
      specs = gems.map do |platform, requirement|
        Gem::Specification.new do |spec|
          spec.name = "pgbus-hub"
          spec.version = Pgbus::Hub::VERSION
          spec.summary = "stand-in for #{platform}"
          spec.authors = ["pgbus-hub developers"]
          spec.platform = platform
          spec.required_rubygems_version = requirement
        end
      end
      FileUtils.mkdir_p([File.join(@source, "gems"), File.join(@source, "quick", "Marshal.4.8")])
      specs.each do |spec|
        Dir.chdir(File.join(@source, "gems")) { Gem::DefaultUserInteraction.use_ui(Gem::SilentUI.new) { Gem::Package.build(spec) } }
        File.binwrite(File.join(@source, "quick", "Marshal.4.8", "#{spec.full_name}.gemspec.rz"), Gem.deflate(Marshal.dump(spec)))
      end
      index = specs.map { |spec| [spec.name, spec.version, spec.platform.to_s] }
      { "specs" => index, "latest_specs" => index, "prerelease_specs" => [] }.each do |name, tuples|
        Zlib::GzipWriter.open(File.join(@source, "#{name}.4.8.gz")) { |gz| gz.write(Marshal.dump(tuples)) }
      end
      @fake = File.join(@source, "host.rb")
      File.write(@fake, <<~RUBY)
        RbConfig::CONFIG["arch"] = ENV.fetch("PGBUS_HUB_FAKE_ARCH")
        Gem::Platform.instance_variable_set(:@local, nil)
        Gem.platforms = [Gem::Platform::RUBY, Gem::Platform.local]
      RUBY
    end

    after(:all) { FileUtils.rm_rf(@source) }

    def installs_on(host)
      Dir.mktmpdir("pgbus-hub-gem-home") do |home|
        out, status = Open3.capture2e({ "PGBUS_HUB_FAKE_ARCH" => host, "GEM_HOME" => home, "GEM_PATH" => home },
                                      RbConfig.ruby, "-r", @fake, "-S", "gem", "install", "--clear-sources",
                                      "--source", "file://#{@source}/", "--no-document", "pgbus-hub")
        expect(status).to be_success, out
        Dir.children(File.join(home, "gems"))
      end
    end

    def gem_dir(platform) = "pgbus-hub-#{Pgbus::Hub::VERSION}-#{platform}"

    %w[x86_64-linux-gnu x86_64-linux aarch64-linux-gnu].each do |host|
      it "#{host}: the glibc gem" do
        expect(installs_on(host)).to eq([gem_dir(host.delete_suffix("-gnu"))])
      end
    end

    %w[x86_64-linux-musl aarch64-linux-musl].each do |host|
      glibc = host.delete_suffix("-musl")
      if Gem.rubygems_version >= MUSL_AWARE
        it("#{host}: the musl gem") { expect(installs_on(host)).to eq([gem_dir(host)]) }
      else
        it("#{host}: the glibc gem (the musl one needs RubyGems >= #{MUSL_AWARE})") { expect(installs_on(host)).to eq([gem_dir(glibc)]) }
      end
    end
  end
end
