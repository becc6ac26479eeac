# frozen_string_literal: true

# The macOS gems, built on this Linux (issue 55): bin/cross-darwin builds and
# checks one pgbus_hub.bundle per Ruby minor and CPU from that Ruby's source;
# each gem carries the minors given. Built and Mach-O-checked here, never loaded:
# nothing here runs macOS.
namespace :native do
  # The minors a darwin gem can carry, each from the Ruby source named by
  # PGBUS_HUB_RUBY_SRC_<major>_<minor> (a release tarball extracted, or a git
  # export of its tag).
  DARWIN_MINORS = %w[3.3 3.4 4.0].freeze
  DARWIN_ARCHES = Pgbus::Hub::NATIVE_PLATFORMS.fetch(:darwin).to_h { |platform| [platform[/\A[^-]+/], platform] }

  def darwin_sources
    DARWIN_MINORS.to_h { |minor| [minor, ENV["PGBUS_HUB_RUBY_SRC_#{minor.tr('.', '_')}"].to_s] }
                 .reject { |_, dir| dir.empty? }
  end

  desc "Precompiled gems for arm64-darwin and x86_64-darwin, cross-built here from the Ruby sources named by " \
       "PGBUS_HUB_RUBY_SRC_3_3, _3_4, _4_0 (one pgbus_hub.bundle per minor given; bin/cross-darwin), each bundle " \
       "Mach-O-checked (arch, /usr/lib only, Ruby's binds only, exports, minos, signature): pkg/. Without any: says what to set"
  task :darwin do
    sources = darwin_sources
    if sources.empty?
      puts "native:darwin: skipped, no Ruby source given: set PGBUS_HUB_RUBY_SRC_3_3, PGBUS_HUB_RUBY_SRC_3_4 " \
           "and/or PGBUS_HUB_RUBY_SRC_4_0 to Ruby 3.3 / 3.4 / 4.0 source directories (docs/development.md)"
      next
    end
    sources.each { |minor, dir| raise "PGBUS_HUB_RUBY_SRC_#{minor.tr('.', '_')}=#{dir}: no such directory" unless File.directory?(dir) }
    cache = ENV.fetch("PGBUS_HUB_CACHE") { File.join(Dir.home, ".cache", "pgbus-hub") }
    DARWIN_ARCHES.each do |arch, platform|
      bundles = sources.to_h do |minor, dir|
        target = ENV.fetch("PGBUS_HUB_DARWIN_TARGET") { File.join(cache, "darwin", "target") } + "-#{minor}"
        started = Time.now
        sh({ "PGBUS_HUB_DARWIN_TARGET" => target }, "bin/cross-darwin", arch, minor, dir)
        puts "native:darwin: #{platform} for Ruby #{minor} built and checked in #{(Time.now - started).round} s"
        [minor, File.join(ROOT, "tmp", "darwin", arch, minor, "pgbus_hub.bundle")]
      end
      gem_file = staged_native_gem(platform, bundles)
      puts "#{gem_file}: #{(File.size(gem_file) / 1024.0 / 1024).round(1)} MB, Ruby #{bundles.keys.join(', ')}"
    end
    missing = DARWIN_MINORS - sources.keys
    puts "native:darwin: built without Ruby #{missing.join(', ')} (no PGBUS_HUB_RUBY_SRC_* for it)" unless missing.empty?
  end
end

namespace :cross do
  desc "No Ruby needed: the core's test executables compiled and linked for aarch64/x86_64-apple-darwin with the " \
       "darwin gems' toolchain (cargo zigbuild, ld64.lld-16), each Mach-O checked (CPU, /usr/lib only, no " \
       "flat-namespace bind, minos, arm64 signature): bin/cross-darwin ARCH core. Linked, never run"
  task :darwin_link do
    DARWIN_ARCHES.each_key { |arch| sh "bin/cross-darwin", arch, "core" }
  end
end
