# frozen_string_literal: true

module Pgbus
  module Hub
    # What pgbus-hub's glue uses of pgbus, per shape, checked at install before anything is
    # prepended (the other side, what pgbus calls on our objects, is spec/support/pgbus_calls.rb's
    # list). docs/pgbus-surface.md shows both (`rake docs:surface` writes its tables from them).
    module PgbusSurface
      SUPPORTED = "0.13.0 to 0.17"

      # What the glue uses of pgbus, by shape: [constant path, kind, names]. Kinds: :class (defined),
      # :keywords (its #initialize takes these keywords), :methods (its instances answer these),
      # :singleton (the module/class itself answers these), :constants (defined under it).
      STREAMER = "Pgbus::Web::Streamer"
      CONFIGURATION = ["Pgbus::Configuration", :methods, %i[streams_enabled streams_connection_options
                                                            streams_listen_health_check_ms]].freeze
      NEEDS = {
        hub_era: [
          ["#{STREAMER}::HubClient", :keywords, %i[socket_path dispatch_queue]],
          ["#{STREAMER}::HubClient::HubUnavailableError", :class, []],
          ["#{STREAMER}::MasterHub", :keywords, %i[socket_path]],
          ["#{STREAMER}::Listener", :constants, %i[CHANNEL_PREFIX CHANNEL_SUFFIX]],
          [STREAMER, :singleton, %i[reset!]],
          ["Pgbus", :singleton, %i[configuration logger]],
          CONFIGURATION, ["Pgbus::Configuration", :methods, %i[streams_listen_scope]]
        ],
        pre_hub: [
          ["#{STREAMER}::Listener", :keywords, %i[dispatch_queue]],
          ["#{STREAMER}::Listener", :constants, %i[CHANNEL_PREFIX CHANNEL_SUFFIX]],
          [STREAMER, :singleton, %i[reset!]],
          ["Pgbus", :singleton, %i[configuration logger]],
          ["Pgbus::ConfigurationError", :class, []], CONFIGURATION
        ]
      }.freeze

      LACKS = { keywords: "%s.new(%s:)", methods: "%s#%s", singleton: "%s.%s", constants: "%s::%s" }.freeze

      class << self
        # What the loaded pgbus lacks of +shape+'s needs, as readable strings ([] when it has it all).
        def missing(shape)
          NEEDS.fetch(shape).flat_map do |path, kind, names|
            target = Object.const_get(path) if Object.const_defined?(path)
            next ["#{path} (not defined)"] unless target

            names.reject { |name| has?(target, kind, name) }.map { |name| format(LACKS.fetch(kind), path, name) }
          end
        end

        private

        def has?(target, kind, name)
          case kind
          when :keywords then target.instance_method(:initialize).parameters.any? { |type, key| type.to_s.start_with?("key") && key == name }
          when :methods then target.method_defined?(name)
          when :singleton then target.respond_to?(name)
          when :constants then target.const_defined?(name, false)
          end
        end
      end
    end
  end
end
