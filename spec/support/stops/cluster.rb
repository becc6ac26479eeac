# frozen_string_literal: true

require "open3"
require_relative "../puma_apps/harness"

module Stops
  # A PumaCluster on the stop harness's config (spec/support/stops/puma.rb), with what a stop
  # measurement needs: the stop signal to the master, each old worker's end, and a dump of a
  # worker that outlives its stop.
  class Cluster < PumaCluster
    CONFIG = File.join(__dir__, "puma.rb")
    # PGBUS_HUB_PUMA_DIR: a Puma checkout whose C extension is built (lib/puma/puma_http11.so), run
    # instead of the installed Puma, e.g. Puma's main branch, which carries the stop wedge's fix
    # (puma#3940, docs/deploys.md). Its bin/puma loads no gem, and its lib/ comes first on RUBYLIB,
    # so the workers and a hot restart's re-exec'd master load that Puma too.
    PUMA_DIR = ENV["PGBUS_HUB_PUMA_DIR"].to_s.then { |dir| dir.empty? ? nil : File.expand_path(dir) }
    PUMA = PUMA_DIR ? File.join(PUMA_DIR, "bin", "puma") : PumaCluster::PUMA

    # The Puma at PUMA_DIR has puma#3940's change: its notify_safely writes with syswrite, which
    # never leaves IO#close waiting for a writer in the TERM trap (docs/puma-stop-wedge.md).
    def self.puma_dir_has_fix?
      File.read(File.join(PUMA_DIR, "lib", "puma", "server.rb"))[/def notify_safely.*?\n    end\n/m].to_s.include?("syswrite")
    end

    def environment
      env = super
      return env unless PUMA_DIR

      env.merge("RUBYLIB" => [File.join(PUMA_DIR, "lib"), *env["RUBYLIB"].to_s.split(File::PATH_SEPARATOR)].join(File::PATH_SEPARATOR))
    end

    # PumaCluster#start on this config.
    def start(wait: true)
      @state_dir = Dir.mktmpdir("pgbus-stops")
      @port = free_port
      @log_path = File.join(@state_dir, "puma.log")
      @pid = Process.spawn(environment, RUBY, PUMA, "-C", CONFIG, chdir: @state_dir, pgroup: true,
                                                                 in: File::NULL, out: @log_path, err: %i[child out])
      @socket_to_clean = socket_path
      wait_for("puma to serve /pid", timeout: 30) { get("/pid") } if wait
      self
    end

    # A live process, not a zombie.
    def self.alive?(pid)
      File.read("/proc/#{pid}/stat").split(") ").last.split[0] != "Z"
    rescue Errno::ENOENT, Errno::ESRCH
      false
    end

    # The master reaped (after TERM); true once it exited (PumaCluster#stop then has nothing to do).
    def reaped?
      return true if @pid.nil?

      pid, @exit_status = Process.waitpid2(@pid, Process::WNOHANG)
      @pid = nil if pid
      !pid.nil?
    end

    # When Puma's master logged each phased-restart stop ("- Stopping PID for phased upgrade...").
    def phased_stops = log.scan(/Stopping (\d+) for phased upgrade/).flatten.map(&:to_i)

    def marks(pid)
      File.readlines(File.join(@state_dir, "marks-#{pid}")).to_h { |l| l.split.then { |what, at| [what, Float(at)] } }
    rescue Errno::ENOENT
      {}
    end

    # What a worker still alive LINGER seconds after its stop is doing: its Ruby threads (SIGWINCH,
    # puma.rb), its native threads (/proc: name, state, kernel wait channel) and, with gdb, their
    # native backtraces. Returns the text.
    def dump(pid)
      threads_file = File.join(@state_dir, "threads-#{pid}.txt")
      before = File.exist?(threads_file) ? File.size(threads_file) : 0
      Process.kill("WINCH", pid) rescue nil # rubocop:disable Style/RescueModifier
      ruby = wait_for(nil, timeout: 3) { File.exist?(threads_file) && File.size(threads_file) > before && File.read(threads_file)[before..] }
      tasks = Dir.glob("/proc/#{pid}/task/*").map do |task|
        comm = File.read("#{task}/comm").strip rescue "?" # rubocop:disable Style/RescueModifier
        state = File.read("#{task}/stat").split(") ").last.split[0] rescue "?" # rubocop:disable Style/RescueModifier
        wchan = File.read("#{task}/wchan") rescue "?" # rubocop:disable Style/RescueModifier
        syscall = File.read("#{task}/syscall").strip rescue "?" # rubocop:disable Style/RescueModifier
        "#{File.basename(task)} #{comm.ljust(16)} #{state} #{wchan.ljust(32)} syscall #{syscall}"
      end
      fds = ->(of) { Dir.glob("/proc/#{of}/fd/*").sort_by { |f| File.basename(f).to_i }.map { |f| "#{File.basename(f)} -> #{File.readlink(f) rescue '?'}" } } # rubocop:disable Style/RescueModifier
      native = if system("command -v gdb >/dev/null 2>&1")
                 out, = Open3.capture2e("timeout", "30", "gdb", "-p", pid.to_s, "-batch", "-nx", "-ex", "set pagination off",
                                        "-ex", "thread apply all bt 40")
                 out.lines.grep_v(/^\[New LWP|^warning:|^Downloading|^\[Thread debugging|^Using host libthread_db/).join
               else
                 "(no gdb in this chroot: apt-get install gdb for native backtraces)\n"
               end
      ["### worker #{pid}: marks #{marks(pid).inspect}", "## Ruby threads (SIGWINCH)",
       ruby || "(no answer to SIGWINCH within 3 s: its main thread does not run Ruby code)",
       "## native threads (tid name state wchan syscall)", *tasks, "## its descriptors", *fds.call(pid),
       "## the master's (#{@pid}) descriptors", *fds.call(@pid), "## native backtraces (gdb)", native].join("\n")
    end
  end
end
