# frozen_string_literal: true

module Pgbus
  module Hub
    # Keyword handling shared by the native classes' Ruby constructors: one
    # place that fills defaults and rejects unknown or missing keys with a
    # message that names the valid ones.
    module Options
      module_function

      # defaults: { key => default }, with REQUIRED marking keys without one.
      REQUIRED = Object.new.freeze

      def resolve(owner, given, defaults)
        unknown = given.keys - defaults.keys
        unless unknown.empty?
          raise ArgumentError, "#{owner}: unknown option(s) #{unknown.map(&:inspect).join(', ')} " \
                               "(valid: #{defaults.keys.map(&:inspect).join(', ')})"
        end
        missing = defaults.select { |key, value| value.equal?(REQUIRED) && !given.key?(key) }.keys
        raise ArgumentError, "#{owner}: missing required option(s) #{missing.map(&:inspect).join(', ')}" unless missing.empty?

        defaults.merge(given)
      end

      def positive_integer(owner, key, value)
        return value if value.is_a?(Integer) && value.positive?

        raise ArgumentError, "#{owner}: #{key} must be a positive Integer, got #{value.inspect}"
      end

      def positive_number(owner, key, value)
        return value.to_f if value.is_a?(Numeric) && value.positive?

        raise ArgumentError, "#{owner}: #{key} must be a positive number, got #{value.inspect}"
      end

      def string(owner, key, value)
        return value if value.is_a?(String)

        raise TypeError, "#{owner}: #{key} must be a String, got #{value.class}"
      end
    end
  end
end
