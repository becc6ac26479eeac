# frozen_string_literal: true

require "ripper"
require "open3"
require "rbconfig"

# Inside `module Pgbus`, a bare constant resolves to pgbus's own constant of
# that name first: real pgbus defines Pgbus::Process (and ~55 more), so a bare
# `Process.pid` in our code is `Pgbus::Process.pid` -> NoMethodError on the
# real stack. The list is spec/support/pgbus_namespace.txt.
RSpec.describe "constants shadowed by pgbus's namespace" do
  # Read here, not by loading the stand-in's namespace.rb: this process must
  # not gain pgbus's constants (other specs run without pgbus).
  let(:names) do
    File.readlines(File.join(ROOT, "spec/support/pgbus_namespace.txt"), chomp: true)
        .map(&:strip).reject { |line| line.empty? || line.start_with?("#") }
  end

  # [file, line, name] for every bare reference to a listed name: not after
  # `::` (top-level or a scope), not after `.` (a method), not the name being
  # defined by `class`/`module`, and not a name Pgbus::Hub defines itself
  # (lexical lookup finds ours first).
  def bare_references(names)
    ours = Pgbus::Hub.constants(false).map(&:to_s)
    Dir[File.join(ROOT, "lib", "**", "*.rb")].sort.flat_map do |file|
      tokens = Ripper.lex(File.read(file)).reject { |_, type, _| %i[on_sp on_ignored_nl on_nl on_comment].include?(type) }
      tokens.each_cons(2).filter_map do |(_, _, before), ((line, _), type, text)|
        next unless type == :on_const && names.include?(text) && !ours.include?(text)
        next if ["::", ".", "&.", "class", "module"].include?(before)

        [file.delete_prefix("#{ROOT}/"), line, text]
      end
    end
  end

  it "lib/ references none of them bare (write ::Process, ::Thread, ...)" do
    offenders = bare_references(names)
    expect(offenders).to be_empty, offenders.map { |f, l, n| "#{f}:#{l}: bare #{n}" }.join("\n")
  end

  it "the check itself finds a bare shadowed name" do
    expect(names).to include("Process", "Client", "Web", "Configuration")
    sample = Ripper.lex("module Pgbus\n  def x = Process.pid\nend\n")
    expect(sample.any? { |_, type, text| type == :on_const && text == "Process" }).to be(true)
  end

  # The stand-ins define every listed name, so the Puma and integration specs
  # run our code against the namespace real pgbus has.
  %w[pre382 v382].each do |shape|
    it "the #{shape} stand-in defines every name real pgbus defines under Pgbus::" do
      lib = File.join(ROOT, "spec/support/pgbus_standin", shape, "lib")
      script = <<~RUBY
        require "pgbus"
        require "pgbus/hub"
        missing = Pgbus.standin_namespace.reject { |name| Pgbus.const_defined?(name, false) && Pgbus.const_get(name) }
        puts missing.empty? ? "ok \#{Pgbus.standin_namespace.size}" : "missing \#{missing.join(' ')}"
        puts Pgbus::Process.is_a?(Module) && !Pgbus::Process.respond_to?(:pid) ? "shadowing" : "not shadowing"
      RUBY
      out, status = Open3.capture2e({ "RUBYLIB" => nil }, RbConfig.ruby, "-I", lib, "-I", File.join(ROOT, "lib"),
                                    "-e", script)
      expect(status).to be_success, out
      expect(out.lines.map(&:strip)).to eq(["ok #{names.size}", "shadowing"])
    end
  end
end
