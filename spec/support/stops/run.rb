# frozen_string_literal: true

# `rake stops N=40` runs this in the trixie chroot (Ruby 3.3, Rails 7.2, Puma 6.6, PostgreSQL 17):
# docs/deploys.md. Exit 1 if a pgbus_hub worker had to be killed by the master.
$LOAD_PATH.unshift File.expand_path("../../../lib", __dir__)
require_relative "runner"

$stdout.sync = true

data = Stops::Runner.new.run
killed = data[:apps].fetch("pgbus_hub", { kinds: {} })[:kinds].values.sum { |k| k[:killed] }
exit(killed.zero? ? 0 : 1)
