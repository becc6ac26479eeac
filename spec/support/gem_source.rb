# frozen_string_literal: true

require "rubygems/package"
require "zlib"
require "fileutils"

# A gem source in RubyGems' full-index format, what `gem install --clear-sources
# --source file://DIR/ pgbus-hub` reads: `gems` ([[Gem::Specification, its .gem file], ...])
# listed in that order (a RubyGems that lets two gems onto one host installs the one
# listed last). Each is listed under the platform its file name says, as a gem server
# on a current RubyGems lists it: the host's RubyGems 3.3.15 reads "x86_64-linux-gnu"
# in a gem file as "x86_64-linux".
module GemSource
  def self.write(dir, gems)
    FileUtils.mkdir_p([File.join(dir, "gems"), File.join(dir, "quick", "Marshal.4.8")])
    index = gems.map do |spec, file|
      platform = File.basename(file, ".gem").delete_prefix("#{spec.name}-#{spec.version}").delete_prefix("-")
      spec.platform = platform.empty? ? Gem::Platform::RUBY : Gem::Platform.new(platform.split("-", 3))
      FileUtils.cp(file, File.join(dir, "gems", "#{spec.full_name}.gem"))
      File.binwrite(File.join(dir, "quick", "Marshal.4.8", "#{spec.full_name}.gemspec.rz"), Gem.deflate(Marshal.dump(spec)))
      [spec.name, spec.version, spec.platform.to_s]
    end
    { "specs" => index, "latest_specs" => index, "prerelease_specs" => [] }.each do |name, tuples|
      Zlib::GzipWriter.open(File.join(dir, "#{name}.4.8.gz")) { |gz| gz.write(Marshal.dump(tuples)) }
    end
    "file://#{dir}/"
  end
end
