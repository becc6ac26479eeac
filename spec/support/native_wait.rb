# frozen_string_literal: true

require_relative "database" # wait_for

# Killing a thread that waits in native code: first proved to be inside the
# wait (a probe, not a sleep), then timed against the same kill of a thread
# blocked in Ruby's own IO#read, which is the machine's slack at that moment.
module NativeWait
  module_function

  def now = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC)

  # Returns once `thread` is blocked inside the native method `name`: CRuby
  # reports "sleep" for a thread that released the GVL to wait, and the
  # method is then the top frame of its stack (labels: "connect" on 3.3,
  # "Pgbus::Hub::HubClient#connect" on 3.4).
  def await_inside(thread, name)
    seen = nil
    wait_for("#{name} to block in native code", detail: -> { "last seen: #{seen.inspect}" }) do
      raise "#{name}: the thread ended instead (#{thread_outcome(thread)})" unless thread.alive?

      seen = [thread.status, thread.backtrace_locations&.first(2)&.map(&:to_s)]
      thread.status == "sleep" && thread.backtrace_locations&.first&.label.to_s.split(/[#.]/).last == name
    end
  end

  def thread_outcome(thread)
    "returned #{thread.value.inspect}"
  rescue Exception => e # rubocop:disable Lint/RescueException
    "raised #{e.class}: #{e.message}"
  end

  # Seconds from Thread#kill until the thread has ended.
  def kill_seconds(thread)
    t0 = now
    thread.kill
    raise "#{thread.inspect} still alive 5 s after kill" unless thread.join(5)

    now - t0
  end

  # The reference: a thread blocked in IO#read on a pipe nobody writes to.
  def reference_kill_seconds
    reader, writer = IO.pipe
    blocked = Thread.new { reader.read(1) }
    await_inside(blocked, "read")
    kill_seconds(blocked)
  ensure
    [reader, writer].each(&:close)
  end

  # Kills `thread` once it is inside `name`; returns [seconds it took,
  # the bound]: 10 times the reference measured just before, plus 25 ms.
  def kill_inside(thread, name)
    await_inside(thread, name)
    bound = 0.025 + (10 * reference_kill_seconds)
    [kill_seconds(thread), bound]
  end
end
