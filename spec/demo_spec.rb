# frozen_string_literal: true

require "json"
require "net/http"
require "socket"
require "timeout"
require "tmpdir"
require "fileutils"
require "securerandom"
require "base64"
require "digest"

# bin/demo end to end (its own throwaway PostgreSQL cluster, a real 4-worker
# Puma cluster), and the demo page in headless Chromium over the DevTools
# protocol (a stdlib-only WebSocket client below).
RSpec.describe "bin/demo", :demo do
  demo = File.join(ROOT, "bin", "demo")
  postgres = !Dir.glob("/usr/lib/postgresql/*/bin/initdb").empty? || ENV["DATABASE_URL"]

  # Non-zombie processes of process group +pgid+.
  def group_members(pgid)
    Dir.glob("/proc/[0-9]*/stat").filter_map do |stat|
      fields = File.read(stat).split(") ").last.split
      stat[%r{/proc/(\d+)/}, 1].to_i if fields[2].to_i == pgid && fields[0] != "Z"
    rescue SystemCallError
      nil
    end
  end

  def group_alive?(pgid)
    !group_members(pgid).empty?
  end

  def wait_group_gone(pgid, timeout = 10)
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    sleep 0.1 while group_alive?(pgid) && Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
  end

  def stop_group(pid, signal: "INT", timeout: 30)
    return unless pid

    Process.kill(signal, pid) rescue nil # rubocop:disable Style/RescueModifier
    deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
    sleep 0.1 until Process.waitpid(pid, Process::WNOHANG) || Process.clock_gettime(Process::CLOCK_MONOTONIC) > deadline
  rescue Errno::ECHILD
    nil
  ensure
    if pid
      wait_group_gone(pid, 5)
      if group_alive?(pid)
        Process.kill("KILL", -pid) rescue nil # rubocop:disable Style/RescueModifier
        Process.waitpid(pid) rescue nil # rubocop:disable Style/RescueModifier
        wait_group_gone(pid, 5)
      end
    end
  end

  # Processes whose command line mentions +marker+ (our own temp dirs / ports).
  def processes_matching(marker)
    Dir.glob("/proc/[0-9]*/cmdline").filter_map do |f|
      cmd = File.read(f).tr("\0", " ")
      cmd if cmd.include?(marker) && !cmd.include?("rspec")
    rescue SystemCallError
      nil
    end
  end

  it "runs end to end: census 1 with the hub, 4 after the fail-over, every message delivered, clean exit" do
    skip "no PostgreSQL binaries (/usr/lib/postgresql/*/bin) and no DATABASE_URL" unless postgres

    out_path = File.join(Dir.tmpdir, "pgbus-hub-demo-spec-#{Process.pid}.out")
    pid = Process.spawn({ "DATABASE_URL" => nil }, demo, out: out_path, err: %i[child out], pgroup: true, in: File::NULL)
    status = nil
    begin
      Timeout.timeout(240) { _, status = Process.wait2(pid) }
    ensure
      stop_group(pid, signal: "TERM") unless status
    end
    out = File.read(out_path)
    File.unlink(out_path)
    expect(status.exitstatus).to eq(0), out
    expect(out).to include("==> starting Puma", "==> phase 1 (hub)", "==> stopping the master hub", "==> phase 2 (failed over)")
    expect(out).to match(/^census:\s+1 pgbus-listen connection\(s\) with the hub; 4 without it \(measured/)
    expect(out).to match(/^hub stats:\s+workers 4, channels 3, listener_healthy true/) # the stats query is no worker
    expect(out).to match(%r{^hub\s+delivered (\d+)/\1 to 4 workers, wake latency p50 [\d.]+ ms, p99 [\d.]+ ms})
    expect(out).to match(/^fail-over:\s+hub stopped -> census 4/)
    expect(out).to match(%r{^failover\s+delivered (\d+)/\1 to 4 workers})
    expect(out).to include("result:     OK", "stopped cleanly (throwaway cluster removed)")
    expect(group_alive?(pid)).to be(false)
    socket = out[%r{master hub at (\S+\.sock)}, 1]
    expect(File.exist?(socket)).to be(false)
    pgdir = out[/throwaway PostgreSQL \d+ cluster in (\S+)/, 1]
    expect(File.exist?(pgdir)).to be(false)
    expect(processes_matching(pgdir)).to be_empty
  end

  # A minimal Chrome DevTools Protocol client: one WebSocket, text frames.
  class CdpClient
    def initialize(ws_url)
      uri = URI(ws_url)
      @socket = TCPSocket.new(uri.host, uri.port)
      key = Base64.strict_encode64(SecureRandom.random_bytes(16))
      @socket.write("GET #{uri.path} HTTP/1.1\r\nHost: #{uri.host}:#{uri.port}\r\nUpgrade: websocket\r\n" \
                    "Connection: Upgrade\r\nSec-WebSocket-Key: #{key}\r\nSec-WebSocket-Version: 13\r\n\r\n")
      status = @socket.gets
      raise "websocket handshake failed: #{status}" unless status&.include?(" 101 ")

      nil while (line = @socket.gets) && line != "\r\n"
      @id = 0
    end

    def call(method, params = {}, timeout: 15)
      id = (@id += 1)
      send_text(JSON.generate({ id: id, method: method, params: params }))
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + timeout
      loop do
        remaining = deadline - Process.clock_gettime(Process::CLOCK_MONOTONIC)
        raise "CDP #{method}: no answer within #{timeout}s" unless remaining.positive? && @socket.wait_readable(remaining)

        message = JSON.parse(read_message)
        next unless message["id"] == id
        raise "CDP #{method}: #{message['error']}" if message["error"]

        return message["result"]
      end
    end

    def evaluate(expression)
      call("Runtime.evaluate", { expression: expression, returnByValue: true }).dig("result", "value")
    end

    def close
      @socket.close unless @socket.closed?
    end

    private

    def send_text(text)
      bytes = text.b
      mask = SecureRandom.random_bytes(4).bytes
      header = [0x81].pack("C")
      header << if bytes.bytesize < 126 then [0x80 | bytes.bytesize].pack("C")
                elsif bytes.bytesize < 65_536 then [0x80 | 126, bytes.bytesize].pack("Cn")
                else [0x80 | 127, bytes.bytesize].pack("CQ>")
                end
      masked = bytes.bytes.each_with_index.map { |b, i| b ^ mask[i % 4] }.pack("C*")
      @socket.write(header + mask.pack("C*") + masked)
    end

    def read_message
      data = +""
      loop do
        b0, b1 = @socket.read(2).unpack("CC")
        length = b1 & 0x7f
        length = @socket.read(2).unpack1("n") if length == 126
        length = @socket.read(8).unpack1("Q>") if length == 127
        payload = length.zero? ? "" : @socket.read(length)
        opcode = b0 & 0x0f
        next if opcode == 0x9 || opcode == 0xA # ping / pong
        raise "websocket closed" if opcode == 0x8

        data << payload
        return data.force_encoding(Encoding::UTF_8) if (b0 & 0x80) != 0
      end
    end
  end

  it "shows the census gauge, every worker's counter and the latency histogram in headless Chromium; " \
     "its buttons broadcast, broadcast 100 KB, stop the hub (gauge 1 -> 4) and start it (-> 1); screenshot in tmp/demo-page.png" do
    chromium = %w[chromium chromium-browser google-chrome].map { |c| `command -v #{c} 2>/dev/null`.strip }.find { |p| !p.empty? }
    skip "chromium not installed (bin/setup installs it)" unless chromium
    skip "no PostgreSQL binaries (/usr/lib/postgresql/*/bin) and no DATABASE_URL" unless postgres

    work = Dir.mktmpdir("pgbus-hub-demo-chromium")
    demo_pid = chrome_pid = cdp = nil
    begin
      port = TCPServer.new("127.0.0.1", 0).then { |s| s.addr[1].tap { s.close } }
      demo_out = File.join(work, "demo.out")
      demo_pid = Process.spawn({ "DATABASE_URL" => nil }, demo, "--serve", "--port", port.to_s,
                               out: demo_out, err: %i[child out], pgroup: true, in: File::NULL)
      wait_for("the demo to serve", timeout: 120, interval: 0.1) { File.read(demo_out).include?("demo running: http://127.0.0.1:#{port}/") }
      url = "http://127.0.0.1:#{port}/"

      chrome_err = File.join(work, "chrome.err")
      chrome_pid = Process.spawn(chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--no-first-run",
                                 "--remote-debugging-port=0", "--user-data-dir=#{File.join(work, 'profile')}",
                                 "--window-size=1200,900", "about:blank",
                                 out: File::NULL, err: chrome_err, pgroup: true, in: File::NULL)
      devtools = Timeout.timeout(30) do
        sleep 0.1 until (m = File.read(chrome_err)[%r{DevTools listening on ws://127\.0\.0\.1:(\d+)/}, 1])
        Integer(m)
      end
      page = Timeout.timeout(15) do
        loop do
          targets = JSON.parse(Net::HTTP.get(URI("http://127.0.0.1:#{devtools}/json/list"))) rescue [] # rubocop:disable Style/RescueModifier
          found = targets.find { |t| t["type"] == "page" }
          break found if found

          sleep 0.1
        end
      end
      cdp = CdpClient.new(page["webSocketDebuggerUrl"])
      cdp.call("Page.enable")
      cdp.call("Page.navigate", { url: url })
      text = -> { cdp.evaluate("document.body ? document.body.innerText : ''").to_s }
      click = ->(id) { cdp.evaluate("document.getElementById(#{id.to_json}).click(); 1") }
      census = -> { cdp.evaluate('document.getElementById("census-value").textContent').to_s }
      # [[pid, "the hub" | "its own connection", wakes received], ...] as the page shows them.
      workers = lambda do
        cdp.evaluate(<<~JS).to_a
          Array.from(document.querySelectorAll("#workers tr")).map(function (tr) {
            return [Number(tr.cells[0].textContent), tr.cells[1].textContent, Number(tr.cells[2].textContent)];
          })
        JS
      end
      wait_for("both streams live", timeout: 20, interval: 0.1) { text.call.scan(/stream live on worker/).size == 2 }
      wait_for("the gauge at 1 with 4 workers on the hub", timeout: 20, interval: 0.1) do
        census.call == "1" && workers.call.map { |w| w[1] }.tally == { "the hub" => 4 }
      end
      expect(text.call).to include("per-worker listening: 4")

      cdp.evaluate('document.getElementById("live").click(); 1') # no background broadcasts: counts below are ours
      before = workers.call.to_h { |pid, _, received| [pid, received] }
      click.call("broadcast")
      wait_for("every worker's counter up by one, a latency sample", timeout: 15, interval: 0.1) do
        workers.call.all? { |pid, _, received| received > before.fetch(pid) } &&
          text.call.match?(/\d+ samples · p50 [\d.]+ ms · p99 [\d.]+ ms/)
      end
      click.call("large")
      wait_for("the 100 KB broadcast on the page", timeout: 15, interval: 0.1) do
        text.call.match?(/100 KB broadcast: 102400 bytes arrived through worker \d+/)
      end

      click.call("stop-hub")
      wait_for("the gauge at 4, every worker on its own connection", timeout: 30, interval: 0.1) do
        census.call == "4" && workers.call.map { |w| w[1] }.tally == { "its own connection" => 4 }
      end
      click.call("start-hub")
      wait_for("the gauge back at 1, every worker on the hub", timeout: 30, interval: 0.1) do
        census.call == "1" && workers.call.map { |w| w[1] }.tally == { "the hub" => 4 }
      end
      cdp.evaluate('document.getElementById("live").click(); 1') # live again, for the screenshot
      wait_for("more latency samples", timeout: 15, interval: 0.1) { text.call[/(\d+) samples/, 1].to_i >= 4 }
      expect(text.call).not_to include('"census"') # no JSON on the main view (raw stats stay folded)

      png = Base64.decode64(cdp.call("Page.captureScreenshot", { format: "png" })["data"])
      FileUtils.mkdir_p(File.join(ROOT, "tmp"))
      File.binwrite(File.join(ROOT, "tmp", "demo-page.png"), png)
      expect(png[0, 8]).to eq("\x89PNG\r\n\x1a\n".b)

      # The ActionCable page (when ActionCable is installed): Rails' browser client through adapter pgbus_hub.
      if Gem::Specification.find_all_by_name("actioncable").any?
        cdp.call("Page.navigate", { url: "#{url}cable.html" })
        wait_for("the cable panel subscribed", timeout: 20, interval: 0.1) { text.call.include?("subscribed") }
        cdp.evaluate('document.getElementById("send").click(); document.getElementById("large").click(); 1')
        wait_for("both messages on the page", timeout: 15, interval: 0.1) { text.call.include?(": 5 bytes: hello") && text.call.include?(": 100000 bytes") }
      end
    ensure
      cdp&.close
      stop_group(chrome_pid, signal: "TERM", timeout: 10)
      stop_group(demo_pid, signal: "INT", timeout: 40)
      begin
        expect(chrome_pid.nil? || !group_alive?(chrome_pid)).to be(true)
        expect(demo_pid.nil? || !group_alive?(demo_pid)).to be(true)
        expect(processes_matching(work)).to be_empty
        demo_log = File.read(File.join(work, "demo.out")) rescue "" # rubocop:disable Style/RescueModifier
        expect(demo_log).to include("stopped cleanly") if demo_pid
      ensure
        FileUtils.rm_rf(work)
      end
    end
  end
end
