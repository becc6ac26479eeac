# frozen_string_literal: true

# Every constant real pgbus (0.14.1) defines directly under Pgbus:: (the list in
# spec/support/pgbus_namespace.txt, copied from the project's shared notes), so
# that code inside `module Pgbus` resolving a bare `Process`, `Client`, `Web`...
# hits pgbus's constant here exactly as it would in production. Names a stand-in
# already provides (its own files, autoloaded by zeitwerk) are left alone; the
# rest are empty modules, or StandardError subclasses for the *Error names.
module Pgbus
  NAMESPACE_LIST = File.expand_path("../pgbus_namespace.txt", __dir__)

  def self.standin_namespace
    File.readlines(NAMESPACE_LIST, chomp: true).map(&:strip).reject { |l| l.empty? || l.start_with?("#") }
  end

  standin_namespace.each do |name|
    next if const_defined?(name, false) # defined, or autoloaded from the stand-in's own files

    const_set(name, name.end_with?("Error") ? Class.new(StandardError) : Module.new)
  end
end
