# frozen_string_literal: true

require "delegate"

# Who holds each `pgbus-listen` backend: what a census that came out wrong says about itself.
# A backend's client port (pg_stat_activity.client_port) is looked up in /proc/net/tcp{,6} for
# its socket's inode, and the inode in every thread's descriptor table, /proc/PID/task/TID/fd:
# a process whose thread-group leader exited while another thread lives hides its descriptors
# from /proc/PID/fd (and from `ss -p`), never from its live threads' tables.
module Census
  module_function

  # A count of backends that, inspected (as a failed `expect(...).to eq(n)` does), lists them
  # with their owners. `rows`: Hashes with "pid", "client_port" and "backend_start".
  class Count < SimpleDelegator
    def initialize(rows)
      super(rows.size)
      @rows = rows
    end

    def inspect = "#{__getobj__} (#{Census.describe(@rows)})"
    def to_s = inspect
  end

  def describe(rows)
    return "no backend" if rows.empty?

    rows.map do |row|
      port = row["client_port"].to_i
      where = port.positive? ? owners_of_port(port) : "over a Unix socket (owner not looked up)"
      "backend #{row['pid']} from #{row['backend_start']}, client port #{port}: #{where}"
    end.join("; ")
  end

  def owners_of_port(port)
    inode = socket_inode(port) or return "no socket on this host has that port"
    owners = holders(inode)
    owners.empty? ? "socket #{inode} held by NO process (in flight, or the kernel's)" : owners.join(", ")
  end

  def socket_inode(port)
    %w[/proc/net/tcp /proc/net/tcp6].each do |table|
      File.foreach(table).drop(1).each do |line|
        fields = line.split
        return fields[9] if fields[1].split(":").last.to_i(16) == port
      end
    rescue SystemCallError
      next
    end
    nil
  end

  # "pid P (cmd; leader state, N threads) thread T" for each process holding `inode`.
  def holders(inode)
    target = "socket:[#{inode}]"
    found = Dir.glob("/proc/[0-9]*/task/[0-9]*/fd/*").filter_map do |fd|
      fd.split("/").values_at(2, 4) if (File.readlink(fd) rescue nil) == target # rubocop:disable Style/RescueModifier
    end
    found.group_by(&:first).map do |pid, tasks|
      status = File.read("/proc/#{pid}/status") rescue "" # rubocop:disable Style/RescueModifier
      cmd = (File.read("/proc/#{pid}/cmdline").tr("\0", " ").strip rescue "?")[0, 120] # rubocop:disable Style/RescueModifier
      state = status[/^State:\s+(.*)$/, 1]
      threads = status[/^Threads:\s+(\d+)$/, 1]
      "pid #{pid} (#{cmd}; leader #{state}, #{threads} threads) thread #{tasks.map(&:last).uniq.first(3).join('/')}"
    end
  end
end
