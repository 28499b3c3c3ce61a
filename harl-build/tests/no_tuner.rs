//! `HARL_TUNE=on` where the tuner is not installed, or is not a program: one warning that says
//! how to install it, and the build goes on with the default schedule. Its own process: it sets
//! `PATH`, `HOME` and `CARGO_HOME`.

use harl_build::{Builder, ScheduleSource, TuneMode};
use harl_te::ops::workloads;
use std::path::Path;

fn build(out: &Path) -> harl_build::Report {
    Builder::new()
        .quiet()
        .tune(TuneMode::On)
        .cache_dir(out.join("cache"))
        .out_dir(out)
        .kernel("mm", workloads::matmul(8, 8, 8).expect("matmul"))
        .try_compile()
        .expect("build step")
}

#[test]
fn without_a_tuner_the_build_says_how_to_get_one_and_uses_the_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    std::env::remove_var("HARL_TUNE");
    std::env::set_var("PATH", dir.path());
    std::env::set_var("HOME", dir.path());
    std::env::set_var("CARGO_HOME", dir.path().join("cargo"));
    std::env::set_var("CARGO_MANIFEST_DIR", dir.path());

    std::env::remove_var("HARL_TUNER");
    let r = build(&dir.path().join("a"));
    assert_eq!(r.kernels[0].source, ScheduleSource::Default);
    let said: Vec<_> = r.warnings.iter().filter(|w| w.contains("tuner")).collect();
    assert_eq!(said.len(), 1, "{:?}", r.warnings);
    assert!(said[0].contains("cargo install cargo-harl"), "{said:?}");
    // The manifest is written whatever the mode: `cargo harl tune` reads it.
    let m = harl_build::manifest::Manifest::read(&dir.path().join("a/harl/manifest.json"))
        .expect("manifest");
    assert_eq!(m.kernels.len(), 1);
    assert_eq!(m.kernels[0].name, "mm");

    // A tuner that is not a program (a directory): one warning, no panic.
    std::env::set_var("HARL_TUNER", dir.path());
    let r = build(&dir.path().join("b"));
    assert_eq!(r.kernels[0].source, ScheduleSource::Default);
    assert!(
        r.warnings.iter().any(|w| w.contains("could not tune")),
        "{:?}",
        r.warnings
    );
}
