# frozen_string_literal: true

require "openssl"
require "pg"
require "pgbus/hub"

module ActionCable
  module SubscriptionAdapter
    # `adapter: pgbus_hub` in config/cable.yml (README, "Quick start for ActionCable"): Rails'
    # postgresql adapter on the wire, but every Puma worker of a host LISTENs
    # through the master hub's one connection; without a hub, on its own.
    # Keys: channel_prefix, url, listen_scope, health_check_ms, standby.
    class PgbusHub < Base
      prepend ChannelPrefix

      # The hub options cable.yml describes (master_options' shape): its url, else
      # ActiveRecord's primary database. String keys: Rails hands an indifferent Hash, a test or app may not.
      def self.master_options(cable)
        settings = cable.to_h.transform_keys(&:to_s)
        connection = settings["url"] ||
                     Pgbus::Hub.active_record_connection(::ActiveRecord::Base.connection_db_config.configuration_hash)
        Pgbus::Hub.configuration.master_options(
          scope: (settings["listen_scope"] || :master).to_sym, source: "actioncable", connection: connection,
          **settings.slice("health_check_ms", "standby").transform_keys(&:to_sym)
        )
      end

      def initialize(server)
        super
        @server = server # Rails 8.2's Base keeps only its executor and config
        @lock = Mutex.new
        @url = @server.config.cable.to_h.transform_keys(&:to_s)["url"] # fixed for the server's life; read per broadcast
      end

      # Rails' NOTIFY. A payload NOTIFY cannot carry is stored in pgbus_hub_large_payloads (created by
      # the first one in this process; rows past the retention removed by the insert) and its id notified.
      def broadcast(channel, payload)
        with_broadcast_connection do |pg|
          if payload.bytesize >= Pgbus::Hub::NOTIFY_PAYLOAD_LIMIT
            @large_payload_table ||= pg.exec(Pgbus::Hub::LARGE_PAYLOAD_DDL) && true
            id = pg.exec_params(Pgbus::Hub::LARGE_PAYLOAD_INSERT, [payload]).getvalue(0, 0)
            payload = "#{Pgbus::Hub::LARGE_PAYLOAD_MARK}#{id}"
          end
          pg.exec("NOTIFY #{pg.escape_identifier(channel_identifier(channel))}, '#{pg.escape_string(payload)}'")
        end
      end

      def subscribe(channel, callback, success_callback = nil)
        subscriptions.add_subscriber(channel_identifier(channel), callback, success_callback)
      end

      def unsubscribe(channel, callback)
        subscriptions.remove_subscriber(channel_identifier(channel), callback)
      end

      def shutdown
        current = @lock.synchronize { @subscriptions.tap { @subscriptions = nil } }
        current&.shutdown
        @lock.synchronize { @broadcast_connection.tap { @broadcast_connection = nil } }&.close
      end

      private

      # Where Rails' own adapter runs callbacks: 8.2's executor, else this process's event loop
      # (asked here, in the process subscribing: one built before a fork is the parent's).
      def callback_executor = instance_variable_defined?(:@executor) ? @executor : @server.event_loop

      # Rails' identifier: PostgreSQL truncates channel names at 63 bytes.
      def channel_identifier(channel) = channel.size > 63 ? OpenSSL::Digest::SHA1.hexdigest(channel) : channel

      # This process's subscriptions: one built before a fork (a preloading
      # master) belongs to the parent; the child builds its own.
      def subscriptions
        @lock.synchronize do
          @subscriptions = nil unless @subscriptions&.owned?
          @subscriptions ||= Subscriptions.new(callback_executor, logger: logger) do |wakes, on_listening|
            # Our WakeMessage: a pgbus before 0.13.1 loaded beside has one without the payload (the message).
            Pgbus::Hub.worker_listener(listen_options, dispatch_queue: wakes, on_listening: on_listening,
                                                       wake_message: Pgbus::Hub::WakeMessage, logger: logger)
          end
        end
      end

      # cable.yml's, with the :process scope when the master hub (started from
      # pgbus's or Pgbus::Hub.configure's connection) LISTENs on another database.
      def listen_options
        options = self.class.master_options(@server.config.cable)
        hub = Pgbus::Hub.master_options
        return options if hub.nil? || hub[:source] == "actioncable" ||
                          Pgbus::Hub.database_of(hub[:connection]) == Pgbus::Hub.database_of(options[:connection])

        logger&.info("[pgbus-hub] the master hub LISTENs on another database than ActionCable's: " \
                     "this process LISTENs for ActionCable on its own connection")
        options.merge(scope: :process)
      rescue StandardError => e
        raise unless options

        logger&.warn("[pgbus-hub] cannot tell the master hub's database (#{e.class}: #{e.message}): not using it")
        options.merge(scope: :process)
      end

      # Rails' broadcast connection (ActiveRecord's, so a broadcast inside a
      # transaction is sent at its commit), or one of our own for cable.yml's url.
      def with_broadcast_connection(&block)
        return ::ActiveRecord::Base.connection_pool.with_connection { |ar| block.call(ar.raw_connection) } unless @url

        @lock.synchronize do
          @broadcast_connection = nil if @broadcast_pid != ::Process.pid || @broadcast_connection&.finished?
          @broadcast_pid = ::Process.pid
          # ActiveRecord's level: IF NOT EXISTS notices stay out of the log.
          @broadcast_connection ||= PG.connect(@url).tap { |pg| pg.exec("SET client_min_messages TO warning") }
          block.call(@broadcast_connection)
        end
      end
    end
  end
end

require_relative "pgbus_hub/in_order"
require_relative "pgbus_hub/subscriptions"
