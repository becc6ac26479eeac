# frozen_string_literal: true

require "socket"
require "tmpdir"

# Every blocking native call has an unblock function: Thread#kill (and
# Thread#raise, Timeout) ends a wait in ensure_listening at once instead of
# after its budget (here 30 s and 21 s).
RSpec.describe "interrupting a native wait" do
  def killed_within(thread)
    sleep 0.3 # in the native wait by now
    t0 = Process.clock_gettime(Process::CLOCK_MONOTONIC)
    thread.kill
    expect(thread.join(5)).not_to be_nil
    Process.clock_gettime(Process::CLOCK_MONOTONIC) - t0
  end

  it "HubClient#ensure_listening against a hub that never acks" do
    Dir.mktmpdir("pgbus-hub-interrupt") do |dir|
      path = File.join(dir, "silent.sock")
      server = UNIXServer.new(path) # accepts, reads nothing, acks nothing
      client = Pgbus::Hub::HubClient.new(socket_path: path, dispatch_queue: Queue.new, ack_timeout: 30).connect
      peer = server.accept
      waiter = Thread.new { client.ensure_listening("never_acked") }
      expect(killed_within(waiter)).to be < 1
      client.stop
      peer.close
      server.close
    end
  end

  it "Listener#ensure_listening while its database is unreachable" do
    listener = Pgbus::Hub::Listener.new(connection: "host=127.0.0.1 port=1 dbname=none connect_timeout=1",
                                        dispatch_queue: Queue.new, health_check_ms: 20_000).start
    waiter = Thread.new { listener.ensure_listening("never_listened") }
    expect(killed_within(waiter)).to be < 1
    listener.stop
  end
end
