# frozen_string_literal: true

# One command for a release's gems (issue 55 item 5): the source gem and every
# precompiled one, each checked, then their SHA-256 sums. Needs what each part
# needs: root (the chroots), PostgreSQL (rake packaging's install checks), a
# Ruby 4.0 (PGBUS_HUB_RUBY40) and a darwin Ruby for each of 3.3, 3.4 and 4.0
# (rake native:darwin: a source, or the files bin/cross-darwin export copied from
# a darwin Ruby, as .github/workflows/release.yml gives them). Offline but for
# those, once the chroots, the crates and the tools are cached.
namespace :release do
  desc "The source gem and the 6 platform gems (x86_64/aarch64 -gnu and -musl, arm64/x86_64 darwin), each " \
       "checked (rake packaging, native:aarch64's qemu runs, native:darwin's Mach-O checks), then pkg/SHA256SUMS; " \
       "needs PGBUS_HUB_RUBY40 and, for each of 3.3, 3.4, 4.0, PGBUS_HUB_RUBY_SRC_<minor> or PGBUS_HUB_DARWIN_RUBIES' files"
  task :gems do
    missing = DARWIN_MINORS - darwin_rubies.keys
    unless missing.empty?
      abort "release:gems: the darwin gems need every minor: Ruby #{missing.join(', ')} has neither " \
            "#{missing.map { |minor| "PGBUS_HUB_RUBY_SRC_#{minor.tr('.', '_')}" }.join(', ')} nor files in PGBUS_HUB_DARWIN_RUBIES"
    end
    dirty = IO.popen(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"], &:read)
    abort "release:gems: git status failed in #{ROOT}" unless $?.success?
    abort "release:gems: the checkout has changes; a release is built from a commit:\n#{dirty}" unless dirty.empty?
    abort "release:gems: set PGBUS_HUB_RUBY40 to a Ruby 4.0's bin/ruby (the -gnu gem carries 4.0)" unless ruby40

    rm_f Dir[File.join(PKG, "*.gem")] + [File.join(PKG, "SHA256SUMS")]
    # native:aarch64 first, the order that ran in full (2026-12-08). After packaging it once read
    # PGBUS_HUB_TEST_DATABASE_URL naming packaging's dropped run database (with_run_database now
    # restores it): "timed out after 60s waiting for the hub LISTENing", twice.
    Rake::Task["native:aarch64"].invoke
    Rake::Task[:packaging].invoke # rake gem, rake native (-gnu, musl, darwin), then the install checks
    gems = [File.join(PKG, "pgbus-hub-#{Pgbus::Hub::VERSION}.gem"), *Pgbus::Hub::NATIVE_PLATFORMS.values.flatten.map { |platform| native_gem(platform) }]
    absent = gems.reject { |file| File.exist?(file) }
    abort "release:gems: not built: #{absent.join(', ')}" unless absent.empty?

    require "digest"
    sums = gems.map { |file| "#{Digest::SHA256.file(file).hexdigest}  #{File.basename(file)}\n" }.join
    File.write(File.join(PKG, "SHA256SUMS"), sums)
    puts sums, "release:gems: #{gems.size} gems and pkg/SHA256SUMS"
  end
end
