# frozen_string_literal: true

# The native MasterHub in a process of its own (so its CPU, threads and RSS are
# separable):  ruby -Ilib benchmarks/lib/native_hub_process.rb SOCKET DATABASE_URL [HEALTH_MS] [standby]
# Prints "ready"; stdin "stats" -> one JSON line (MasterHub#stats); EOF/"quit" -> stop, exit.
require "json"
require "logger"
require "pgbus/hub"

path, url, health, standby = ARGV
hub = Pgbus::Hub::MasterHub.new(connection: url, socket_path: path, health_check_ms: Integer(health || 250),
                                standby: standby == "standby", logger: Logger.new($stderr, level: :warn)).start
# Ready once LISTENing: workers subscribe at once, and a sub acked before the hub's first
# connection is up returns nil ("listening after the reconnect").
deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 10
sleep 0.01 until hub.stats[:listener_healthy] || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
$stdout.sync = true
$stdout.puts "ready"
while (line = $stdin.gets)
  case line.strip
  when "stats" then $stdout.puts JSON.generate(hub.stats)
  when "quit" then break
  end
end
hub.stop
exit!(0)
