//! Builds the shipped kernels (listed in `registry.rs`) with harl: schedules from this
//! package's own tuning cache (`tuning-cache/`, published with the crate) where it has a
//! record, else harl's default.

use std::path::PathBuf;

include!("registry.rs");

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    println!("cargo:rerun-if-changed=registry.rs");
    let builder = harl_build::Builder::new().cache_dir(manifest.join("tuning-cache"));
    registry()?
        .into_iter()
        .fold(builder, |b, (name, graph)| b.kernel(name, graph))
        .compile();
    Ok(())
}
