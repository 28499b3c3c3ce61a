//! Tells dependents' build scripts where this crate's source is (`DEP_HARL_ROOT`), so harl's
//! tuner can build measurement workers against the same runtime.

fn main() {
    if let Some(dir) = std::env::var_os("CARGO_MANIFEST_DIR") {
        println!("cargo:root={}", std::path::Path::new(&dir).display());
    }
    println!("cargo:rerun-if-changed=build.rs");
}
