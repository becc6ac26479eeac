# frozen_string_literal: true

# Opt-in, local: Rails' own subscription-adapter cases (the ones every adapter must pass:
# actioncable/test/subscription_adapter/common.rb and channel_prefix.rb) against `adapter:
# pgbus_hub`, from a Rails checkout of the version under test (never shipped with this project).
# Run with that checkout's actioncable test dir and libs first on the load path, e.g.:
#   R=/src/rails-v8.1.3 ruby -I lib -I $R/actioncable/test -I $R/actioncable/lib -I $R/activesupport/lib \
#     -I $R/actionpack/lib -I $R/activerecord/lib -I $R/activemodel/lib spec/support/rails_adapter_cases.rb
# with PGBUS_HUB_TEST_DATABASE_URL naming the database (a URL: cable.yml's `url`). Minitest output.
require "test_helper" # Rails' actioncable/test/test_helper.rb
require "subscription_adapter/common"
require "subscription_adapter/channel_prefix"

class PgbusHubAdapterTest < ActionCable::TestCase
  include CommonSubscriptionAdapterTest
  include ChannelPrefixTest

  def cable_config = { adapter: "pgbus_hub", url: ENV.fetch("PGBUS_HUB_TEST_DATABASE_URL") }
end
