# frozen_string_literal: true

require_relative "support/sidecar_server"

# Phusion Passenger standalone (Debian's package, its builtin engine, 4 processes
# forked from a preloaded app: smart spawning) on a `pgbus-hub serve` sidecar.
RSpec.describe "Passenger on a pgbus-hub serve sidecar", :puma do
  # Passenger 6.0.26 aborts when it cannot read /proc/1/environ, as inside some sandboxes (6.0.17
  # only warns): there it runs in a PID namespace of its own, whose pid 1 is its own process.
  def own_pid_namespace
    File.read("/proc/1/environ", 1)
    []
  rescue SystemCallError
    %w[unshare --pid --fork --kill-child --mount --propagation unchanged --mount-proc]
  end

  def start_server(env)
    app = File.join(@dir, "app")
    FileUtils.mkdir_p(app)
    FileUtils.cp(File.join(ROOT, "spec/support/puma_apps/config.ru"), app)
    log = File.join(@dir, "passenger.log")
    pid = ::Process.spawn(env.merge("TMPDIR" => @dir), *own_pid_namespace, "/usr/bin/passenger", "start", "--engine", "builtin", "--address", "127.0.0.1",
                          "--port", @port.to_s, "--environment", "production", "--min-instances", "4",
                          "--max-pool-size", "4", "--spawn-method", "smart", "--log-file", log,
                          "--pid-file", File.join(@dir, "passenger.pid"), "--instance-registry-dir", @dir,
                          "--disable-security-update-check", "--disable-anonymous-telemetry", "--rackup", "config.ru",
                          chdir: app, pgroup: true, in: File::NULL, out: File::NULL, err: File::NULL)
    [pid, log]
  end

  include_examples "4 worker processes on a pgbus-hub serve sidecar", "passenger", "/usr/bin/passenger"
end
