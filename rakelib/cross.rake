# frozen_string_literal: true

# Other platforms than the host's glibc Linux (issue 45): the core's whole test
# suite as musl binaries (they run on this Linux, against PostgreSQL), and the
# core type-checked for macOS and FreeBSD (bin/cross-check, in the sid chroot).

namespace :cross do
  MUSL_TARGET = "x86_64-unknown-linux-musl"

  desc "The core's whole test suite built for #{MUSL_TARGET} (static binaries, musl-gcc for ring's C) " \
       "and run here against PostgreSQL, in a database of its own"
  task :musl_test do
    unless system("dpkg -s musl-tools >/dev/null 2>&1")
      sh "apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq musl-tools >/dev/null"
    end
    installed = IO.popen(%w[rustup target list --installed], &:read).split
    sh "rustup", "target", "add", MUSL_TARGET unless installed.include?(MUSL_TARGET)
    with_run_database do
      sh({ "CARGO_TARGET_DIR" => TARGET_DIR, "CC_x86_64_unknown_linux_musl" => "musl-gcc" },
         "cargo", "test", "--locked", "--target", MUSL_TARGET, "-p", "pgbus-hub-core")
    end
  end

  desc "The core (with its tests) type-checked for aarch64/x86_64-apple-darwin and x86_64-unknown-freebsd " \
       "(bin/cross-check in the sid chroot; a type check only, nothing runs)"
  task :check do
    sh "bin/sid", "bin/cross-check"
  end
end
