# frozen_string_literal: true

# A check for Rubies the RSpec suite cannot run on (tests only): Debian's Ruby 3.4
# and a Ruby 4.0 built from source have no `pg` gem here, and bin/cross-aarch64
# runs arm64 Rubies under qemu-user, a musl Ruby has no `pg` either. The library
# loads, a MasterHub and two HubClients come up, each LISTEN on one channel is
# acked, one NOTIFY sent by psql wakes both clients, the census (connections
# counted by psql) is 1, and stop unlinks the socket.
#
#   ruby -I lib spec/support/smoke_check.rb [PLATFORM-PREFIX]   (default: this machine's)
require "timeout"
require "pgbus/hub"
require_relative "wait"

expected_platform = ARGV.fetch(0) { RbConfig::CONFIG["host_cpu"] }
tag = "pgbus_hub_smoke_#{Process.pid}"
url = ENV.fetch("PGBUS_HUB_TEST_DATABASE_URL", "postgres://pgbus_hub_test:pgbus-hub@127.0.0.1:5432/pgbus_hub_test")
tagged = url.include?("://") ? "#{url}#{url.include?('?') ? '&' : '?'}application_name=#{tag}" : "#{url} application_name=#{tag}"
path = "/tmp/#{tag}.sock"
psql = ->(sql) { IO.popen(["psql", url, "-Atqc", sql], &:read).strip }

hub = Pgbus::Hub::MasterHub.new(connection: tagged, socket_path: path, channel_prefix: "", channel_suffix: "").start
# Under emulation the hub's first connection takes seconds; until it is up a
# sub is acked at once and LISTENed on connect, so a NOTIFY sent before that is lost.
wait_for("the hub LISTENing", timeout: 60, interval: 0.1) { hub.stats[:listener_healthy] }
clients = Array.new(2) do
  wakes = Queue.new
  [Pgbus::Hub::HubClient.new(socket_path: path, dispatch_queue: wakes).connect, wakes]
end
listening = clients.map { |client, _| client.ensure_listening(tag) }
psql.call("NOTIFY #{tag}, 'from psql'")
woken = clients.map { |_, wakes| Timeout.timeout(15) { wakes.pop }.payload }
census = psql.call("select count(*) from pg_stat_activity where application_name = '#{tag}'").to_i
workers = hub.stats[:workers]
clients.each { |client, _| client.stop }
hub.stop
ok = RUBY_PLATFORM.start_with?(expected_platform) && listening == %i[done done] && woken == ["from psql"] * 2 &&
     census == 1 && workers == 2 && !File.exist?(path)
puts "smoke check (#{RUBY_PLATFORM}, Ruby #{RUBY_VERSION}): #{$LOADED_FEATURES.grep(/pgbus_hub\.(so|bundle)\z/).first}, " \
     "LISTEN #{listening.inspect}, wakes #{woken.inspect}, census #{census}, #{workers} workers, " \
     "socket removed: #{!File.exist?(path)}"
exit(ok ? 0 : 1)
