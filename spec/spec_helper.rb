# frozen_string_literal: true

$LOAD_PATH.unshift File.expand_path("../lib", __dir__)
require "pgbus/hub"
require "json"
require_relative "support/gem_command"
require_relative "support/wait"

ROOT = File.expand_path("..", __dir__)
VECTORS = JSON.parse(File.read(File.join(ROOT, "ext/pgbus_hub_core/tests/fixtures/vectors.json")))

RSpec.configure do |config|
  config.disable_monkey_patching!
  config.order = :defined
end
