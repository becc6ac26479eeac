# frozen_string_literal: true

require_relative "support/sidecar_server"

# Unicorn (Debian's package, 4 workers, preload_app) on a `pgbus-hub serve` sidecar.
RSpec.describe "Unicorn on a pgbus-hub serve sidecar", :puma do
  def start_server(env)
    log = File.join(@dir, "unicorn.log")
    File.write(File.join(@dir, "unicorn.rb"), <<~RUBY)
      worker_processes 4
      listen "127.0.0.1:#{@port}"
      preload_app true
      timeout 60
      stderr_path #{log.inspect}
      stdout_path #{log.inspect}
    RUBY
    pid = ::Process.spawn(env, "/usr/bin/unicorn", "-c", File.join(@dir, "unicorn.rb"), File.join(ROOT, "spec/support/puma_apps/config.ru"),
                          chdir: @dir, pgroup: true, in: File::NULL, out: File::NULL, err: File::NULL)
    [pid, log]
  end

  include_examples "4 worker processes on a pgbus-hub serve sidecar", "unicorn", "/usr/bin/unicorn"
end
