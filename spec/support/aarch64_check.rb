# frozen_string_literal: true

# Run by bin/cross-aarch64 in an arm64 Ruby under qemu-user (tests only): the
# cross-built library loads, a MasterHub and a HubClient come up, a LISTEN is
# acked and a NOTIFY sent by psql reaches the client; stop unlinks the socket.
require "timeout"
require "pgbus/hub"

url = ENV.fetch("PGBUS_HUB_TEST_DATABASE_URL", "postgres://pgbus_hub_test:pgbus-hub@127.0.0.1:5432/pgbus_hub_test")
path = "/tmp/pgbus-hub-aarch64-#{Process.pid}.sock"
channel = "aarch64_check_#{Process.pid}"
hub = Pgbus::Hub::MasterHub.new(connection: url, socket_path: path, channel_prefix: "", channel_suffix: "").start
# Under emulation the hub's first connection takes seconds; until it is up a
# sub is acked at once and LISTENed on connect, so a NOTIFY sent before that is lost.
Timeout.timeout(60) { sleep 0.1 until hub.stats[:listener_healthy] }
wakes = Queue.new
client = Pgbus::Hub::HubClient.new(socket_path: path, dispatch_queue: wakes).connect
listening = client.ensure_listening(channel)
system("psql", url, "-qc", "NOTIFY #{channel}, 'from psql'") or abort "psql failed"
wake = Timeout.timeout(15) { wakes.pop }
workers = hub.stats[:workers]
client.stop
hub.stop
ok = RUBY_PLATFORM.start_with?("aarch64") && listening == :done && wake.payload == "from psql" && workers == 1 &&
     !File.exist?(path)
puts "aarch64 check (#{RUBY_PLATFORM}, Ruby #{RUBY_VERSION}): #{$LOADED_FEATURES.grep(/pgbus_hub\.so/).first}, " \
     "LISTEN #{listening.inspect}, wake #{wake.payload.inspect}, #{workers} worker, socket removed: #{!File.exist?(path)}"
exit(ok ? 0 : 1)
