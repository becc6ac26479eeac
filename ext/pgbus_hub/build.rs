// Ruby loads the extension into a process that already has libruby's symbols;
// the extension is not linked against libruby. Linux and the BSDs allow a
// shared library's undefined symbols by default, Apple's linker does not, so on
// Apple targets they are resolved when Ruby loads the bundle (what mkmf and
// RubyGems' cargo builder pass there). rb-sys prints this flag from its own
// build script, but cargo applies a `rustc-link-arg` only to the package whose
// script printed it, never to a dependent's cdylib: it has to come from here.
fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    if std::env::var("CARGO_CFG_TARGET_VENDOR").as_deref() == Ok("apple") {
        println!("cargo:rustc-cdylib-link-arg=-Wl,-undefined,dynamic_lookup");
    }
}
