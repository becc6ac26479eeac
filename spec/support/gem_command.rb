# frozen_string_literal: true

require "rbconfig"

# The `gem` command of the Ruby running this code (Debian: gem3.4 beside ruby3.4;
# a plain `gem` on PATH may belong to another Ruby). Used by the specs and the Rakefile.
GEM_COMMAND = File.join(RbConfig::CONFIG["bindir"], RbConfig::CONFIG["ruby_install_name"].sub("ruby", "gem"))
