# frozen_string_literal: true

# The macOS gems, built on this Linux (issue 55): bin/cross-darwin builds and
# checks one pgbus_hub.bundle per Ruby minor and CPU, from that Ruby's source or
# from a darwin Ruby's own rbconfig.rb and headers; each gem carries the minors
# given. Built and Mach-O-checked here, never loaded: nothing here runs macOS.
namespace :native do
  DARWIN_MINORS = %w[3.3 3.4 4.0].freeze
  DARWIN_ARCHES = Pgbus::Hub::NATIVE_PLATFORMS.fetch(:darwin).to_h { |platform| [platform[/\A[^-]+/], platform] }

  # { minor => { arch => bin/cross-darwin's RUBY } } for each minor given, in one of
  # two forms: PGBUS_HUB_RUBY_SRC_<major>_<minor>, that Ruby's source (a release
  # tarball extracted, or a git export of its tag; both arches), or
  # PGBUS_HUB_DARWIN_RUBIES, a directory of `bin/cross-darwin export`'s
  # <arch>/<minor>/ trees (what the hosted workflows' macOS jobs upload). Both gems
  # carry the same minors, so an exported minor needs both arches.
  def darwin_rubies
    exported = ENV["PGBUS_HUB_DARWIN_RUBIES"].to_s
    raise "PGBUS_HUB_DARWIN_RUBIES=#{exported}: no such directory" unless exported.empty? || File.directory?(exported)

    DARWIN_MINORS.to_h do |minor|
      source_key = "PGBUS_HUB_RUBY_SRC_#{minor.tr('.', '_')}"
      source = ENV[source_key].to_s
      raise "#{source_key}=#{source}: no such directory" unless source.empty? || File.directory?(source)

      dirs = DARWIN_ARCHES.keys.to_h { |arch| [arch, File.join(exported, arch, minor)] }
                          .select { |_, dir| !exported.empty? && File.directory?(dir) }
      unless dirs.empty? || dirs.size == DARWIN_ARCHES.size
        raise "PGBUS_HUB_DARWIN_RUBIES has Ruby #{minor} for #{dirs.keys.join} only: both darwin gems carry the same minors"
      end
      raise "Ruby #{minor} given twice (#{source_key} and PGBUS_HUB_DARWIN_RUBIES): give one" unless source.empty? || dirs.empty?

      [minor, source.empty? ? dirs : DARWIN_ARCHES.keys.to_h { |arch| [arch, source] }]
    end.reject { |_, dirs| dirs.empty? }
  end

  desc "Precompiled gems for arm64-darwin and x86_64-darwin, cross-built here for each Ruby minor given " \
       "(PGBUS_HUB_RUBY_SRC_3_3/_3_4/_4_0: a source; PGBUS_HUB_DARWIN_RUBIES: bin/cross-darwin export's files of " \
       "darwin Rubies), one pgbus_hub.bundle per minor (bin/cross-darwin), each Mach-O-checked (arch, /usr/lib " \
       "only, Ruby's binds only, exports, minos, signature): pkg/. Without any: says what to set"
  task :darwin do
    rubies = darwin_rubies
    if rubies.empty?
      puts "native:darwin: skipped, no darwin Ruby given: set PGBUS_HUB_RUBY_SRC_3_3, PGBUS_HUB_RUBY_SRC_3_4 " \
           "and/or PGBUS_HUB_RUBY_SRC_4_0 to Ruby 3.3 / 3.4 / 4.0 source directories, or PGBUS_HUB_DARWIN_RUBIES " \
           "to a directory of bin/cross-darwin export's files (docs/development.md)"
      next
    end
    cache = ENV.fetch("PGBUS_HUB_CACHE") { File.join(Dir.home, ".cache", "pgbus-hub") }
    DARWIN_ARCHES.each do |arch, platform|
      bundles = rubies.to_h do |minor, dirs|
        target = ENV.fetch("PGBUS_HUB_DARWIN_TARGET") { File.join(cache, "darwin", "target") } + "-#{minor}"
        started = Time.now
        sh({ "PGBUS_HUB_DARWIN_TARGET" => target }, "bin/cross-darwin", arch, minor, dirs.fetch(arch))
        puts "native:darwin: #{platform} for Ruby #{minor} built and checked in #{(Time.now - started).round} s"
        [minor, File.join(ROOT, "tmp", "darwin", arch, minor, "pgbus_hub.bundle")]
      end
      gem_file = staged_native_gem(platform, bundles)
      puts "#{gem_file}: #{(File.size(gem_file) / 1024.0 / 1024).round(1)} MB, Ruby #{bundles.keys.join(', ')}"
    end
    missing = DARWIN_MINORS - rubies.keys
    puts "native:darwin: built without Ruby #{missing.join(', ')} (no source or export given for it)" unless missing.empty?
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
