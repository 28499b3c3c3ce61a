//! The Builder's schedule choice: cache records are validated, bad ones warn and fall back.

use harl_build::cache::{Record, TuningCache};
use harl_build::schedule::{Schedule, Step};
use harl_build::target::TargetFingerprint;
use harl_build::{Builder, ScheduleSource, TuneMode};
use harl_te::ops::workloads;

fn build(cache: &std::path::Path, out: &std::path::Path, mode: TuneMode) -> harl_build::Report {
    Builder::new()
        .quiet()
        .tune(mode)
        .cache_dir(cache)
        .out_dir(out)
        .kernel("mm", workloads::matmul(16, 8, 32).expect("matmul"))
        .try_compile()
        .expect("build step succeeds")
}

fn record(schedule: Schedule) -> Record {
    let key = workloads::matmul(16, 8, 32).expect("matmul").workload_key();
    Record::new(
        key,
        "matmul 16x8x32",
        TargetFingerprint::host(),
        schedule,
        1e-5,
        10,
    )
}

#[test]
fn empty_cache_uses_the_default_schedule() {
    let dir = tempfile::tempdir().expect("tempdir");
    let r = build(
        &dir.path().join("cache"),
        &dir.path().join("out"),
        TuneMode::Cache,
    );
    assert_eq!(r.kernels[0].source, ScheduleSource::Default);
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let code = std::fs::read_to_string(dir.path().join("out/harl/kernels.rs")).expect("generated");
    assert!(code.contains("pub mod mm"));
    assert!(code.contains("target_feature(enable = \"avx512f"));
}

#[test]
fn a_valid_record_is_used_and_off_ignores_it() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let steps = vec![
        Step::Split {
            stage: 0,
            at: 1,
            factors: vec![16],
        },
        Step::CacheWrite { stage: 0, at: 1 },
        Step::Vectorize { stage: 0, at: 3 },
    ];
    TuningCache::new(&cache)
        .append(&record(Schedule { steps }))
        .expect("append");
    let r = build(&cache, &dir.path().join("out"), TuneMode::Cache);
    assert!(
        matches!(r.kernels[0].source, ScheduleSource::CacheExact { .. }),
        "{:?}",
        r.kernels[0].source
    );
    let r = build(&cache, &dir.path().join("out2"), TuneMode::Off);
    assert_eq!(r.kernels[0].source, ScheduleSource::Default);
}

/// A record whose tune the default won sends the build to this harl's default schedule: the
/// kernel's code is the empty cache's, whatever (older) schedule the record holds, and the
/// record still counts as this target's, so a build does not tune the kernel again.
#[test]
fn a_record_the_default_won_builds_todays_default() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let plain = build(
        &dir.path().join("empty"),
        &dir.path().join("out0"),
        TuneMode::Cache,
    );
    assert_eq!(plain.kernels[0].source, ScheduleSource::Default);
    // An older default: a valid schedule unlike today's.
    let old_default = Schedule {
        steps: vec![Step::Split {
            stage: 0,
            at: 1,
            factors: vec![4],
        }],
    };
    TuningCache::new(&cache)
        .append(&record(old_default.clone()).with_default_won(true))
        .expect("append");
    let r = build(&cache, &dir.path().join("out1"), TuneMode::Cache);
    assert!(
        matches!(
            r.kernels[0].source,
            ScheduleSource::CacheExact {
                default_won: true,
                ..
            }
        ),
        "{:?}",
        r.kernels[0].source
    );
    assert!(r.warnings.is_empty(), "{:?}", r.warnings);
    let module = |out: &str| {
        let code = std::fs::read_to_string(dir.path().join(out).join("harl/kernels.rs"))
            .expect("generated");
        // The kernels' code, without the schedule-source strings that name the cache.
        code.lines()
            .filter(|l| !l.contains("tuning cache") && !l.contains("default schedule"))
            .collect::<Vec<_>>()
            .join("\n")
    };
    assert_eq!(module("out1"), module("out0"));
    // The same schedule without the mark is replayed as recorded: other code.
    let cache2 = dir.path().join("cache2");
    TuningCache::new(&cache2)
        .append(&record(old_default))
        .expect("append");
    build(&cache2, &dir.path().join("out2"), TuneMode::Cache);
    assert_ne!(module("out2"), module("out0"));
}

#[test]
fn corrupt_future_and_invalid_records_warn_and_fall_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let store = TuningCache::new(&cache);
    // An invalid schedule: loop 99 does not exist.
    let bad = record(Schedule {
        steps: vec![Step::Split {
            stage: 0,
            at: 99,
            factors: vec![2],
        }],
    });
    store.append(&bad).expect("append");
    let file = store.path_for(&TargetFingerprint::host().isa_class);
    let mut text = std::fs::read_to_string(&file).expect("read");
    text.push_str("{ this is not json\n");
    let future =
        serde_json::json!({ "version": 99, "workload_key": bad.workload_key, "new_field": 1 });
    text.push_str(&format!("{future}\n"));
    std::fs::write(&file, text).expect("write");
    let r = build(&cache, &dir.path().join("out"), TuneMode::Cache);
    assert_eq!(r.kernels[0].source, ScheduleSource::Default);
    let all = r.warnings.join("\n");
    assert!(
        all.contains("loop") || all.contains("99"),
        "invalid schedule not reported: {all}"
    );
    assert!(
        all.contains("version"),
        "future version not reported: {all}"
    );
    assert!(r.warnings.len() >= 3, "{all}");
    // The generated kernel is the default one and still builds a module.
    let code = std::fs::read_to_string(dir.path().join("out/harl/kernels.rs")).expect("generated");
    assert!(code.contains("default schedule"));
}

#[test]
fn invalid_registered_kernel_is_a_typed_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let err = Builder::new()
        .quiet()
        .out_dir(dir.path())
        .kernel("not an ident", workloads::matmul(2, 2, 2).expect("matmul"))
        .try_compile()
        .expect_err("bad name");
    assert!(err.to_string().contains("identifier"));
}

/// GPU code: a `cuda-sm_90.jsonl` record gives a program tuned for sm_90 beside the default
/// one (when NVRTC is there to make PTX; otherwise both are warnings and the kernel has no
/// PTX); a CPU schedule filed as a GPU record is rejected with a warning.
#[test]
fn gpu_records_are_picked_per_compute_capability() {
    use harl_build::gpu_sketch::GpuSketch;
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    let g = workloads::matmul(16, 8, 32).expect("matmul");
    let sk = GpuSketch::new(&g).expect("sketch");
    let gpu_schedule = sk.to_schedule(&sk.default_params()).expect("valid");
    let fp = TargetFingerprint::cuda("NVIDIA H200", (9, 0), 12090, 132);
    let tc = TuningCache::new(&cache);
    let mut good = record(gpu_schedule);
    good.target = fp.clone();
    assert!(tc
        .append(&good)
        .expect("append")
        .ends_with("cuda-sm_90.jsonl"));
    let mut cpu_as_gpu = record(Schedule::naive());
    cpu_as_gpu.target = TargetFingerprint::cuda("NVIDIA A100", (8, 0), 12090, 108);
    tc.append(&cpu_as_gpu).expect("append");
    let out = dir.path().join("out");
    let r = Builder::new()
        .quiet()
        .cuda(true)
        .cache_dir(&cache)
        .out_dir(&out)
        .kernel("mm", g)
        .try_compile()
        .expect("build step succeeds");
    let code = std::fs::read_to_string(out.join("harl/kernels.rs")).expect("generated");
    assert!(
        code.contains("pub static GPU: ::harl::gpu::GpuKernel"),
        "{code}"
    );
    assert!(
        r.warnings.iter().any(|w| w.contains("not a GPU schedule")),
        "{:?}",
        r.warnings
    );
    let has_ptx = code.contains(".entry harl_nest0");
    if has_ptx {
        assert!(code.contains("tuned_for: Some((9, 0))"), "{code}");
        assert!(code.contains("tuned_for: None"), "{code}");
        assert!(!code.contains("Some((8, 0))"));
    } else {
        assert!(
            r.warnings
                .iter()
                .any(|w| w.contains("no tuned GPU code for sm_90")),
            "{:?}",
            r.warnings
        );
    }
}
