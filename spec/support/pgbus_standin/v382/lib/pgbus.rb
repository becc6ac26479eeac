# frozen_string_literal: true

# STAND-IN for pgbus 0.13.1 (#382) (tests only; see ../../README.md).
require "zeitwerk"
require "logger"
require "pg"
require "set"

module Pgbus
  STANDIN_SHAPE = "v382"
  # 0.13.1 to 0.14.x; 0.15 and later add the streamer's #threads and the shutdown that reports
  # threads still alive after the stops (pgbus PR #448), chosen with PGBUS_STANDIN_VERSION.
  VERSION = ENV.fetch("PGBUS_STANDIN_VERSION", "0.14.1")

  def self.reports_leaks? = Gem::Version.new(VERSION) >= Gem::Version.new("0.15")

  class Error < StandardError; end
  class ConfigurationError < Error; end

  class << self
    attr_writer :logger

    def configuration
      @configuration ||= Configuration.new
    end

    def configure
      yield configuration
    end

    def logger
      @logger ||= Logger.new($stdout, progname: "pgbus")
    end
  end
end

loader = Zeitwerk::Loader.for_gem(warn_on_extra_files: false)
loader.ignore("#{__dir__}/puma")
loader.setup
require_relative "../../namespace" # the rest of real pgbus's top-level names (after setup: autoloads count)
loader.eager_load if ENV["PGBUS_STANDIN_EAGER"] == "1"
