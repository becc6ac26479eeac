# frozen_string_literal: true

# Loaded by rake from rakelib/ (the Rakefile stays as it is).
desc "Stops (issue 49, docs/deploys.md): graceful TERM, hot (USR2) and phased (USR1) restarts of a 4-worker Puma " \
     "serving the soak's Rails app with clients attached, pgbus_hub beside Rails' postgresql adapter, in the trixie " \
     "chroot. N=40 (cycles), KINDS=term,usr2,usr1, RATE=10 (msg/s), CLIENTS=16, APPS=pgbus_hub,postgresql (the gem's app, the control; both at once by default), CONTROL=0 (APPS=pgbus_hub), REPORT=file.json, " \
     "DUMPS=dir (default tmp/stops-STAMP: dumps of workers alive 5 s after their stop); SHORT=1: the short form (RSpec); " \
     "PGBUS_HUB_PUMA_DIR=dir: run a Puma checkout instead of the chroot's Puma 6.6 (its C extension built for the chroot's Ruby)"
task :stops do
  env = { "N" => "N", "KINDS" => "KINDS", "RATE" => "RATE", "CLIENTS" => "CLIENTS", "CONTROL" => "CONTROL", "APPS" => "APPS",
          "REPORT" => "REPORT", "DUMPS" => "DUMPS" }
        .filter_map { |name, from| "PGBUS_STOPS_#{name}=#{ENV[from]}" if ENV[from] }
  # A Puma checkout outside this one (e.g. Puma's main branch) must be seen inside the chroot; the
  # variable itself passes in (PGBUS_*) and spec/support/stops/cluster.rb runs that Puma.
  puma_dir = ENV["PGBUS_HUB_PUMA_DIR"].to_s
  ENV["PGBUS_HUB_CHROOT_BIND"] = [ENV["PGBUS_HUB_CHROOT_BIND"], File.expand_path(puma_dir)].compact.join(" ") unless puma_dir.empty?
  sh "bin/trixie", "rake", "compile"
  command = ENV["SHORT"] == "1" ? %w[rspec spec/stops_spec.rb] : %w[ruby spec/support/stops/run.rb]
  sh "bin/trixie", "env", "PGBUS_HUB_STOPS=1", *env, *command
end
