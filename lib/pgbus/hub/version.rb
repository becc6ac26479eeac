# frozen_string_literal: true

module Pgbus
  module Hub
    VERSION = "0.1.0"
  end
end
