# frozen_string_literal: true

# `rake soak MINUTES=N` runs this in the trixie chroot (Ruby 3.3, Rails 7.2,
# Puma 6.6, PostgreSQL 17): docs/soak.md.
$LOAD_PATH.unshift File.expand_path("../../../lib", __dir__)
require_relative "runner"

$stdout.sync = true # each fault's line as it happens (rake soak's output is often a file)

data = Soak::Runner.new.run
exit(data[:totals].fetch("pgbus_hub")[:stopped_cleanly] ? 0 : 1)
