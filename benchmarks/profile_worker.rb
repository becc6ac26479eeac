# frozen_string_literal: true

# Profiling helper (not part of rake bench): one worker of MODE under `perf record -g`
# while it receives a 20k x 200 B burst (BYTES=2048 for larger payloads).
#   ruby -Ilib benchmarks/profile_worker.rb [native-hub|ruby-hub|direct|native-listener]
#   perf report -i tmp/bench/prof/MODE.data --no-children --sort dso --stdio -g none
require "fileutils"
load File.expand_path("run.rb", __dir__)
mode = ARGV[0] || "native-hub"
out = File.join(Bench::ROOT, "tmp", "bench", "prof")
FileUtils.mkdir_p(out)
Bench.with_setup(mode, 1, %w[prof]) do |_hub, (worker)|
  Bench.mark([worker], "prof")
  perf = Process.spawn("perf", "record", "-F", "2000", "-g", "-o", File.join(out, "#{mode}.data"),
                       "-p", worker.pid.to_s, err: File::NULL, out: File::NULL)
  sleep 0.5
  Bench.send_burst("prof", 20_000, kind: :ephemeral, bytes: Integer(ENV.fetch("BYTES", "200")))
  result = Bench.collect([worker], 20_000, kind: "all", timeout: 20)
  Process.kill("INT", perf)
  Process.wait(perf)
  p result.first.slice(:n, :cpu_ms, :user_ms, :sys_ms, :ctx_switches)
end
