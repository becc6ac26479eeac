# frozen_string_literal: true

# The docs stay true to the tree: every relative link in the README and
# docs/ resolves (file and, for #anchors, heading), and every `file:function`
# step of docs/architecture.md's call chains names a function that exists.
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

  it "names in the call chains only functions that exist" do
    steps = File.read(File.join(ROOT, "docs", "architecture.md")).scan(/`((?:ext|lib)\/[\w\/.]+\.(?:rs|rb)):(\w+)`/)
    expect(steps.size).to be > 30
    missing = steps.uniq.reject do |file, name|
      path = File.join(ROOT, file)
      File.exist?(path) && File.read(path).match?(/\b(?:fn|def)\s+(?:self\.)?#{name}\b/)
    end
    expect(missing).to eq([])
  end

  # The state words (FailoverState, ListenerState) are defined once, in the core's `as_str`; the
  # docs that show them (architecture.md's diagrams, api.md's lists) use exactly those words.
  it "names the listeners' states with the words of their one list" do
    words = lambda do |file|
      File.read(File.join(ROOT, "ext/pgbus_hub_core/src", file))[/fn as_str.*?\n    \}/m].scan(/=> "(\w+)"/).flatten
    end
    failover = words.call("failover/state.rs")
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
end
