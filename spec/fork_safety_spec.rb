# frozen_string_literal: true

require "securerandom"
require "timeout"
require "tmpdir"
require_relative "support/database"

# pgbus issues #437/#440: a forked child's GC closed the parent's LISTEN
# connection over the socket it had inherited. Here a parent holds a started
# native object (the hub, or a per-process Listener) plus a client, forks
# children that drop every inherited gem object, collect garbage (and compact)
# and end every way a worker ends: `exit` (at_exit runs), `exit!`, SIGTERM and
# SIGKILL from the parent. One more child exits with everything still
# referenced. Afterwards the parent's connection is the same backend, never
# reconnected, and everything still serves.
RSpec.describe "Fork safety" do # rubocop:disable RSpec/DescribeClass
  before { skip "no PostgreSQL" unless TestDatabase.available? }

  around do |example|
    Dir.mktmpdir("pgbus-hub-fork") do |dir|
      @dir = dir
      @tag = "#{::Process.pid}_#{SecureRandom.hex(3)}"
      @objects = {}
      example.run
    ensure
      @children&.each_key { |pid| reap(pid, :KILL) }
      @later&.reverse_each(&:call)
    end
  end

  ENDINGS = %i[exit exit! sigterm sigkill].freeze

  def later(&block) = (@later ||= []) << block

  # This example's own census tag: only its own backends are counted.
  def application_name = "pgbus-fork-#{@tag}"

  def connection = TestDatabase.keywords(application_name: application_name)

  def channel(name) = "fork_#{name}_#{@tag}"

  # Backend pids tagged with this example's application_name, in this database only.
  def backends
    TestDatabase.with do |conn|
      conn.exec_params("select pid from pg_stat_activity where application_name = $1 " \
                       "and datname = current_database() order by pid", [application_name]).column_values(0).map(&:to_i)
    end
  end

  # The gem objects the parent holds live in @objects only (no local or block
  # keeps one): a dropping child clears it and nothing of ours references them.
  def hub = @objects[:hub]
  def client = @objects[:client]
  def listener = @objects[:listener]

  def pop(queue, timeout: 5) = Timeout.timeout(timeout) { queue.pop }

  def reap(pid, signal = nil)
    ::Process.kill(signal, pid) if signal
    ::Process.wait2(pid).last
  rescue Errno::ESRCH, Errno::ECHILD
    nil
  end

  # Forks one child per ending (twice over) plus one that exits holding
  # everything. Dropping children clear @objects (the only
  # place the example keeps gem objects), collect and compact, then report
  # how many of each class survived and how they end.
  def fork_children
    classes = @objects.values.map(&:class).uniq
    # The harness's own pg connection would be finished by the children (the
    # pg gem's free sends Terminate: the very bug of #437 in another gem).
    TestDatabase.with(&:close)
    @children = {}
    (ENDINGS * 2).each { |ending| spawn_child(classes, ending, drop: true) }
    spawn_child(classes, :exit, drop: false)
    @children.map do |pid, (ending, reader, dropped)|
      report = Timeout.timeout(30) { reader.gets.to_s.strip }
      signal = { sigterm: :TERM, sigkill: :KILL }[ending]
      ::Process.kill(signal, pid) if signal
      status = Timeout.timeout(30) { ::Process.wait2(pid).last }
      reader.close
      { ending: ending, dropped: dropped, report: report, status: status }
    ensure
      @children.delete(pid)
    end
  end

  def spawn_child(classes, ending, drop:)
    reader, writer = IO.pipe
    pid = fork do
      reader.close
      if drop
        @objects.clear
        3.times { GC.start(full_mark: true, immediate_sweep: true) }
        GC.compact if GC.respond_to?(:compact)
        GC.start
      end
      left = classes.map { |klass| "#{klass.name.split('::').last}=#{ObjectSpace.each_object(klass).count}" }
      writer.puts("ready #{left.join(' ')}")
      writer.flush
      at_exit { GC.start } # at_exit runs in the child (`exit`, SIGTERM): collect once more there
      case ending
      when :exit then exit(0)
      when :exit! then exit!(0)
      else sleep # SIGTERM / SIGKILL from the parent
      end
    end
    writer.close
    @children[pid] = [ending, reader, drop]
  end

  def expect_every_ending(children)
    endings = children.map do |child|
      status = child[:status]
      expect(child[:report]).to start_with("ready"), "child #{child[:ending]}: #{child[:report].inspect}"
      case child[:ending]
      when :exit, :exit! then expect(status.exitstatus).to eq(0), "#{child[:ending]}: #{status.inspect}"
      when :sigterm then expect(status.termsig).to eq(Signal.list["TERM"]), status.inspect
      when :sigkill then expect(status.termsig).to eq(Signal.list["KILL"]), status.inspect
      end
      [child[:ending], child[:dropped]]
    end
    expect(endings.tally).to eq([:exit, true] => 2, [:exit!, true] => 2, [:sigterm, true] => 2,
                                [:sigkill, true] => 2, [:exit, false] => 1)
    children.each { |child| puts "    child #{child[:ending]}#{child[:dropped] ? '' : ' (holding)'}: #{child[:report]}" }
  end

  it "a parent's started MasterHub survives children that drop, collect and exit every way" do
    @objects[:hub] = Pgbus::Hub::MasterHub.new(connection: connection, socket_path: File.join(@dir, "hub.sock"),
                                              health_check_ms: 100, status_interval: 0.2).start
    later { @objects[:hub]&.stop }
    wait_for("hub healthy") { hub.stats[:listener_healthy] && hub.stats[:backend_pid] }
    # A client in the parent too: the children inherit its socket as well.
    wakes = Queue.new
    @objects[:client] = Pgbus::Hub::FailoverListener.new(socket_path: hub.socket_path, connection: connection,
                                                        dispatch_queue: wakes).start
    later { @objects[:client]&.stop }
    expect(client.ensure_listening(channel("before"))).to eq(:done)
    backend = hub.stats[:backend_pid]
    expect(backends).to eq([backend])

    children = fork_children
    expect_every_ending(children)

    # Give a severed connection time to show: health checks every 100 ms.
    sleep 1
    stats = hub.stats
    puts "    hub backend before #{backend}, after #{stats[:backend_pid]}; pg_stat_activity #{backends.inspect}; " \
         "reconnects #{stats[:reconnects]}"
    expect(stats).to include(backend_pid: backend, reconnects: 0, listener_healthy: true)
    expect(backends).to eq([backend])
    expect(File.socket?(hub.socket_path)).to be(true)
    expect(hub).to be_running

    # The parent's own client still served by the hub, on its old subscription.
    expect(client.failed_over?).to be(false)
    TestDatabase.notify(channel("before"), "still")
    expect(pop(wakes)).to have_attributes(queue_name: channel("before"), payload: "still")

    # New clients of both kinds subscribe (acked) and are woken.
    fresh_wakes = Queue.new
    fresh = Pgbus::Hub::FailoverListener.new(socket_path: hub.socket_path, connection: connection,
                                             dispatch_queue: fresh_wakes).start
    later { fresh.stop }
    expect(fresh.ensure_listening(channel("after"))).to eq(:done)
    expect(fresh.failed_over?).to be(false)
    raw_wakes = Queue.new
    raw = Pgbus::Hub::HubClient.new(socket_path: hub.socket_path, dispatch_queue: raw_wakes).connect
    later { raw.stop }
    expect(raw.ensure_listening(channel("after"))).to eq(:done)
    TestDatabase.notify(channel("after"), "fresh")
    expect(pop(fresh_wakes)).to have_attributes(queue_name: channel("after"), payload: "fresh")
    expect(pop(raw_wakes)).to have_attributes(queue_name: channel("after"), payload: "fresh")
    expect(hub.stats).to include(backend_pid: backend, reconnects: 0)
    expect(backends).to eq([backend]) # the clients LISTEN through the hub: no connection of their own
  end

  it "a parent's started per-process Listener survives children that drop, collect and exit every way" do
    wakes = Queue.new
    @objects[:listener] = Pgbus::Hub::Listener.new(connection: connection, dispatch_queue: wakes,
                                                  health_check_ms: 100).start
    later { @objects[:listener]&.stop }
    expect(listener.ensure_listening(channel("before"))).to eq(:done)
    backend = listener.stats[:backend_pid]
    expect(backend).to be_a(Integer)
    expect(backends).to eq([backend])

    children = fork_children
    expect_every_ending(children)

    sleep 1 # health checks every 100 ms: a severed connection would have shown
    stats = listener.stats
    puts "    listener backend before #{backend}, after #{stats[:backend_pid]}; pg_stat_activity " \
         "#{backends.inspect}; reconnects #{stats[:reconnects]}"
    expect(stats).to include(backend_pid: backend, reconnects: 0, healthy: true)
    expect(backends).to eq([backend])

    TestDatabase.notify(channel("before"), "still")
    expect(pop(wakes)).to have_attributes(queue_name: channel("before"), payload: "still")
    expect(listener.ensure_listening(channel("after"))).to eq(:done)
    TestDatabase.notify(channel("after"), "fresh")
    expect(pop(wakes)).to have_attributes(queue_name: channel("after"), payload: "fresh")

    # A new listener in the parent gets a connection of its own and is woken.
    fresh_wakes = Queue.new
    fresh = Pgbus::Hub::Listener.new(connection: connection, dispatch_queue: fresh_wakes).start
    later { fresh.stop }
    expect(fresh.ensure_listening(channel("after"))).to eq(:done)
    TestDatabase.notify(channel("after"), "both")
    expect(pop(fresh_wakes)).to have_attributes(payload: "both")
    expect(pop(wakes)).to have_attributes(payload: "both")
    expect(listener.stats).to include(backend_pid: backend, reconnects: 0)
    expect(backends.size).to eq(2)
    expect(backends).to include(backend)
  end

  # Issue 41, item 0: an abandoned connection survives in the workers. Every
  # child holds a copy of the owner's PostgreSQL socket; when the owner gives
  # its connection up while the server is still there (here: its backend
  # stopped for 3 s, so the health check times out), closing its own
  # descriptor ends nothing. The owner shuts the socket down (shutdown(2)):
  # the old backend ends and the notification queue drains.
  context "when the owner abandons its connection while children hold copies of its socket" do
    before do
      skip "needs root to SIGSTOP a local backend" unless ::Process.euid.zero?
    end

    def local_backend?(pid) = (File.read("/proc/#{pid}/comm").strip == "postgres" rescue false) # rubocop:disable Style/RescueModifier

    def queue_usage = TestDatabase.with { |conn| conn.exec("select pg_notification_queue_usage()").getvalue(0, 0).to_f }

    def holders(count)
      TestDatabase.with(&:close) # not inherited (see fork_children)
      Array.new(count) { fork { sleep } }.tap { |pids| later { pids.each { |pid| reap(pid, :KILL) } } }
    end

    def stall_and_flood(old_backend, now_backend, queue)
      ::Process.kill(:STOP, old_backend)
      begin
        wait_for("a new backend after the health check gave up", timeout: 15) do
          now_backend.call.then { |pid| pid if pid && pid != old_backend }
        end
        sleep 3 - 2.2 # a 3 s stall in all (the probe waits 2 s)
      ensure
        ::Process.kill(:CONT, old_backend)
      end
      payload = "x" * 7000
      TestDatabase.with do |conn|
        3000.times { conn.exec_params("select pg_notify($1, $2)", ["pgmq.q_#{queue}.INSERT", payload]) }
      end
      usage_after_flood = queue_usage
      started = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)
      gone = wait_for(nil, timeout: 10, interval: 0.05) { !backends.include?(old_backend) }
      drained = wait_for(nil, timeout: 10, interval: 0.05) { queue_usage.zero? }
      seconds = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) - started
      puts "    old backend #{old_backend} #{gone ? 'gone' : 'STILL THERE'}; pg_stat_activity #{backends.inspect}; " \
           "queue usage after the NOTIFYs #{usage_after_flood}, #{format('%.2f', seconds)} s later #{queue_usage}"
      expect(gone).to be(true), "backend #{old_backend} still in pg_stat_activity"
      expect(drained).to be(true), "pg_notification_queue_usage() stuck at #{queue_usage}"
    end

    # 4 children hold copies of the owner's socket (its stats come from the block).
    def abandon_with_copies(queue, &stats)
      old = stats.call[:backend_pid]
      skip "the backend is not a local process we may signal" unless local_backend?(old)
      puts "    queue usage before #{queue_usage}"
      holders(4)
      stall_and_flood(old, -> { stats.call[:backend_pid] }, queue)
      expect(stats.call[:reconnects]).to eq(1)
    end

    it "the MasterHub severs it: the old backend ends and the queue drains" do
      @objects[:hub] = Pgbus::Hub::MasterHub.new(connection: connection, socket_path: File.join(@dir, "hub.sock"),
                                                 health_check_ms: 100, status_interval: 0.2).start
      later { @objects[:hub]&.stop }
      peer = WirePeer.new(hub.socket_path)
      later { peer.close }
      peer.subscribe(channel("flood"))
      abandon_with_copies(channel("flood")) { hub.stats }
    end

    it "a per-process Listener severs it too" do
      @objects[:listener] = Pgbus::Hub::Listener.new(connection: connection, dispatch_queue: Queue.new,
                                                     health_check_ms: 100).start
      later { @objects[:listener]&.stop }
      expect(listener.ensure_listening(channel("flood"))).to eq(:done)
      abandon_with_copies(channel("flood")) { listener.stats }
    end
  end
end
