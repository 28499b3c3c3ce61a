//! `HARL_TUNE=on` in a build: the build script hands its kernels to the installed tuner (this
//! package's `cargo-harl`, named by `HARL_TUNER`), the winner is recorded in the cache and used,
//! and a second build takes it from the cache without tuning.

use harl_build::cache::TuningCache;
use harl_build::target::TargetFingerprint;
use harl_build::{Builder, ScheduleSource, TuneMode};
use harl_te::ops::workloads;

/// The environment of a build that tunes, the same in every test of this file (they share
/// the process); returns the workspace root.
fn tuning_env() -> std::path::PathBuf {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // What cargo sets for a crate that depends on harl (its `links` metadata).
    std::env::set_var("DEP_HARL_ROOT", &root);
    std::env::set_var("HARL_TUNER", env!("CARGO_BIN_EXE_cargo-harl"));
    std::env::set_var("HARL_TRIALS", "16");
    std::env::set_var("HARL_SEED", "5");
    root
}

#[test]
fn tuning_records_the_winner_and_the_next_build_uses_it() {
    let root = tuning_env();
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
    // The tuner's progress went to a log in OUT_DIR, and its trials to a trial log.
    let log = std::fs::read_to_string(out.join("harl/tune.log")).expect("tune.log");
    assert!(log.contains("16/16 trials"), "{log}");
    assert!(
        out.join("harl/tune-log")
            .read_dir()
            .expect("trial logs")
            .count()
            >= 1
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

/// A cache directory the build cannot write (a vendored or read-only checkout; as root, whose
/// writes permissions do not stop, the lock file's path is taken by a directory): the tune's
/// winner is used, the build warns once, keeps the record in OUT_DIR, and the next build
/// takes it from there instead of tuning again.
#[test]
fn a_read_only_cache_is_tuned_once_and_remembered_in_out_dir() {
    let root = tuning_env();
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    let lock = TuningCache::new(&cache).path_for(&TargetFingerprint::host().isa_class);
    std::fs::create_dir(format!("{}.lock", lock.display())).expect("occupy the lock path");
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o555)).expect("chmod");
    }
    // Kept between runs for the measurer's build directory; what an earlier run remembered
    // is removed.
    let out = root.join("target/tune-build-test-ro");
    let _ = std::fs::remove_dir_all(out.join("harl"));
    let graph = workloads::matmul(48, 32, 40).expect("matmul");
    let build = || {
        Builder::new()
            .quiet()
            .tune(TuneMode::On)
            .cache_dir(&cache)
            .out_dir(&out)
            .kernel("mm_ro", graph.clone())
            .try_compile()
            .expect("the build succeeds with a read-only cache")
    };
    let first = build();
    assert!(
        matches!(first.kernels[0].source, ScheduleSource::Tuned { .. }),
        "{:?} / {:?}",
        first.kernels[0].source,
        first.warnings
    );
    let said: Vec<_> = first
        .warnings
        .iter()
        .filter(|w| w.contains("could not record it"))
        .collect();
    assert_eq!(said.len(), 1, "{:?}", first.warnings);
    assert!(said[0].contains("kept it in OUT_DIR"), "{said:?}");
    let second = build();
    assert!(
        matches!(second.kernels[0].source, ScheduleSource::CacheExact { .. }),
        "the second build tuned again: {:?} / {:?}",
        second.kernels[0].source,
        second.warnings
    );
    // (Beside the note that tests run harl-build unoptimised.)
    assert!(
        second
            .warnings
            .iter()
            .all(|w| !w.contains("tuned") && !w.contains("record")),
        "{:?}",
        second.warnings
    );
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&cache, std::fs::Permissions::from_mode(0o755));
    }
}

/// `HARL_TUNE=on` with GPU code on a machine without a GPU: the build succeeds, says why the
/// GPU schedule was not tuned (the tool's note), and ships the default GPU program.
#[test]
fn gpu_tuning_without_a_gpu_is_a_warning() {
    tuning_env();
    #[cfg(feature = "cuda")]
    if harl_tune::measure::gpu::GpuMeasurer::new(Default::default()).is_ok() {
        eprintln!("skipped: this machine has a GPU, so its GPU schedule is tuned");
        return;
    }
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("out");
    let r = Builder::new()
        .quiet()
        .cuda(true)
        .tune(TuneMode::On)
        .cache_dir(dir.path().join("cache"))
        .out_dir(&out)
        .kernel("mm", workloads::matmul(16, 8, 32).expect("matmul"))
        .try_compile()
        .expect("build step succeeds");
    assert!(
        r.warnings
            .iter()
            .any(|w| w.contains("not tuning its GPU schedule")),
        "{:?}",
        r.warnings
    );
    let code = std::fs::read_to_string(out.join("harl/kernels.rs")).expect("generated");
    assert!(code.contains("pub static GPU: ::harl::gpu::GpuKernel"));
}
