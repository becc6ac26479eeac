# frozen_string_literal: true

# The master hub as its own process, for the reliability suite:
#   ruby -Ilib spec/reliability/support/hub_runner.rb '{"connection":...,"socket_path":...}'
# Prints "ready"; then answers stdin lines: "stats" -> one JSON line, "stop" -> stops and exits.
# Its log goes to stderr.
require "pgbus/hub"
require "json"
require "logger"

options = JSON.parse(ARGV.fetch(0), symbolize_names: true)
$stdout.sync = true
begin
  hub = Pgbus::Hub::MasterHub.new(**options, logger: Logger.new($stderr, level: :info)).start
rescue StandardError => e
  puts "error #{e.class}: #{e.message}"
  exit 1
end
puts "ready"
while (line = $stdin.gets)
  case line.strip
  when "stats"
    stats = hub.stats.transform_values { |v| v.is_a?(Numeric) || v.nil? || v == true || v == false ? v : v.to_s }
    puts JSON.generate(stats)
  when "stop"
    break
  end
end
hub.stop
