# frozen_string_literal: true

require "open3"
require "rbconfig"
require_relative "support/database"

# A hub setting changed while the master hub runs is not taken silently: the master logs an
# error naming it. (A socket_path or listen scope set in the app before the first fork is taken:
# spec/serve_spec.rb and spec/puma_modes_spec.rb, in real Puma clusters.)
RSpec.describe "settings made after the master hub started" do
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  # In a child: Boot armed as Puma's master arms it, the hub started as before a fork, then settings.
  SCRIPT = <<~RUBY
    require "pgbus/hub"
    require "logger"
    require "stringio"
    log = StringIO.new
    Pgbus::Hub.configure { |c| c.connection = ARGV[0]; c.socket_path = File.join(ARGV[1], "hub.sock") }
    Pgbus::Hub::Boot.arm(logger: Logger.new(log))
    Pgbus::Hub::Boot.before_fork
    running = Pgbus::Hub::SharedHub.current&.running?
    Pgbus::Hub.configure { |c| c.status_interval = 2.0; c.logger = Logger.new(File::NULL) }
    Pgbus::Hub::SharedHub.stop
    Pgbus::Hub.configure { |c| c.hard_queue_limit = 2048 } # no hub runs: taken at its next start
    puts running, log.string.lines.grep(/ERROR/).join
  RUBY

  it "logs one error naming each setting changed while it runs; none for the workers' logger or once it stopped" do
    Dir.mktmpdir("pgbus-late") do |dir|
      out, err, status = Open3.capture3(RbConfig.ruby, "-I", File.join(ROOT, "lib"), "-e", SCRIPT, TestDatabase.url, dir)
      expect(status).to be_success, err
      running, *errors = out.lines
      expect(running.strip).to eq("true")
      expect(errors.size).to eq(1), errors.join
      expect(errors.first).to include("Pgbus::Hub.configure: status_interval changed while the master hub runs at " \
                                      "#{File.join(dir, 'hub.sock')}: ignored until it restarts")
    end
  end
end
