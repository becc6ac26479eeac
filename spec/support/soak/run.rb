# frozen_string_literal: true

# `rake soak MINUTES=N` runs this in the trixie chroot (Ruby 3.3, Rails 7.2,
# Puma 6.6, PostgreSQL 17): docs/operations.md, "Soak: a fault a minute".
$LOAD_PATH.unshift File.expand_path("../../../lib", __dir__)
require_relative "runner"

data = Soak::Runner.new.run
exit(data[:totals].fetch("pgbus_hub")[:stopped_cleanly] ? 0 : 1)
