# frozen_string_literal: true

require "open3"

# The suite's own queries (census, NOTIFY, terminating its hubs' backends, creating a database) on
# a Ruby without ruby-pg: Debian builds `pg` for its default Ruby only, so Ruby 3.4 in CI has none.
# One psql session per connection; answers the calls the specs make on a PG::Connection (exec,
# exec_params, quote_ident, escape_literal, close, finished?) with results that answer getvalue,
# values, ntuples, column_values, first and to_a (SQL NULL as nil). The gem's own uses of ruby-pg (the
# status command's census, the ActionCable adapter's broadcasts) are not replaced: on such a Ruby
# the status command reports that its census needs it (spec/status_spec.rb checks that).
class PsqlConnection
  DONE = "--pgbus-hub-psql-done--"
  NULL = "\x1a" # psql prints it for SQL NULL (as ruby-pg's nil)
  Error = Class.new(StandardError)

  Result = Struct.new(:fields, :rows) do
    def getvalue(row, column) = rows.fetch(row)[column]
    def values = rows
    def ntuples = rows.size
    def column_values(column) = rows.map { |row| row[column] }
    def first = rows.first && fields.zip(rows.first).to_h
    def to_a = rows.map { |row| fields.zip(row).to_h }
  end

  def initialize(url)
    @stdin, @stdout, @stderr, @process = Open3.popen3("psql", "-X", "-w", "-q", "-A", "-F", "\x1f", "-R", "\x1e",
                                                      "-P", "footer=off", "-P", "null=#{NULL}", url)
    exec("select 1") # fails here, as PG.connect would, when the server does not answer
  end

  def exec(sql)
    raise Error, "connection is closed" if finished?

    begin
      @stdin.write("#{sql.sub(/;\s*\z/, '')};\n\\echo #{DONE}\n")
      @stdin.flush
    rescue Errno::EPIPE # psql ended (could not connect, or the server closed the session)
      raise Error, read_errors.strip
    end
    output = +""
    while (line = @stdout.gets)
      break if line.chomp == DONE

      output << line
    end
    error = read_errors
    raise Error, error.strip unless error.empty? && line

    fields, *rows = output.chomp.split("\x1e", -1).map { |record| record.empty? ? [""] : record.split("\x1f", -1).map { |field| field unless field == NULL } }
    Result.new(fields || [], rows)
  end

  def exec_params(sql, params)
    exec(params.each_with_index.reverse_each.reduce(sql) do |text, (value, index)|
      text.gsub("$#{index + 1}", value.nil? ? "NULL" : escape_literal(value.to_s))
    end)
  end

  def escape_literal(text) = "'#{text.to_s.gsub("'", "''")}'"
  def quote_ident(name) = %("#{name.to_s.gsub('"', '""')}")
  def finished? = @stdin.closed? || !@process.alive?

  def close
    return if finished?

    @stdin.close
    @process.join(5)
  end

  private

  # psql writes an error to stderr before it runs the \echo that follows.
  def read_errors
    text = +""
    loop { text << @stderr.read_nonblock(65_536) }
  rescue IO::WaitReadable, EOFError
    text
  end
end
