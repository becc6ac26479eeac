// Ruby loads the extension into a process that already has libruby's symbols;
// the extension is not linked against libruby. Linux and the BSDs allow a
// shared library's undefined symbols by default, Apple's linker does not, so on
// Apple targets they are resolved when Ruby loads the bundle (what mkmf and
// RubyGems' cargo builder pass there). rb-sys prints this flag from its own
// build script, but cargo applies a `rustc-link-arg` only to the package whose
// script printed it, never to a dependent's cdylib: it has to come from here.
//
// -dead_strip_dylibs: tokio-postgres's `whoami` 2 links SystemConfiguration and
// CoreFoundation on Apple targets for its device name, which nothing here asks
// for (the user name comes from getpwuid_r in libSystem); no symbol of theirs is
// left after dead stripping, and this drops their load commands, so the bundle
// needs libSystem alone (issue 55; `rake native:darwin` checks it).
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_VENDOR").as_deref() == Ok("apple") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-undefined,dynamic_lookup");
        println!("cargo:rustc-cdylib-link-arg=-Wl,-dead_strip_dylibs");
    }
}
