# frozen_string_literal: true

require "io/wait"
require "socket"
require "tmpdir"
require_relative "support/database"
require_relative "support/native_wait"

# Every blocking native call has an unblock function: Thread#kill (and
# Thread#raise, Timeout) ends a wait in connect, ensure_listening or stop at
# once instead of after its budget (here 20-30 s), and the object stays usable.
# Each kill waits until the thread is inside the native wait, and must end it
# about as promptly as Ruby's own blocking read (support/native_wait.rb).
RSpec.describe "interrupting a native wait" do
  def expect_prompt_kill(thread, name)
    seconds, bound = NativeWait.kill_inside(thread, name)
    expect(seconds).to be < bound
  end

  def open_fds = Dir.children("/proc/self/fd").size

  # Native threads by name (the kernel's 15-byte comm); one that ends while listed is not counted.
  def native_threads(name)
    Dir.children("/proc/self/task").count do |task|
      File.read("/proc/self/task/#{task}/comm").chomp == name
    rescue Errno::ENOENT, Errno::ESRCH
      false
    end
  end

  # Connections the kernel queues for `server` until it accepts them: with
  # listen(0) Linux holds one; a non-blocking connect says when it is full.
  def fill_backlog(server, path)
    server.listen(0)
    fillers = []
    loop do
      socket = Socket.new(:UNIX, :STREAM)
      socket.connect_nonblock(Socket.sockaddr_un(path))
      fillers << socket
    rescue Errno::EAGAIN # full (Linux says EAGAIN, not EINPROGRESS, for Unix sockets)
      socket.close
      return fillers
    end
  end

  def hub_client(path) = Pgbus::Hub::HubClient.new(socket_path: path, dispatch_queue: Queue.new, ack_timeout: 30)

  def next_sub(peer)
    loop do
      frame = Pgbus::Hub::Protocol.read_frame(peer)
      return frame["q"] if frame["t"] == "sub"
    end
  end

  def ack(peer, queue) = peer.write(Pgbus::Hub::Protocol.encode({ "t" => "ack", "q" => queue }))

  # A hub that reads only when the test does, and a queue name larger than any socket buffer:
  # a sub's write blocks part-way through its frame.
  def with_deaf_hub
    Dir.mktmpdir("pgbus-hub-interrupt") do |dir|
      path = File.join(dir, "deaf.sock")
      server = UNIXServer.new(path)
      client = hub_client(path).connect
      peer = server.accept
      yield client, peer, "q" * 3_000_000
      client.stop
      peer.close
      server.close
    end
  end

  # `waiter` (an ensure_listening of `queue`) sent its sub frame whole, and once: the peer
  # decodes it, its ack answers the waiter, and the next frame is an unsub sent after it.
  def expect_one_whole_sub(client, peer, queue, waiter)
    expect(next_sub(peer)).to eq(queue)
    ack(peer, queue)
    expect(waiter.join(5)&.value).to eq(:done)
    client.remove_listening("marker")
    expect(Pgbus::Hub::Protocol.read_frame(peer)).to eq({ "t" => "unsub", "q" => "marker" })
    expect(client).not_to be_dead
  end

  it "HubClient#connect to a hub whose listen backlog is full; nothing stays open, connect works later" do
    Dir.mktmpdir("pgbus-hub-interrupt") do |dir|
      path = File.join(dir, "full.sock")
      server = UNIXServer.new(path)
      fillers = fill_backlog(server, path)
      client = hub_client(path)
      fds = open_fds
      connecting = Thread.new { client.connect }
      expect_prompt_kill(connecting, "connect")
      expect(open_fds).to eq(fds)
      expect(client).to be_dead
      expect(client.threads).to be_empty

      fillers.size.times { server.accept.close } # the hub catches up
      client.connect
      expect(client).not_to be_dead
      client.stop
      fillers.each(&:close)
      server.close
    end
  end

  it "HubClient#ensure_listening against a hub that never acks; the waiter is gone, the client usable" do
    Dir.mktmpdir("pgbus-hub-interrupt") do |dir|
      path = File.join(dir, "silent.sock")
      server = UNIXServer.new(path) # acks only what the test tells it to
      client = hub_client(path).connect
      peer = server.accept
      waiter = Thread.new { client.ensure_listening("q") }
      expect_prompt_kill(waiter, "ensure_listening")
      expect(next_sub(peer)).to eq("q")

      # One ack for "q" releases the next call: the killed waiter, older,
      # would have taken it had it stayed registered.
      again = Thread.new { client.ensure_listening("q") }
      expect(next_sub(peer)).to eq("q")
      ack(peer, "q")
      expect(again.join(5)&.value).to eq(:done)
      expect(client).not_to be_dead
      client.stop
      peer.close
      server.close
    end
  end

  it "HubClient#ensure_listening whose sub frame cannot be written (the hub reads nothing)" do
    with_deaf_hub do |client, peer, queue|
      waiter = Thread.new { client.ensure_listening(queue) }
      expect_prompt_kill(waiter, "ensure_listening")
      # Killed part-way through the frame: its rest waits in the client, sent before any other
      # frame. No fail-over, and the stream stays whole.
      expect(client).not_to be_dead
      # The next ensure_listening of the queue finishes that frame and takes its ack.
      again = Thread.new { client.ensure_listening(queue) }
      expect_one_whole_sub(client, peer, queue, again)
    end
  end

  # Ruby calls a blocked thread's unblock function with nothing pending too (Thread#wakeup does;
  # nogvl.rs says when else): the call resumes and finishes the frame it was writing.
  it "HubClient#ensure_listening woken part-way through its sub frame with nothing pending" do
    with_deaf_hub do |client, peer, queue|
      waiter = Thread.new { client.ensure_listening(queue) }
      NativeWait.await_inside(waiter, "ensure_listening")
      expect(peer.wait_readable(5)).to be_truthy # part of the frame is out, the rest cannot follow
      waiter.wakeup
      # Thread#wakeup marked it running: blocked again means the call resumed.
      NativeWait.await_inside(waiter, "ensure_listening")
      expect(client).not_to be_dead
      expect_one_whole_sub(client, peer, queue, waiter)
    end
  end

  it "Listener#ensure_listening while its database is unreachable" do
    listener = Pgbus::Hub::Listener.new(connection: "host=127.0.0.1 port=1 dbname=none connect_timeout=1",
                                        dispatch_queue: Queue.new, health_check_ms: 20_000).start
    waiter = Thread.new { listener.ensure_listening("never_listened") }
    expect_prompt_kill(waiter, "ensure_listening")
    listener.stop
  end

  describe "Listener#stop while its database has stopped answering" do
    before { skip "no PostgreSQL" unless TestDatabase.available? }

    # Forwards to the test database until `silence!`; then reads nothing more
    # either way: a database that stopped answering on an open connection.
    class SilenceableProxy
      def initialize
        @server = TCPServer.new("127.0.0.1", 0)
        @silent = false
        @sockets = []
        @threads = [Thread.new { serve }]
      end

      def port = @server.addr[1]

      def silence! = @silent = true

      def close
        @threads.each(&:kill).each(&:join)
        (@sockets << @server).each(&:close)
      end

      private

      def serve
        loop do
          client = @server.accept
          database = TestDatabase.server_socket
          @sockets.push(client, database)
          @threads << Thread.new { pipe(client, database) } << Thread.new { pipe(database, client) }
        end
      end

      # Silent: stops reading; both sockets stay open until `close`.
      def pipe(from, to)
        until @silent
          data = from.readpartial(65_536)
          to.write(data) unless @silent
        end
      rescue IOError, SystemCallError
        nil # one side hung up
      end
    end

    it "returns at once; the engine's thread finishes shutting down on its own" do
      proxy = SilenceableProxy.new
      engines = native_threads("pgbus-listen")
      listener = Pgbus::Hub::Listener.new(connection: TestDatabase.keywords(host: "127.0.0.1", port: proxy.port),
                                          dispatch_queue: Queue.new).start
      expect(listener.ensure_listening("silenced")).to eq(:done)
      proxy.silence!
      # Its UNLISTEN and close now wait out their timeouts (~0.4 s).
      stopping = Thread.new { listener.stop }
      expect_prompt_kill(stopping, "stop")
      wait_for("the pump and log threads to end") { listener.threads.empty? }
      listener.stop # a second stop is fine
      wait_for("the engine's thread to end") { native_threads("pgbus-listen") <= engines }
    ensure
      proxy&.close
    end
  end
end
