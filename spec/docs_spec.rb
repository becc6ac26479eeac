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
end
