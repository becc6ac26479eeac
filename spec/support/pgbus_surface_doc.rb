# frozen_string_literal: true

# The tables of docs/pgbus-surface.md, written from spec/support/pgbus_calls.rb (the list the
# contract spec exercises) and Pgbus::Hub::PgbusSurface::NEEDS (the boot check's), between the
# page's two markers.
require_relative "pgbus_calls"

module PgbusSurfaceDoc
  PAGE = File.expand_path("../../docs/pgbus-surface.md", __dir__)
  BEGIN_MARK = "<!-- surface tables: written by `rake docs:surface` from spec/support/pgbus_calls.rb and " \
               "lib/pgbus/hub/pgbus_adapter.rb -->"
  END_MARK = "<!-- end of surface tables -->"

  module_function

  def releases(first, before)
    return "before #{before}" if before

    "#{first}+"
  end

  def tables
    lines = ["### What pgbus calls on the objects pgbus-hub hands it", ""]
    PgbusCalls::OBJECTS.each do |object, (first, before, built_by, ours)|
      lines << "**#{built_by}** (pgbus #{releases(first, before)}) returns `#{ours}`; " \
               "exercised #{PgbusCalls::STATES.fetch(object).join(', ')}:" << ""
      lines << "| method | pgbus | result | meaning |" << "| --- | --- | --- | --- |"
      PgbusCalls::CALLS.select { |call| call.object == object }.each do |call|
        result = call.values ? "#{call.result}: #{call.values.map { |state, value| "#{state} #{value}" }.join(', ')}" : call.result
        lines << "| `#{call.method}#{"(#{call.args})" unless call.args.empty?}` | #{call.since ? "#{call.since}+" : 'all'} | " \
                 "#{result} | #{call.meaning} |"
      end
      lines << ""
    end
    lines << "### What pgbus-hub needs of pgbus (checked at install)" << ""
    lines << "| shape | constant | needs |" << "| --- | --- | --- |"
    Pgbus::Hub::PgbusSurface::NEEDS.each do |shape, needs|
      needs.each { |path, kind, names| lines << "| #{shape} | `#{path}` | #{kind}#{": #{names.join(', ')}" unless names.empty?} |" }
    end
    lines.join("\n")
  end

  def section(text = File.read(PAGE))
    from = text.index(BEGIN_MARK) or raise "#{PAGE}: no #{BEGIN_MARK}"
    to = text.index(END_MARK) or raise "#{PAGE}: no #{END_MARK}"
    [from + BEGIN_MARK.size, to]
  end

  def current?
    from, to = section
    File.read(PAGE)[from...to].strip == tables.strip
  end

  def write!
    text = File.read(PAGE)
    from, to = section(text)
    File.write(PAGE, "#{text[0...from]}\n#{tables}\n#{text[to..]}")
  end
end
