# frozen_string_literal: true

# Puma config of `rake stops` (spec/support/stops; tests only): the shape issue 49's app ran, Puma's
# defaults otherwise (worker_shutdown_timeout 30 s). PGBUS_STOPS_PRELOAD=0: no preload_app!, which
# a phased restart (SIGUSR1) needs; the hub's configuration then comes from here, not the app.

# Each process's marks (STATE_DIR/marks-PID: "what CLOCK_REALTIME" lines, the last of a name wins),
# for the harness only. The master's pid survives a hot restart's exec: "config" is this file as a
# (re-exec'd) master reads it, once Ruby and Puma are loaded.
state_dir = ENV.fetch("PGBUS_E2E_STATE_DIR")
mark = lambda do |what|
  File.open(File.join(state_dir, "marks-#{Process.pid}"), "a") { |f| f.puts("#{what} #{Process.clock_gettime(Process::CLOCK_REALTIME)}") }
end
mark.call("config")

workers 4
threads 5, 5
bind "tcp://127.0.0.1:#{ENV.fetch('PGBUS_E2E_PORT')}"
rackup ENV.fetch("PGBUS_E2E_RACKUP")
preload = ENV.fetch("PGBUS_STOPS_PRELOAD", "1") == "1"
preload_app! preload
ENV.fetch("PGBUS_E2E_PLUGINS", "").split(",").each { |name| plugin name.to_sym }

if !preload && ENV["SOAK_CABLE_ADAPTER"] == "pgbus_hub" && ENV["SOAK_PGBUS_SSE"] == "1"
  # The gem's app with real pgbus: pgbus's configuration here (docs/deploys.md), the hub takes it.
  # Rails first: pgbus loaded without it never loads its engine, which the app's workers need.
  require "rails"
  require_relative "../soak/app/config/pgbus_sse"
  require "pgbus/hub"
elsif !preload && ENV["SOAK_CABLE_ADAPTER"] == "pgbus_hub" # the gem's app (plugin :pgbus_hub)
  require "pgbus/hub"
  Pgbus::Hub.configure do |c|
    c.connection = ENV.fetch("DATABASE_URL")
    c.channel_prefix = ""
    c.channel_suffix = ""
  end
end

# A hot restart's steps in the master, for docs/deploys.md's breakdown: the old master's restart
# hooks and the plugin's teardown (the hub's stop), then in the re-exec'd one "config" (above),
# the app preloaded (Puma's before-fork hook), the hub's start before the first fork and every
# worker serving (Puma's booted event: each worker checked in after its server started).
hook = ->(modern, legacy, &block) { public_send(respond_to?(modern) ? modern : legacy, &block) } # Puma 7 renamed them
hook.call(:before_restart, :on_restart) { mark.call("restart_hooks") }
before_fork { mark.call("preloaded") }
hook.call(:after_booted, :on_booted) { mark.call("all_booted") }
if defined?(Pgbus::Hub::Boot) # plugin :pgbus_hub (or this gem's :pgbus_streams) loaded it
  Pgbus::Hub::Boot.singleton_class.prepend(Module.new do
    define_method(:teardown) do |why|
      mark.call("teardown_begin")
      super(why).tap { mark.call("teardown_end") }
    end

    define_method(:before_fork) do
      first = !@stops_marked
      @stops_marked = true
      mark.call("hub_boot_begin") if first
      super().tap { mark.call("hub_boot_end") if first }
    end
  end)
end

# Each worker, for the harness only: SIGWINCH (ignored by default, unused by Puma's workers)
# appends every Ruby thread's backtrace to STATE_DIR/threads-PID.txt; "marks-PID" records when
# the worker's server had stopped (Puma's worker-shutdown hook runs once its thread pool is
# joined) and when the at_exit handlers began (one registered at boot runs after those
# registered later, before those of the preloaded app).
hook.call(:before_worker_boot, :on_worker_boot) do
  Signal.trap("WINCH") do
    dump = Thread.list.map do |t|
      "--- #{t.inspect} status=#{t.status.inspect}\n#{(t.backtrace || []).join("\n")}\n"
    end
    # Every open Ruby IO by descriptor, with what /proc says the descriptor is now (a descriptor
    # closed under Ruby's feet shows another file, or none), and Puma's pipes by role.
    ios = ObjectSpace.each_object(IO).filter_map do |io|
      fd = io.fileno
      target = File.readlink("/proc/self/fd/#{fd}") rescue "(closed)" # rubocop:disable Style/RescueModifier
      "fd #{fd} -> #{target}: #{io.inspect}"
    rescue IOError
      nil
    end
    roles = ObjectSpace.each_object(Puma::Server).flat_map do |server|
      %i[@check @notify].map { |ivar| "Puma::Server#{ivar} fd #{server.instance_variable_get(ivar)&.fileno rescue 'closed'}" } # rubocop:disable Style/RescueModifier
    end
    roles += ObjectSpace.each_object(Puma::Cluster::Worker).map do |worker|
      "Puma::Cluster::Worker@check_pipe fd #{worker.instance_variable_get(:@check_pipe)&.fileno rescue 'closed'}" # rubocop:disable Style/RescueModifier
    end
    fds = Dir.children("/proc/self/fd").map(&:to_i).sort.map { |fd| "#{fd} -> #{File.readlink("/proc/self/fd/#{fd}") rescue '?'}" } # rubocop:disable Style/RescueModifier
    File.open(File.join(state_dir, "threads-#{Process.pid}.txt"), "a") do |f|
      f.puts "=== #{Time.now.utc} #{Thread.list.size} threads", *dump, "--- Ruby IOs", *ios.sort, "--- Puma's pipes", *roles,
             "--- descriptors", *fds
    end
  end
  at_exit { mark.call("at_exit") }
  mark.call("booted")
  Thread.new do # Puma's server pipe as its server runs (it is made right after this hook)
    sleep 2
    ObjectSpace.each_object(Puma::Server) do |server|
      mark.call("server_pipe_#{server.instance_variable_get(:@check)&.fileno}_#{server.instance_variable_get(:@notify)&.fileno}")
    end
  end
end
hook.call(:before_worker_shutdown, :on_worker_shutdown) { mark.call("server_stopped") }
