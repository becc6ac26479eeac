# frozen_string_literal: true

require "json"
require "net/http"
require "open3"
require "socket"
require "tmpdir"
require_relative "support/puma_apps/e2e_helpers"
require_relative "support/serve_process"

# The hub's Prometheus metrics with the real parts (docs/monitoring.md): `pgbus-hub serve
# --metrics-port`'s GET /metrics and `pgbus-hub status --prometheus` checked by Debian's promtool
# and scraped by a Prometheus server of the example's own; the in-Puma hub's endpoint, served by
# a cluster's master.
RSpec.describe "Prometheus metrics", :puma do
  include PumaE2E

  def run_exe(*args)
    env = { "RUBYLIB" => File.join(ROOT, "lib"), "PGBUS_STREAMS_HUB_SOCKET" => nil }
    out, err, status = Open3.capture3(env, RbConfig.ruby, PGBUS_HUB_EXE, *args)
    [out, err, status.exitstatus]
  end

  def promtool? = system("command -v promtool >/dev/null 2>&1")

  def promtool_check(text)
    out, status = Open3.capture2e("promtool", "check", "metrics", stdin_data: text)
    expect([out, status.exitstatus]).to eq(["", 0]), "promtool check metrics:\n#{out}\n--- the text ---\n#{text}"
  end

  def scrape(address, path = "/metrics", method: :get)
    http = Net::HTTP.new(*address.split(/:(?=\d+\z)/))
    http.open_timeout = http.read_timeout = 5
    method == :get ? http.get(path) : http.post(path, "")
  end

  # Sample lines without comments: { "name{labels}" => "value" }.
  def samples(text) = text.lines.grep_v(/\A#/).to_h { |line| line.split(" ", 2).map(&:strip) }
  def families(text) = text.scan(/^# TYPE (\S+) (\S+)$/).sort

  def free_port = TCPServer.open("127.0.0.1", 0) { |server| server.addr[1] }

  def serve_with_metrics(*args)
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL, args: ["--metrics-port", "0", *args])
    wait_for("serve's metrics line", timeout: 10) { @serve.output[%r{^metrics: http://(\S+)/metrics$}, 1] }
  end

  # Debian's prometheus, in a temp dir of its own, scraping `target` every second.
  def start_prometheus(target)
    @prometheus_dir = Dir.mktmpdir("pgbus-prometheus")
    config = File.join(@prometheus_dir, "prometheus.yml")
    File.write(config, <<~YAML)
      global: { scrape_interval: 1s, evaluation_interval: 1s }
      scrape_configs:
        - job_name: pgbus-hub
          static_configs: [{ targets: ["#{target}"] }]
    YAML
    port = free_port
    @prometheus = ::Process.spawn("prometheus", "--config.file=#{config}",
                                  "--storage.tsdb.path=#{File.join(@prometheus_dir, 'data')}",
                                  "--web.listen-address=127.0.0.1:#{port}",
                                  out: File.join(@prometheus_dir, "log"), err: %i[child out])
    "127.0.0.1:#{port}"
  end

  def prometheus_query(address, query)
    response = scrape(address, "/api/v1/query?#{URI.encode_www_form(query: query)}")
    JSON.parse(response.body).dig("data", "result") if response.is_a?(Net::HTTPOK)
  rescue SystemCallError, IOError, Net::OpenTimeout, Net::ReadTimeout
    nil
  end

  before do
    skip "no PostgreSQL at #{PumaCluster::DATABASE_URL}" unless PumaE2E.database_available?
  end

  after do
    @clients&.each(&:stop)
    stop_clusters
    @serve&.stop
    @serve&.cleanup
    if @prometheus
      ::Process.kill("TERM", @prometheus)
      ::Process.wait(@prometheus)
    end
    FileUtils.rm_rf(@prometheus_dir) if @prometheus_dir
  end

  def connect_clients(socket, count)
    @clients = Array.new(count) do |i|
      client = Pgbus::Hub::HubClient.new(socket_path: socket, dispatch_queue: Queue.new).connect
      expect(client.ensure_listening("#{unique_stream}_#{i}")).to eq(:done)
      client
    end
  end

  it "serve --metrics-port: GET /metrics and status --prometheus print the same families, pass promtool; " \
     "a Prometheus server scraping it reads pgbus_hub_workers 2" do
    address = serve_with_metrics
    connect_clients(@serve.socket, 2)

    response = scrape(address)
    expect(response["content-type"]).to eq("text/plain; version=0.0.4")
    expect(samples(response.body)).to include("pgbus_hub_up" => "1", "pgbus_hub_workers" => "2",
                                              "pgbus_hub_channels" => "2", "pgbus_hub_subscribe_ack_seconds_count" => "2",
                                              'pgbus_hub_listener_state{state="listening"}' => "1")
    status, err, code = run_exe("status", "--prometheus", "--socket", @serve.socket)
    expect([err, code]).to eq(["", 0])
    expect(families(status)).to eq(families(response.body))
    expect(samples(status)).to include("pgbus_hub_workers" => "2")
    census, _err, code = run_exe("status", "--prometheus", "--socket", @serve.socket,
                                 "--database-url", PumaCluster::DATABASE_URL)
    expect(code).to eq(0)
    expect(samples(census)).to include("pgbus_hub_census" => "1")

    skip "promtool/prometheus not installed (Debian's prometheus package: bash bin/setup)" unless promtool?
    [response.body, status, census].each { |text| promtool_check(text) }
    prometheus = start_prometheus(address)
    workers = wait_for("Prometheus to have scraped pgbus_hub_workers", timeout: 30) do
      prometheus_query(prometheus, "pgbus_hub_workers")&.first&.dig("value", 1)
    end
    expect(workers).to eq("2")
    expect(prometheus_query(prometheus, 'up{job="pgbus-hub"}').first.dig("value", 1)).to eq("1")
  end

  it "answers 404 off /metrics and 405 to anything but GET; a port it cannot bind is logged and serve serves; " \
     "status --prometheus without a hub prints pgbus_hub_up 0 (exit 2)" do
    address = serve_with_metrics
    expect(scrape(address, "/").code).to eq("404")
    expect(scrape(address, "/metrics", method: :post)).to have_attributes(code: "405")
    expect(scrape(address, "/metrics", method: :post)["allow"]).to eq("GET")
    taken = address[/\d+\z/]
    first = @serve
    @serve = ServeProcess.new(PumaCluster::DATABASE_URL, args: ["--metrics-port", taken])
    wait_for("the bind error logged", timeout: 10) { @serve.log.include?("ERROR") }
    expect(@serve.log).to include("metrics endpoint: cannot listen on 127.0.0.1:#{taken}",
                                  "the hub serves its workers without it")
    expect(@serve.output).not_to include("metrics: http")
    connect_clients(@serve.socket, 1)
    out, _err, code = run_exe("status", "--socket", @serve.socket)
    expect([out, code]).to match([/healthy/, 0])
    @serve.stop
    @serve.cleanup
    @serve = first

    out, err, code = run_exe("status", "--prometheus", "--socket", File.join(Dir.tmpdir, "pgbus-no-such-hub.sock"))
    expect(code).to eq(2)
    expect(err).to include("pgbus-hub status:")
    expect(samples(out)).to eq("pgbus_hub_up" => "0")
    promtool_check(out) if promtool?
    expect(run_exe("status", "--json", "--prometheus")[2]).to eq(64)
  end

  it "a Puma cluster's master serves the in-Puma hub's GET /metrics (metrics_port): the cluster's workers" do
    c = cluster(mode: :standalone, workers: 2, puma_rb_requires: File.join(__dir__, "support", "metrics_puma.rb"),
                env: { "PGBUS_E2E_METRICS_PORT" => "0" })
    c.wait_log(%r{metrics at http://\S+/metrics})
    address = c.log[%r{metrics at http://(\S+)/metrics}, 1]
    c.subscribe_all(unique_stream)
    text = wait_for("both workers counted", timeout: 10) do
      body = scrape(address).body
      body if samples(body)["pgbus_hub_workers"] == "2"
    end
    expect(samples(text)).to include("pgbus_hub_up" => "1")
    expect(c.hub_info.dig("stats", "metrics_address")).to eq(address)
    skip "promtool not installed (Debian's prometheus package: bash bin/setup)" unless promtool?
    promtool_check(text)
  end
end
