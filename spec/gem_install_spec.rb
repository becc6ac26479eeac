# frozen_string_literal: true

require "tmpdir"
require "open3"
require "rbconfig"

# Packaging: `gem build` + `gem install --local` into an empty GEM_HOME
# compiles the Rust extension through extconf.rb, and a new Ruby process can
# load it from there (and only from there).
RSpec.describe "the packaged gem" do
  let(:spec) { Gem::Specification.load(File.join(ROOT, "pgbus-hub.gemspec")) }

  it "ships what the build needs and nothing else" do
    files = spec.files
    expect(files).to include("Cargo.toml", "Cargo.lock", "ext/pgbus_hub/extconf.rb",
                             "ext/pgbus_hub/Cargo.toml", "ext/pgbus_hub/build.rs", "ext/pgbus_hub/src/lib.rs",
                             "ext/pgbus_hub_core/Cargo.toml", "ext/pgbus_hub_core/src/lib.rs",
                             "lib/pgbus/hub.rb")
    expect(files.grep(%r{(\A|/)(target|tmp|fuzz|spec)/})).to be_empty
    expect(files.grep(/\.(so|gem|o)\z/)).to be_empty
  end

  it "builds, installs into an empty GEM_HOME and loads in a new process" do
    Dir.mktmpdir("pgbus-hub-gem") do |dir|
      gem_file = File.join(dir, "pgbus-hub.gem")
      env = { "CARGO_TARGET_DIR" => ENV.fetch("CARGO_TARGET_DIR") { File.join(ROOT, "target") } }
      out, status = Open3.capture2e(env, GEM_COMMAND, "build", "pgbus-hub.gemspec", "--output", gem_file, chdir: ROOT)
      expect(status).to be_success, out

      home = File.join(dir, "home")
      install_env = env.merge("GEM_HOME" => home, "GEM_PATH" => home)
      # RubyGems 3.6 runs `make install sitearchdir=./.gem.XXXX`: the extension must land
      # inside the gem, never in Ruby's own site directory.
      site_so = File.join(RbConfig::CONFIG["sitearchdir"], "pgbus_hub.#{RbConfig::CONFIG['DLEXT']}")
      site_before = File.exist?(site_so) && File.mtime(site_so)
      out, status = Open3.capture2e(install_env, GEM_COMMAND, "install", "--local", "--no-document", gem_file,
                                    chdir: dir)
      expect(status).to be_success, out
      expect(File.exist?(site_so) && File.mtime(site_so)).to eq(site_before)
      expect(Dir.glob(File.join(home, "{extensions,gems}", "**", "pgbus_hub.#{RbConfig::CONFIG['DLEXT']}"))).not_to be_empty

      script = <<~RUBY
        require "pgbus/hub"
        frame = Pgbus::Hub::Protocol.encode({ "t" => "sub", "q" => "chat" })
        back = Pgbus::Hub::Protocol.read_frame(StringIO.new(frame))
        puts [Pgbus::Hub::VERSION, $LOADED_FEATURES.grep(/pgbus_hub\\./).first, back.inspect].join("|")
      RUBY
      clean_env = install_env.merge("RUBYLIB" => nil, "RUBYOPT" => nil)
      out, status = Open3.capture2e(clean_env, RbConfig.ruby, "-rstringio", "-e", script, chdir: dir)
      expect(status).to be_success, out
      version, feature, back = out.strip.split("|")
      expect(version).to eq(Pgbus::Hub::VERSION)
      expect(feature).to start_with(home)
      expect(back).to eq({ "t" => "sub", "q" => "chat" }.inspect)
    end
  end
end
