# frozen_string_literal: true

# The suite's one poll-until helper. Yields every `interval` seconds until the
# block returns something truthy, and returns that. After `timeout` seconds it
# raises naming `what` (with `detail.call` appended, e.g. a log's tail), or,
# when `what` is nil, returns nil: the caller has a fallback (say, SIGKILL
# after a grace period).
def wait_for(what, timeout: 10, interval: 0.01, detail: nil)
  deadline = ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) + timeout
  loop do
    value = yield
    return value if value
    if ::Process.clock_gettime(::Process::CLOCK_MONOTONIC) > deadline
      return nil if what.nil?

      raise ["timed out after #{timeout}s waiting for #{what}", detail&.call].compact.join("\n")
    end

    sleep interval
  end
end
