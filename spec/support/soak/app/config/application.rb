# frozen_string_literal: true

require "logger"
require "rails"
require "active_record/railtie"
require "action_controller/railtie"
require "action_cable/engine"

require_relative "pgbus_sse" if ENV["SOAK_PGBUS_SSE"] == "1" # opt-in: real pgbus's SSE streams (rake stops)

ADAPTER = ENV.fetch("SOAK_CABLE_ADAPTER")
if ADAPTER == "pgbus_hub"
  require "pgbus/hub"
  # The streams API on the same database as ActionCable: the hub LISTENs for both on one connection.
  # With real pgbus (SOAK_PGBUS_SSE) the hub takes pgbus's configuration, as an app with both gems
  # does: pgbus's channels (pgmq.q_NAME.INSERT), not this one's raw ones.
  unless defined?(SoakPgbusSse)
    Pgbus::Hub.configure do |c|
      c.connection = ENV.fetch("DATABASE_URL")
      c.channel_prefix = ""
      c.channel_suffix = ""
      c.logger = Logger.new($stdout, level: Logger::INFO)
      c.standby = true if ENV["SOAK_HUB_STANDBY"] == "1" # SOAK_STANDBY=1 (issue 57)
    end
  end
end

class SoakApp < Rails::Application
  config.load_defaults 7.2
  config.root = File.expand_path("..", __dir__)
  config.eager_load = true
  config.secret_key_base = "soak-#{'0' * 60}"
  config.logger = Logger.new($stdout)
  config.log_level = :warn # Rails' default is :debug: a line per message and client (ActionCable's "transmitting")
  config.hosts.clear
  config.action_cable.mount_path = "/cable"
  config.action_cable.disable_request_forgery_protection = true # the test clients send no Origin
  config.active_record.dump_schema_after_migration = false

  routes.append do
    mount SoakStreams => "/stream"
    mount SoakPgbusSse.app => "/pgbus/streams" if defined?(SoakPgbusSse)
    get "/pid", to: ->(_env) { [200, { "content-type" => "application/json" }, [%({"pid":#{Process.pid}})]] }
  end
end

# What the soak's CableClients subscribe to (spec/support/cable_client.rb): the room,
# then this worker's pid.
class RoomChannel < ActionCable::Channel::Base
  def subscribed
    stream_from params.fetch(:room)
    transmit({ "pid" => Process.pid })
  end
end

# Streaming HTTP over the gem's streams API: one listener per worker (built in
# the worker on first use), one dispatcher thread fanning its wakes out to the
# open streams, one writer thread per stream (a stream that stops reading is
# closed past MAX_QUEUED lines, never delaying the others).
module SoakStreams
  MAX_QUEUED = 20_000
  LOCK = Mutex.new

  Out = Struct.new(:io, :queue, :writer) do
    def push(line)
      return false if queue.closed?
      return close && false if queue.size > MAX_QUEUED

      queue << line
      true
    end

    def close
      queue.close
      io.close rescue nil # rubocop:disable Style/RescueModifier
      true
    end
  end

  module_function

  def call(env)
    channel = Rack::Utils.parse_query(env["QUERY_STRING"]).fetch("ch")
    io = env["rack.hijack"].call
    io.write("HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncache-control: no-cache\r\nconnection: close\r\n\r\n")
    out = Out.new(io, Queue.new)
    out.writer = Thread.new do
      while (line = out.queue.pop)
        io.write(line)
      end
    rescue IOError, SystemCallError
      out.close
    end
    listener, streams = worker
    LOCK.synchronize { streams[channel] << out }
    result = listener.ensure_listening(channel)
    out.push("ready #{Process.pid} #{result.inspect}\n")
    [200, {}, []] # ignored: the socket is hijacked
  end

  # This worker's [listener, {channel => [Out]}]; rebuilt after a fork.
  def worker
    LOCK.synchronize do
      @worker = nil unless @pid == Process.pid
      @worker ||= begin
        @pid = Process.pid
        streams = Hash.new { |h, k| h[k] = [] }
        wakes = Queue.new
        Thread.new do
          while (wake = wakes.pop)
            next if wake.payload.nil? # a catch-up wake (durable): nothing to replay for raw payloads

            outs = LOCK.synchronize { streams[wake.queue_name].reject! { |o| o.queue.closed? }.then { streams[wake.queue_name].dup } }
            outs.each { |o| o.push("#{wake.payload}\n") }
          end
        end
        [Pgbus::Hub.listener(dispatch_queue: wakes), streams]
      end
    end
  end
end
