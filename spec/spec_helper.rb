# frozen_string_literal: true

$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "pgbus/hub"
require "json"
require "rbconfig"

ROOT = File.expand_path("..", __dir__)
# The `gem` command of the Ruby running the suite (Debian: gem3.4 beside ruby3.4;
# a plain `gem` on PATH may belong to another Ruby).
GEM_COMMAND = File.join(RbConfig::CONFIG["bindir"], RbConfig::CONFIG["ruby_install_name"].sub("ruby", "gem"))
VECTORS = JSON.parse(File.read(File.join(ROOT, "ext/pgbus_hub_core/tests/fixtures/vectors.json")))

RSpec.configure do |config|
  config.disable_monkey_patching!
  config.order = :defined
end
