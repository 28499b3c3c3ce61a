//! `HARL_TUNE=on` in a build: the kernel is tuned on this machine, the winner is recorded in the
//! cache and used, and a second build takes it from the cache without tuning.
#![cfg(feature = "tune")]

use harl_build::cache::TuningCache;
use harl_build::target::TargetFingerprint;
use harl_build::{Builder, ScheduleSource, TuneMode};
use harl_te::ops::workloads;

#[test]
fn tuning_records_the_winner_and_the_next_build_uses_it() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // What cargo sets for a crate that depends on harl (its `links` metadata).
    std::env::set_var("DEP_HARL_ROOT", &root);
    std::env::set_var("HARL_TRIALS", "16");
    std::env::set_var("HARL_SEED", "5");
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    // The measurer's build directory is shared with the other measuring tests.
    let out = root.join("target/tune-build-test");
    let graph = workloads::matmul(64, 64, 64).expect("matmul");
    let build = |mode| {
        Builder::new()
            .quiet()
            .tune(mode)
            .cache_dir(&cache)
            .out_dir(&out)
            .kernel("mm", graph.clone())
            .try_compile()
            .expect("build step")
    };
    let tuned = build(TuneMode::On);
    assert!(
        matches!(tuned.kernels[0].source, ScheduleSource::Tuned { trials, .. } if trials > 0),
        "{:?} / {:?}",
        tuned.kernels[0].source,
        tuned.warnings
    );
    assert!(
        tuned.warnings.iter().any(|w| w.contains("recorded in")),
        "{:?}",
        tuned.warnings
    );
    let (records, warnings) =
        TuningCache::new(&cache).records(&TargetFingerprint::host().isa_class);
    assert_eq!(records.len(), 1, "{warnings:?}");
    assert_eq!(records[0].workload_key, graph.workload_key());
    let again = build(TuneMode::Cache);
    assert!(
        matches!(again.kernels[0].source, ScheduleSource::CacheExact { .. }),
        "{:?}",
        again.kernels[0].source
    );
}
