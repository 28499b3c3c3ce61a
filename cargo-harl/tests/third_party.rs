//! A crate the user does not own (unpacked from a registry or checked out by cargo under
//! `CARGO_HOME`, or vendored) is never tuned and its cache never written, whatever `HARL_TUNE`
//! says. Its own process: it sets `CARGO_HOME` and `CARGO_MANIFEST_DIR`.

use harl_build::{Builder, ScheduleSource, TuneMode};
use harl_te::ops::workloads;
use std::path::Path;

fn build(cache: &Path, out: &Path) -> harl_build::Report {
    Builder::new()
        .quiet()
        .tune(TuneMode::On)
        .cache_dir(cache)
        .out_dir(out)
        .kernel("mm", workloads::matmul(16, 8, 32).expect("matmul"))
        .try_compile()
        .expect("build step")
}

fn assert_untouched(r: &harl_build::Report, cache: &Path, what: &str) {
    assert_eq!(r.kernels[0].source, ScheduleSource::Default, "{what}");
    assert!(
        r.warnings
            .iter()
            .all(|w| !w.contains("tun") || w.contains("unoptimised")),
        "{what}: {:?}",
        r.warnings
    );
    assert!(!cache.exists(), "{what}: the cache was written");
}

#[test]
fn registry_git_and_vendored_crates_are_never_tuned_nor_written() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // Were tuning to start, it could: the crate depends on harl.
    std::env::set_var("DEP_HARL_ROOT", &root);
    std::env::set_var("HARL_TUNER", env!("CARGO_BIN_EXE_cargo-harl"));
    std::env::set_var("HARL_TRIALS", "4");
    std::env::remove_var("HARL_TUNE");
    let home = tempfile::tempdir().expect("tempdir");
    std::env::set_var("CARGO_HOME", home.path());

    // A registry crate: its manifest dir and its default cache lie under CARGO_HOME.
    let krate = home
        .path()
        .join("registry/src/index.example-1/some-kernels-0.3.1");
    std::fs::create_dir_all(&krate).expect("mkdir");
    std::env::set_var("CARGO_MANIFEST_DIR", &krate);
    let cache = krate.join("tuning-cache");
    let r = build(&cache, &home.path().join("out1"));
    assert_untouched(&r, &cache, "registry crate");

    // A git dependency, through a symlinked CARGO_HOME path and a cache dir not created yet.
    let link = home.path().join("link");
    #[cfg(unix)]
    std::os::unix::fs::symlink(home.path(), &link).expect("symlink");
    #[cfg(unix)]
    std::env::set_var("CARGO_HOME", &link);
    let krate = home.path().join("git/checkouts/kernels-1a2b/3c4d");
    std::fs::create_dir_all(&krate).expect("mkdir");
    std::env::set_var("CARGO_MANIFEST_DIR", &krate);
    let cache = krate.join("nested/tuning-cache");
    let r = build(&cache, &home.path().join("out2"));
    assert_untouched(&r, &cache, "git checkout");

    // A vendored crate outside CARGO_HOME.
    let elsewhere = tempfile::tempdir().expect("tempdir");
    let krate = elsewhere.path().join("vendor/some-kernels");
    std::fs::create_dir_all(&krate).expect("mkdir");
    std::fs::write(krate.join(".cargo-checksum.json"), "{}").expect("write");
    std::env::set_var("CARGO_MANIFEST_DIR", &krate);
    let cache = krate.join("tuning-cache");
    let r = build(&cache, &elsewhere.path().join("out3"));
    assert_untouched(&r, &cache, "vendored crate");

    // A crate of the user's own whose HARL_CACHE_DIR points into CARGO_HOME.
    let own = elsewhere.path().join("mine");
    std::fs::create_dir_all(&own).expect("mkdir");
    std::env::set_var("CARGO_MANIFEST_DIR", &own);
    let cache = home.path().join("registry/cache-dir");
    let r = build(&cache, &elsewhere.path().join("out4"));
    assert_untouched(&r, &cache, "cache dir under CARGO_HOME");
}
