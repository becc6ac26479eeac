# frozen_string_literal: true

module Pgbus
  module Hub
    # Pgbus::Hub.configure's settings (docs/configuration.md): connection
    # (unset under pgbus: pgbus's is used), listen_scope, socket_path and every
    # key of DEFAULTS but the workers' ack_timeout (derived from health_check_ms),
    # each checked as it is set (Pgbus::Hub.check_setting): a typo fails the boot.
    Configuration = Struct.new(:logger, :connection, :listen_scope, :socket_path,
                               *(DEFAULTS.keys - %i[ack_timeout]), keyword_init: true) do
      def initialize = super(listen_scope: :master, **DEFAULTS.except(:ack_timeout))

      # Prepended over Struct's own setters (redefining them warns under -W).
      keys = members
      prepend(Module.new do
        keys.each do |key|
          define_method(:"#{key}=") do |value|
            super(Hub.check_setting(key, value))
            Boot.setting_changed(key)
          end
        end
      end)

      # What the master hub starts with (:scope and :source say whether and why).
      def master_options(**from_pgbus)
        { scope: listen_scope, source: "standalone", **to_h.except(:logger, :listen_scope, :socket_path), **from_pgbus }
      end
    end

    class << self
      def configuration = (@configuration ||= Configuration.new)
      def configure = configuration.tap { |config| yield config }

      # A connection was configured here (else pgbus's is used, if pgbus is loaded).
      def configured? = !@configuration&.connection.nil?

      # The master hub's options; nil while none is ready; Error for one the hub cannot use.
      # Sources: Pgbus::Hub.configure, else pgbus's streams, else an ActionCable-only app's cable.yml.
      def master_options
        return configuration.master_options if configured?

        PgbusAdapter.master_options || action_cable_master_options
      end

      # cable.yml says `adapter: pgbus_hub` (Rails loads it into config.cable at boot, before the first fork).
      def action_cable_master_options
        cable = defined?(::ActionCable.server) && ::ActionCable.server.config.cable
        return nil unless cable && cable.to_h.transform_keys(&:to_s)["adapter"].to_s == "pgbus_hub"

        require "action_cable/subscription_adapter/pgbus_hub"
        ::ActionCable::SubscriptionAdapter::PgbusHub.master_options(cable)
      end

      # A started listener for this worker, from Pgbus::Hub.configure.
      def listener(dispatch_queue:, logger: configuration.logger)
        raise Error, "Pgbus::Hub.listener: call Pgbus::Hub.configure with a connection first" unless configured?

        worker_listener(master_options, dispatch_queue: dispatch_queue, logger: logger)
      end

      # A worker of the hub +options+ describe (master_options' shape) is served
      # by the master's hub: the :master scope, and the master exported its socket.
      # DEFAULT_SOCKET_ENV is defined by the extension (ext/pgbus_hub/src/defaults.rs: the core's hub::SOCKET_ENV).
      def hub_served?(options) = options[:scope].to_s == "master" && !ENV[DEFAULT_SOCKET_ENV].to_s.empty?

      # A started listener for a worker of the hub +options+ describe, with the
      # +worker+ keywords (dispatch_queue:, logger:, on_listening:): a
      # FailoverListener over the hub at +socket_path+ (default: the master's, when
      # it serves), else a Listener of its own.
      def worker_listener(options, socket_path: (ENV.fetch(DEFAULT_SOCKET_ENV) if hub_served?(options)), **worker)
        keywords = listener_keywords(options).merge(worker)
        listener = socket_path ? FailoverListener.new(socket_path: socket_path, **keywords) : Listener.new(**keywords)
        listener.start
      end

      # What a worker's listener takes of the hub +options+ describe.
      # standby: a worker's own connection (after a fail-over, or without a hub) gets a standby too.
      def listener_keywords(options) = options.slice(:connection, :health_check_ms, :channel_prefix, :channel_suffix,
                                                     :standby)
    end
  end
end
