# frozen_string_literal: true

# A master hub in its own process, for specs that kill or stop it:
#   ruby -Ilib spec/support/run_hub.rb SOCKET_PATH DATABASE_URL
# Prints "ready" once serving; SIGTERM stops it cleanly.
require "pgbus/hub"
require "logger"

socket_path, url = ARGV
hub = Pgbus::Hub::MasterHub.new(connection: url, socket_path: socket_path, health_check_ms: 100,
                                status_interval: 0.2, logger: Logger.new($stderr, level: :warn)).start
stop = Queue.new
Signal.trap("TERM") { stop << true }
$stdout.puts "ready"
$stdout.flush
stop.pop
hub.stop
