# frozen_string_literal: true

require_relative "support/helpers"

# Scenario 8 (shared server part): 0-byte and 7999-byte payloads. The
# non-UTF-8 part needs a SQL_ASCII database: s08b_non_utf8_spec.rb (private cluster).
RSpec.describe "reliability 8: payload sizes", reliability: :fast do
  it "delivers 0 bytes as a durable wake and 7999 bytes intact; PostgreSQL itself refuses 8000" do
    with_tmpdir do |dir|
      hub = RelHub.new(dir)
      worker = RelWorker.new(hub.socket_path)
      worker.sub("p_sizes")
      mark = worker.size
      Rel.notify("p_sizes", "")
      expect(worker.wait_wake("p_sizes", nil, from: mark)["p"]).to be_nil
      big = ("0123456789abcdef" * 500)[0, 7999]
      Rel.notify("p_sizes", big)
      expect(worker.wait_wake("p_sizes", big)["p"].bytesize).to eq(7999)
      multibyte = "é" * 3999 # 7998 bytes
      Rel.notify("p_sizes", multibyte)
      worker.wait_wake("p_sizes", multibyte)
      expect { Rel.notify("p_sizes", "x" * 8000) }.to raise_error(TestDatabase.error_class, /payload string too long/)
      assert_acked_subs_get_wakes({ worker => %w[p_sizes] })
      worker.stop
      hub.stop
    end
  end
end
