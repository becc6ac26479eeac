# frozen_string_literal: true

# The docs stay true to the tree: every relative link in the README and
# docs/ resolves (file and, for #anchors, heading), and every `path:Type::function`
# anchor (the call chains of docs/architecture.md) names a function that exists where it says.
RSpec.describe "docs" do
  pages = [File.join(ROOT, "README.md"), *Dir[File.join(ROOT, "docs", "*.md")]]

  # GitHub's heading anchors: lowercase, punctuation dropped, spaces to hyphens.
  def anchors(path)
    File.read(path).scan(/^#+ (.+)$/).map do |(title)|
      title.downcase.gsub(/[^\p{Alnum}\- _]/, "").tr(" ", "-")
    end
  end

  it "links only to files and headings that exist" do
    broken = pages.flat_map do |page|
      File.read(page).scan(/\]\(([^)\s]+)\)/).flatten.filter_map do |target|
        next if target.match?(%r{\A[a-z]+://})

        file, anchor = target.split("#", 2)
        path = file.empty? ? page : File.expand_path(file, File.dirname(page))
        next "#{File.basename(page)} -> #{target} (no such file)" unless File.exist?(path)
        next if anchor.nil? || File.directory?(path) || !path.end_with?(".md")

        "#{File.basename(page)} -> #{target} (no such heading)" unless anchors(path).include?(anchor)
      end
    end
    expect(broken).to eq([])
  end

  # Every fn of a Rust file, as "Type::name" inside an `impl Type`, `impl Trait for Type` or
  # `trait Type` block, else "name". Comments and literals are blanked first, so only code's
  # braces count; each `{` opens a block whose header (the code since the last `{`, `}` or `;`)
  # says whether it is an impl or trait.
  def rust_functions(text)
    code = text.gsub(%r{//[^\n]*|/\*.*?\*/|\bb?r(#*)".*?"\1|"(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])'}m) { |s| s.gsub(/[^\n]/, " ") }
    blocks = [] # per open block: its type (impl, trait) or nil
    header = +""
    code.to_enum(:scan, /\bfn\s+(\w+)|[{};]|[^{};]+?(?=\bfn\b|[{};]|\z)/m).filter_map do
      token, name = Regexp.last_match.values_at(0, 1)
      if name.nil? && !"{};".include?(token)
        header << token
        next
      end
      blocks << block_type(header) if token == "{"
      blocks.pop if token == "}"
      header = +""
      [blocks.last, name].compact.join("::") if name
    end
  end

  def block_type(header)
    header = header.sub(/\bwhere\b.*/m, "")
    header = header.gsub(/<[^<>]*>/, "") while header.match?(/<[^<>]*>/) # generics, innermost first
    header[/\btrait\s+(\w+)/, 1] || header[/\bimpl\s+(?:.*\bfor\s+)?&?(?:\w+::)*(\w+)\s*\z/m, 1]
  end

  # Every def of a Ruby file, as "Mod::Class#name" or "Mod::Class.name" (a singleton method),
  # else "name"; the namespaces open at a def are those indented less than it.
  def ruby_methods(text)
    open = [] # [indent, name] per open class or module; name :self for `class << self`
    text.each_line.filter_map do |line|
      indent = line[/\A */].size
      namespace = line[/\A *(?:class|module) +([A-Z][\w:]*)/, 1] ||
                  line[/\A *([A-Z]\w*) *= *(?:Struct|Class|Data)\.(?:new|define)\b/, 1] ||
                  (:self if line.match?(/\A *class *<< *self\b/))
      method = line.match(/\A *(?:(?:private|protected|public|module_function) +)?def +(self\.)?(\w+[?!=]?)/)
      next unless namespace || method

      open = open.reject { |i, _| i >= indent }
      if namespace
        open << [indent, namespace]
        next
      end

      names = open.map(&:last)
      owner = (names - [:self]).join("::")
      separator = method[1] || names.last == :self ? "." : "#"
      owner.empty? ? method[2] : "#{owner}#{separator}#{method[2]}"
    end
  end

  # Anchors (docs/architecture.md's "Call chains" says the form): `path:Type::method` for a
  # method, `path:function` for a free function, `path:Mod::Class#method` / `path:Mod.method` in Ruby.
  it "anchors every `path:function` at a function of that name and type in that file" do
    steps = pages.flat_map { |page| File.read(page).scan(/`((?:ext|lib)\/[\w\/.]+\.(?:rs|rb)):([\w:#.?!]+)`/) }.uniq
    expect(steps.size).to be > 30
    wrong = steps.filter_map do |file, name|
      path = File.join(ROOT, file)
      next "#{file}:#{name} (no such file)" unless File.exist?(path)

      defined = file.end_with?(".rb") ? ruby_methods(File.read(path)) : rust_functions(File.read(path))
      next if defined.include?(name)

      same_name = defined.select { |d| d.split(/::|#|\./).last == name.split(/::|#|\./).last }
      "#{file}:#{name} (#{same_name.empty? ? "no such function" : "defined as #{same_name.join(", ")}"})"
    end
    expect(wrong).to eq([])
  end

  # The state words (FailoverState, ListenerState) are defined once, in the core's `as_str`; the
  # docs that show them (architecture.md's diagrams, api.md's lists) use exactly those words.
  it "names the listeners' states with the words of their one list" do
    words = lambda do |file|
      File.read(File.join(ROOT, "ext/pgbus_hub_core/src", file))[/fn as_str.*?\n    \}/m].scan(/=> "(\w+)"/).flatten
    end
    failover = words.call("failover_state.rs")
    listener = words.call("listener/state.rs")
    expect(failover).to eq(%w[on_hub failing_over failed_over failing_back standalone unserved stopped])
    expect(listener).to eq(%w[connecting listening handing_over reconnecting stopped])
    architecture = File.read(File.join(ROOT, "docs", "architecture.md"))
    diagrams = architecture.scan(/^\*\*[56]\. .*?^```\n(.*?)^```/m).flatten
    expect(diagrams.size).to eq(2)
    expect(failover.reject { |w| diagrams[0].match?(/(?<![\w])#{w}(?![\w])/) }).to eq([])
    expect(listener.reject { |w| diagrams[1].match?(/(?<![\w])#{w}(?![\w])/) }).to eq([])
    # No other state words in the diagrams (the old ones were capitals: ON HUB, COMING BACK).
    expect(diagrams.join.scan(/\b[A-Z]{2,}(?: [A-Z]{2,})*\b/) - %w[ERROR DEBUG LISTEN UNLISTEN EOF]).to eq([])
    api = File.read(File.join(ROOT, "docs", "api.md"))
    [failover, listener].each { |list| expect(list.reject { |w| api.include?("`#{w}`") }).to eq([]) }
  end

  # api.md lists the hub's `stats` keys: exactly HubStats::fields' keys (the one field list).
  it "lists exactly the stats keys HubStats::fields puts" do
    fields = File.read(File.join(ROOT, "ext/pgbus_hub_core/src/hub/mod.rs"))[/pub fn fields\(.*?\n    \}/m]
    keys = fields.scan(/put\(\s*"(\w+)"/).flatten
    expect(keys.size).to be > 20
    listed = File.read(File.join(ROOT, "docs", "api.md"))[/`stats` keys: `([^`]+)`/m, 1].split
    expect(listed).to match_array(keys)
  end

  # A metric's help text and docs/monitoring.md's row say the same about what it counts: an
  # enumeration in the help's parentheses stands in the row too (the row may say more).
  it "describes each metric in monitoring.md with its help text's enumeration" do
    metrics = File.read(File.join(ROOT, "ext/pgbus_hub_core/src/hub/metrics.rs"))
                  .scan(/\(\s*"\w+",\s*"(pgbus_hub_\w+)",\s*"((?:[^"\\]|\\.)*)",?\s*\)/m)
    expect(metrics.size).to be > 10
    monitoring = File.read(File.join(ROOT, "docs", "monitoring.md")).delete("`")
    differing = metrics.filter_map do |metric, help|
      row = monitoring[/^\| #{metric}(?:\{[^|]*\})? \|[^\n]*/] or next "#{metric}: no row"
      list = help[/\(([^()]*,[^()]*)\)/, 1] or next
      "#{metric}: help (#{list}), row: #{row.split(" | ").last}" unless row.include?("(#{list})")
    end
    expect(differing).to eq([])
  end

  # The intra-doc links of module docs (`//! ... [`name`]`) name a module or item the file
  # declares or imports: a renamed module leaves no dangling link (cargo doc would warn).
  it "resolves every module doc's [`name`] link in the file that has it" do
    dangling = Dir[File.join(ROOT, "ext/*/src/**/*.rs")].flat_map do |path|
      text = File.read(path)
      names = text.scan(%r{^\s*//!.*$}).join("\n").scan(/\[`([a-z_][a-z0-9_]*)`\](?![(\[])/).flatten.uniq
      names.reject { |name| text.match?(/\b(?:mod|fn|struct|enum|trait|type|const|static)\s+#{name}\b|\buse\s[^;]*\b#{name}\b/) }
           .map { |name| "#{path.delete_prefix("#{ROOT}/")}: [`#{name}`]" }
    end
    expect(dangling).to eq([])
  end
end
