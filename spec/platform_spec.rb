# frozen_string_literal: true

require "fileutils"
require "tmpdir"
require "open3"
require "rbconfig"
require "shellwords"

# platform => required_rubygems_version of each precompiled gem, as
# pgbus-hub.gemspec makes it (the platform checked too).
module NativeGemRequirements
  def self.all
    @all ||= Pgbus::Hub::NATIVE_PLATFORMS.values.flatten.to_h do |platform|
      out, status = Dir.mktmpdir("pgbus-hub-gemspec") { |dir| load_gemspec(dir, platform) }
      raise out unless status.success?

      built, requirement = out.split("|")
      raise "#{platform}: the gemspec made a #{built} gem" unless built == platform

      [platform, Gem::Requirement.new(*requirement.split(", "))]
    end
  end

  # The gemspec loaded in `dir`, a copy of what it reads with a stand-in library
  # for this Ruby's minor named as `platform`'s Ruby names it (.bundle on macOS).
  def self.load_gemspec(dir, platform)
    FileUtils.cp(File.join(ROOT, "pgbus-hub.gemspec"), dir)
    FileUtils.mkdir_p(File.join(dir, "lib", "pgbus", "hub"))
    %w[version native_path].each { |file| FileUtils.cp(File.join(ROOT, "lib", "pgbus", "hub", "#{file}.rb"), File.join(dir, "lib", "pgbus", "hub")) }
    library = File.join(dir, "lib", "pgbus_hub", RUBY_VERSION[/\A\d+\.\d+/], "pgbus_hub.#{platform.include?('darwin') ? 'bundle' : 'so'}")
    FileUtils.mkdir_p(File.dirname(library))
    FileUtils.touch(library)
    Open3.capture2e({ "PGBUS_HUB_NATIVE_PLATFORM" => platform }, RbConfig.ruby, "-e",
                    'spec = Gem::Specification.load("pgbus-hub.gemspec") or abort "gemspec did not load"
                     print spec.platform, "|", spec.required_rubygems_version', chdir: dir)
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

  # lib/pgbus/hub.rb's LoadError, from a copy of lib/ (as a precompiled gem lays it
  # out) whose lib/pgbus_hub/ holds `libraries` ({ minor => bytes }), required by a new Ruby.
  describe "a precompiled gem's library that does not load" do
    minor = RUBY_VERSION[/\A\d+\.\d+/]

    def require_with(libraries)
      Dir.mktmpdir("pgbus-hub-loaderror") do |dir|
        FileUtils.cp_r(File.join(ROOT, "lib", "pgbus"), File.join(dir, "pgbus"))
        libraries.each do |minor, bytes|
          FileUtils.mkdir_p(File.join(dir, "pgbus_hub", minor))
          File.binwrite(File.join(dir, "pgbus_hub", minor, "pgbus_hub.#{RbConfig::CONFIG['DLEXT']}"), bytes)
        end
        Open3.capture2e({ "RUBYLIB" => nil, "RUBYOPT" => nil }, RbConfig.ruby, "-I", dir, "-e", 'require "pgbus/hub"',
                        chdir: dir)
      end
    end

    # The real library needing a libgcc_s that is not there, as the glibc gem's needs
    # libc.so.6 on a musl host (one NEEDED name changed, same length); an empty file.
    it "for this Ruby's minor but unloadable (a dependency missing; empty): the loader's words, then the likely cause" do
      real = File.binread(Pgbus::Hub::NATIVE_DEV_PATH)
      expect(real.scan("libgcc_s.so.1").size).to eq(1)
      { "libgcc_Q.so.1" => real.sub("libgcc_s.so.1", "libgcc_Q.so.1"), "file too short" => "" }.each do |loader_says, bytes|
        out, status = require_with(minor => bytes)
        expect(status).not_to be_success
        expect(out).to include(loader_says)
        expect(out).to include("pgbus-hub's library for Ruby #{minor} is here but did not load: most likely this gem " \
                               "was built for another C library or CPU than this Ruby's (#{RUBY_PLATFORM})")
        expect(out).to include("gem install pgbus-hub --platform #{Gem::Platform.local}")
        expect(out).not_to include("no native extension")
      end
    end

    it "none for this Ruby's minor: names the minors inside" do
      out, status = require_with("9.8" => "", "9.9" => "")
      expect(status).not_to be_success
      expect(out).to include("pgbus-hub has no native extension for Ruby #{minor} here (built for 9.8, 9.9)")
    end

    # On a Mac (issue 55 item 6), asked of the message logic with dyld's own words
    # and a darwin RUBY_PLATFORM injected: nothing here can load a Mach-O.
    describe "on a Mac (the darwin gems)" do
      def says(error, platform)
        Pgbus::Hub::LoadFailure.message(error, minor: "3.4", built: %w[3.3 3.4], platform: platform)
      end

      bundle = "/Users/u/.gem/ruby/3.4.0/gems/pgbus-hub-0.1.0-arm64-darwin/lib/pgbus_hub/3.4/pgbus_hub.bundle"
      {
        "x86_64-darwin23" => "dlopen(#{bundle}, 0x0009): tried: '#{bundle}' (mach-o file, but is an incompatible " \
                             "architecture (have 'arm64', need 'x86_64')) - #{bundle}",
        "arm64-darwin24" => "dlopen(#{bundle}, 0x0009): missing compatible arch in #{bundle} - #{bundle}"
      }.each do |platform, dyld|
        it "a bundle of the other CPU (#{platform}, Rosetta): dyld's words, then one sentence: the cause and the source gem" do
          out = says(dyld, platform)
          loader, sentence, *rest = out.lines.map(&:chomp)
          expect([loader, rest]).to eq([dyld, []])
          cpu = platform[/\A[^-]+/]
          expect(sentence).to start_with("pgbus-hub's library for Ruby 3.4 is here but did not load: it was built for " \
                                         "another CPU than this #{cpu} Ruby's (#{platform})")
          expect(sentence).to include("Rosetta", "gem install pgbus-hub picks #{cpu}-darwin",
                                      "(gem install pgbus-hub --platform ruby)")
          expect(sentence.scan(/\. /)).to be_empty # one sentence
          expect(sentence).not_to include("C library")
        end
      end

      [
        "dlopen(#{bundle}, 0x0009): tried: '#{bundle}' (mach-o file, but is built for macOS 11.0 which is newer than running OS)",
        "dlopen(#{bundle}, 9): no suitable image found.  Did find:\n\t#{bundle}: cannot load 'pgbus_hub.bundle' " \
        "(load command 0x80000034 is unknown)"
      ].each do |dyld|
        it "a bundle for a newer macOS (#{dyld[/newer than running OS|load command \S+ is unknown/]}): the oldest " \
           "macOS of each gem, then the source gem" do
          sentence = says(dyld, "x86_64-darwin17").lines.last
          expect(sentence).to start_with("pgbus-hub's library for Ruby 3.4 is here but did not load: it needs a newer " \
                                         "macOS than this Mac runs (the precompiled gems need at least: arm64-darwin " \
                                         "#{Pgbus::Hub::DARWIN_MIN_MACOS['arm64-darwin']}, x86_64-darwin " \
                                         "#{Pgbus::Hub::DARWIN_MIN_MACOS['x86_64-darwin']})")
          expect(sentence).to include("(gem install pgbus-hub --platform ruby)")
        end
      end

      it "another failure on a Mac, or dyld's words on Linux: the general sentence" do
        expect(says("dlopen(#{bundle}, 0x0009): Symbol not found: _rb_foo", "arm64-darwin23").lines.last)
          .to include("most likely this gem was built for another C library or CPU")
        expect(says("mach-o file, but is an incompatible architecture", "x86_64-linux").lines.last)
          .to include("most likely this gem was built for another C library or CPU than this Ruby's (x86_64-linux)")
      end

      it "no bundle for this Ruby's minor: names the minors inside, on a Mac too" do
        expect(Pgbus::Hub::LoadFailure.message("x", minor: "3.2", built: %w[3.4 3.3], platform: "arm64-darwin23"))
          .to eq("pgbus-hub has no native extension for Ruby 3.2 here (built for 3.3, 3.4): install the source gem " \
                 "(gem install pgbus-hub --platform ruby), or run rake compile in a checkout")
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
    DARWIN_HOSTS = { "arm64-darwin23" => "a Mac's Ruby", "arm64-darwin24" => "a Mac's Ruby on macOS 15",
                     "x86_64-darwin23" => "an Intel Mac's Ruby", "x86_64-darwin24" => "an Intel Mac's Ruby on macOS 15" }.freeze
    # RubyGems tells musl from glibc from this release on (rubygems/rubygems#5852).
    MUSL_AWARE = Gem::Version.new(Pgbus::Hub::NATIVE_RUBYGEMS)

    def picks(host)
      saved = Gem.platforms
      Gem.platforms = [Gem::Platform::RUBY, Gem::Platform.new(host)]
      NativeGemRequirements.all.select do |platform, requirement|
        Gem::Platform.match_gem?(Gem::Platform.new(platform.split("-", 3)), "pgbus-hub") &&
          requirement.satisfied_by?(Gem.rubygems_version)
      end.keys
    ensure
      Gem.platforms = saved
    end

    def gem_for(host, libc)
      Pgbus::Hub::NATIVE_PLATFORMS.fetch(libc).find { |platform| platform.start_with?("#{host[/\A[^-]+/]}-") }
    end

    { GLIBC_HOSTS => :glibc, MUSL_HOSTS => :musl, DARWIN_HOSTS => :darwin }.each do |hosts, libc|
      hosts.each do |host, what|
        if Gem.rubygems_version >= MUSL_AWARE
          it "#{host} (#{what}): the #{libc} gem, and only it" do
            expect(picks(host)).to eq([gem_for(host, libc)])
          end
        else
          # Such a RubyGems matches any linux gem to any libc and cannot install
          # a -gnu gem: every precompiled gem requires MUSL_AWARE, so it takes none.
          it "#{host} (#{what}) with RubyGems < #{MUSL_AWARE}: no precompiled gem (each needs #{MUSL_AWARE})" do
            expect(picks(host)).to be_empty
          end
        end
      end
    end
  end

  # The darwin gems by platform alone (issue 55), whatever this RubyGems' version
  # (the requirement filter above leaves Debian 12's RubyGems 3.3.15 none at all):
  # Gem::Platform.match_gem? with Gem.platforms set to each host's. The gems are
  # named without a darwin version, so every macOS release matches them.
  describe "RubyGems #{Gem::VERSION} matching the darwin gems' platforms" do
    darwin_gems = Pgbus::Hub::NATIVE_PLATFORMS.fetch(:darwin)

    def matching(host, gems)
      saved = Gem.platforms
      Gem.platforms = [Gem::Platform::RUBY, Gem::Platform.new(host)]
      gems.select { |platform| Gem::Platform.match_gem?(Gem::Platform.new(platform.split("-", 3)), "pgbus-hub") }
    ensure
      Gem.platforms = saved
    end

    it "rake native:darwin without a darwin Ruby says what to set and builds nothing" do
      env = ENV.keys.grep(/\APGBUS_HUB_(RUBY_SRC_|DARWIN_RUBIES\z)/).to_h { |key| [key, nil] }
      out, status = Open3.capture2e(env, RbConfig.ruby, "-S", "rake", "native:darwin", chdir: ROOT)
      expect(status).to be_success, out
      expect(out.strip).to eq("native:darwin: skipped, no darwin Ruby given: set PGBUS_HUB_RUBY_SRC_3_3, " \
                              "PGBUS_HUB_RUBY_SRC_3_4 and/or PGBUS_HUB_RUBY_SRC_4_0 to Ruby 3.3 / 3.4 / 4.0 source " \
                              "directories, or PGBUS_HUB_DARWIN_RUBIES to a directory of bin/cross-darwin export's " \
                              "files (docs/development.md)")
    end

    # What the workflows' macOS jobs upload for the Linux build: run here on this Ruby, whose layout
    # (Debian's multiarch paths) is no darwin one, the files must stand where its RbConfig says.
    it "bin/cross-darwin export copies rbconfig.rb and both header directories at their paths under the prefix" do
      Dir.mktmpdir("pgbus-hub-export") do |tmp|
        # export runs the `ruby` on PATH (setup-ruby's on a Mac): this suite's Ruby here (the sid
        # chroot's `ruby` is 3.3 while the suite runs on ruby3.4).
        bin = File.join(tmp, "bin")
        FileUtils.mkdir_p(bin)
        File.symlink(RbConfig.ruby, File.join(bin, "ruby"))
        dir = File.join(tmp, "export")
        out, status = Open3.capture2e({ "PATH" => "#{bin}:#{ENV.fetch('PATH')}" },
                                      File.join(ROOT, "bin", "cross-darwin"), "export", dir)
        expect(status).to be_success, out
        config = RbConfig::CONFIG
        exported = File.join(dir, config["arch"][/\A[^-]+/], RUBY_VERSION[/\A\d+\.\d+/])
        under = ->(path) { File.join(exported, path.delete_prefix("#{config['prefix']}/")) }
        expect(File.read(under.call(File.join(config["rubyarchdir"], "rbconfig.rb"))))
          .to eq(File.read(File.join(config["rubyarchdir"], "rbconfig.rb")))
        expect(File.exist?(File.join(under.call(config["rubyhdrdir"]), "ruby", "version.h"))).to be(true)
        expect(File.exist?(File.join(under.call(config["rubyarchhdrdir"]), "ruby", "config.h"))).to be(true)
        expect(Dir[File.join(exported, "**", "rbconfig.rb")].size).to eq(1)
      end
    end

    it "are named without a darwin version" do
      expect(darwin_gems).to eq(%w[arm64-darwin x86_64-darwin])
      expect(darwin_gems.map { |platform| Gem::Platform.new(platform.split("-", 3)).version }).to eq([nil, nil])
    end

    { "arm64-darwin23" => "arm64-darwin", "arm64-darwin24" => "arm64-darwin", "arm64-darwin20" => "arm64-darwin",
      "x86_64-darwin23" => "x86_64-darwin", "x86_64-darwin24" => "x86_64-darwin",
      "x86_64-darwin17" => "x86_64-darwin" }.each do |host, gem|
      it "#{host}: the #{gem} gem alone" do
        expect(matching(host, darwin_gems)).to eq([gem])
      end
    end

    %w[x86_64-linux-gnu x86_64-linux aarch64-linux-gnu aarch64-linux x86_64-linux-musl aarch64-linux-musl
       x64-mingw-ucrt].each do |host|
      it "#{host}: never a darwin gem" do
        expect(matching(host, darwin_gems)).to be_empty
      end
    end
  end

  # The same question asked of RubyGems' installer end to end: `gem install pgbus-hub`
  # from a gem source (file://, written here in RubyGems' index format) holding a
  # source gem and the four precompiled ones, empty stand-ins carrying the real
  # gemspec's platform and required_rubygems_version, listed in both orders (a
  # RubyGems that lets two gems onto one host installs the one listed last); the
  # host's identity is RbConfig::CONFIG["arch"], rewritten before RubyGems reads it.
  describe "`gem install` (RubyGems #{Gem::VERSION}) from a source with every gem" do
    require_relative "support/gem_source"

    # A gem source listing the stand-ins in `order`: its URL.
    def self.write_source(dir, order)
      gems = { "ruby" => Gem::Requirement.default }.merge(NativeGemRequirements.all).to_a
      gems.reverse! if order == :reversed
      built = File.join(dir, "built")
      FileUtils.mkdir_p(built)
      GemSource.write(dir, gems.map do |platform, requirement|
        spec = Gem::Specification.new do |stand_in|
          stand_in.name = "pgbus-hub"
          stand_in.version = Pgbus::Hub::VERSION
          stand_in.summary = "stand-in for #{platform}"
          stand_in.authors = ["pgbus-hub developers"]
          stand_in.platform = platform == "ruby" ? platform : Gem::Platform.new(platform.split("-", 3)) # as pgbus-hub.gemspec makes it
          stand_in.required_rubygems_version = requirement
        end
        [spec, File.join(built, Dir.chdir(built) { Gem::DefaultUserInteraction.use_ui(Gem::SilentUI.new) { Gem::Package.build(spec) } })]
      end)
    end

    before(:all) do
      @dir = Dir.mktmpdir("pgbus-hub-gem-source")
      @sources = %i[listed reversed].to_h { |order| [order, self.class.write_source(File.join(@dir, order.to_s), order)] }
      @fake = File.join(@dir, "host.rb")
      File.write(@fake, <<~RUBY)
        RbConfig::CONFIG["arch"] = ENV.fetch("PGBUS_HUB_FAKE_ARCH")
        Gem::Platform.instance_variable_set(:@local, nil)
        Gem.platforms = [Gem::Platform::RUBY, Gem::Platform.local]
      RUBY
    end

    after(:all) { FileUtils.rm_rf(@dir) }

    # The gems `gem install pgbus-hub` put in an empty GEM_HOME on `host`, from each source.
    def installs_on(host)
      @sources.transform_values do |source|
        Dir.mktmpdir("pgbus-hub-gem-home") do |home|
          out, status = Open3.capture2e({ "PGBUS_HUB_FAKE_ARCH" => host, "GEM_HOME" => home, "GEM_PATH" => home },
                                        RbConfig.ruby, "-r", @fake, "-S", "gem", "install", "--clear-sources",
                                        "--source", source, "--no-document", "pgbus-hub")
          expect(status).to be_success, out
          Dir.children(File.join(home, "gems"))
        end
      end
    end

    def gem_dir(platform) = ["pgbus-hub-#{Pgbus::Hub::VERSION}", platform].compact.join("-")

    { "x86_64-linux-gnu" => "x86_64-linux-gnu", "x86_64-linux" => "x86_64-linux-gnu", "aarch64-linux-gnu" => "aarch64-linux-gnu",
      "x86_64-linux-musl" => "x86_64-linux-musl", "aarch64-linux-musl" => "aarch64-linux-musl" }.each do |host, platform|
      if Gem.rubygems_version >= MUSL_AWARE
        it "#{host}: the #{platform} gem, whatever the order" do
          expect(installs_on(host)).to eq(listed: [gem_dir(platform)], reversed: [gem_dir(platform)])
        end
      else
        it "#{host}: the source gem (every precompiled gem needs RubyGems >= #{MUSL_AWARE}), whatever the order" do
          expect(installs_on(host)).to eq(listed: [gem_dir(nil)], reversed: [gem_dir(nil)])
        end
      end
    end
  end
end
