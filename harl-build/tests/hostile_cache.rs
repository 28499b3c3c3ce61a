//! A tuning cache is data from someone else's crate release. Every hostile record and file
//! below must give what a corrupt line gives: warnings on one line each, and exactly the
//! generated code of a build with no cache at all. None may panic, hang or wrap a size.

use harl_build::cache::{Record, TuningCache};
use harl_build::schedule::{Schedule, Step};
use harl_build::target::TargetFingerprint;
use harl_build::{Builder, Report, ScheduleSource, TuneMode};
use harl_te::ops::workloads;
use harl_te::Graph;
use std::path::Path;
use std::time::{Duration, Instant};

fn graph() -> Graph {
    workloads::matmul(16, 8, 32).expect("matmul")
}

fn build(cache: &Path, out: &Path) -> Report {
    Builder::new()
        .quiet()
        .tune(TuneMode::Cache)
        .cache_dir(cache)
        .out_dir(out)
        .kernel("mm", graph())
        .try_compile()
        .expect("the build step never fails on cache content")
}

fn generated(out: &Path) -> String {
    std::fs::read_to_string(out.join("harl/kernels.rs")).expect("generated code")
}

/// A well-formed record line of `mm` on this machine, as JSON to edit.
fn record_json(steps: Vec<Step>) -> serde_json::Value {
    let r = Record::new(
        graph().workload_key(),
        "mm",
        TargetFingerprint::host(),
        Schedule { steps },
        1e-6,
        1,
    );
    serde_json::to_value(r).expect("serialize")
}

fn with_steps(steps: serde_json::Value) -> String {
    let mut v = record_json(vec![]);
    v["schedule"]["steps"] = steps;
    v.to_string()
}

fn cache_file(cache: &Path) -> std::path::PathBuf {
    TuningCache::new(cache).path_for(&TargetFingerprint::host().isa_class)
}

/// Lines that must each be rejected on their own.
fn hostile_lines() -> Vec<(&'static str, String)> {
    let big = u64::MAX;
    let mut lines = vec![
        // A step name with a newline: the serde error quotes it; it must not end a warning.
        (
            "newline in a step name",
            with_steps(serde_json::json!([{"step": "split\ncargo:rustc-cfg=harl_pwned", "stage": 0}])),
        ),
        (
            "carriage return and a unicode line separator",
            with_steps(serde_json::json!([{"step": "fuse\r\u{2028}cargo:rustc-env=X=1", "stage": 0}])),
        ),
        (
            "an overflowing fuse position",
            with_steps(serde_json::json!([{"step": "fuse", "stage": 0, "at": big}])),
        ),
        (
            "split factors that wrap to 4",
            with_steps(serde_json::json!([
                {"step": "split", "stage": 0, "at": 1, "factors": [4_611_686_018_427_387_905u64, 4]}
            ])),
        ),
        (
            "split factors whose product overflows",
            with_steps(serde_json::json!([
                {"step": "split", "stage": 0, "at": 1, "factors": [big, big, big]}
            ])),
        ),
        (
            "split factors that wrap to 0",
            with_steps(serde_json::json!([
                {"step": "split", "stage": 0, "at": 0, "factors": [1u64 << 32, 1u64 << 32]}
            ])),
        ),
        (
            "huge stage and loop indices",
            with_steps(serde_json::json!([
                {"step": "compute_at", "stage": big, "target": big, "at": big},
                {"step": "vectorize", "stage": 0, "at": big}
            ])),
        ),
        (
            "a reorder that is no permutation",
            with_steps(serde_json::json!([{"step": "reorder", "stage": 0, "order": [0, 0, big]}])),
        ),
        (
            "a thousand factors",
            with_steps(serde_json::json!([
                {"step": "split", "stage": 0, "at": 0, "factors": vec![1; 1000]}
            ])),
        ),
        (
            "loops nested past the limit",
            with_steps(serde_json::Value::Array(
                (0..200)
                    .map(|_| serde_json::json!({"step": "split", "stage": 0, "at": 0, "factors": [1]}))
                    .collect(),
            )),
        ),
        (
            "twenty thousand steps",
            with_steps(serde_json::Value::Array(
                (0..20_000)
                    .map(|_| serde_json::json!({"step": "unroll", "stage": 0, "at": 0}))
                    .collect(),
            )),
        ),
        (
            "four thousand cache_read copies",
            with_steps(serde_json::Value::Array(
                (0..4096)
                    .map(|_| serde_json::json!({"step": "cache_read", "stage": 0, "input": 0, "order": [0, 1]}))
                    .collect(),
            )),
        ),
        ("deeply nested JSON", format!("{}{}", "[".repeat(100_000), "]".repeat(100_000))),
        ("invalid UTF-8", String::from_utf8_lossy(b"{\"version\":1,\xff\xfe}").into_owned()),
        ("a negative latency", {
            let mut v = record_json(vec![]);
            v["latency_s"] = serde_json::json!(-1.0);
            v.to_string()
        }),
        ("an escaped NUL and ESC in every string", {
            let mut v = record_json(vec![]);
            v["harl_version"] = serde_json::json!("0.1\u{0}\u{1b}[2J");
            v["schedule"]["steps"] = serde_json::json!([{"step": "\u{0}\u{1b}"}]);
            v.to_string()
        }),
    ];
    // A line over the per-line limit.
    lines.push((
        "a 2 MiB line",
        with_steps(serde_json::json!([{"step": "x".repeat(2 << 20)}])),
    ));
    lines
}

#[test]
fn every_hostile_record_falls_back_to_the_default_code_with_one_line_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = build(&dir.path().join("no-cache"), &dir.path().join("clean"));
    assert!(clean.warnings.is_empty(), "{:?}", clean.warnings);
    let want = generated(&dir.path().join("clean"));
    for (i, (what, line)) in hostile_lines().into_iter().enumerate() {
        let cache = dir.path().join(format!("cache{i}"));
        std::fs::create_dir_all(&cache).expect("mkdir");
        std::fs::write(cache_file(&cache), format!("{line}\n")).expect("write");
        let out = dir.path().join(format!("out{i}"));
        let started = Instant::now();
        let r = build(&cache, &out);
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{what}: took {:?}",
            started.elapsed()
        );
        assert_eq!(r.kernels[0].source, ScheduleSource::Default, "{what}");
        assert!(!r.warnings.is_empty(), "{what}: no warning");
        for w in &r.warnings {
            assert!(
                !w.chars().any(|c| c.is_control() || c == '\u{2028}'),
                "{what}: a warning breaks its line: {w:?}"
            );
        }
        assert_eq!(
            generated(&out),
            want,
            "{what}: the code differs from the default"
        );
    }
}

#[test]
fn the_next_best_record_survives_its_hostile_neighbours() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache).expect("mkdir");
    let good = record_json(vec![Step::Split {
        stage: 0,
        at: 1,
        factors: vec![8],
    }]);
    let mut text: String = hostile_lines()
        .into_iter()
        .map(|(_, l)| format!("{l}\n"))
        .collect();
    text.push_str(&format!("{good}\n"));
    std::fs::write(cache_file(&cache), text).expect("write");
    let r = build(&cache, &dir.path().join("out"));
    assert!(
        matches!(r.kernels[0].source, ScheduleSource::CacheExact { .. }),
        "{:?}\n{:?}",
        r.kernels[0].source,
        r.warnings
    );
}

#[cfg(unix)]
#[test]
fn a_fifo_a_directory_a_device_and_a_huge_file_are_refused_without_blocking() {
    let dir = tempfile::tempdir().expect("tempdir");
    let clean = build(&dir.path().join("no-cache"), &dir.path().join("clean"));
    let want = generated(&dir.path().join("clean"));
    type Make = fn(&Path);
    let cases: [(&str, Make); 4] = [
        ("a FIFO", |p| {
            let status = std::process::Command::new("mkfifo")
                .arg(p)
                .status()
                .expect("mkfifo");
            assert!(status.success());
        }),
        ("a directory", |p| std::fs::create_dir(p).expect("mkdir")),
        ("a link to /dev/zero", |p| {
            std::os::unix::fs::symlink("/dev/zero", p).expect("symlink")
        }),
        ("a sparse 100 GiB file", |p| {
            std::fs::File::create(p)
                .and_then(|f| f.set_len(100 << 30))
                .expect("sparse file")
        }),
    ];
    for (i, (what, make)) in cases.into_iter().enumerate() {
        let cache = dir.path().join(format!("cache{i}"));
        std::fs::create_dir_all(&cache).expect("mkdir");
        make(&cache_file(&cache));
        let out = dir.path().join(format!("out{i}"));
        let started = Instant::now();
        let r = build(&cache, &out);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{what}: blocked"
        );
        assert_eq!(r.kernels[0].source, ScheduleSource::Default, "{what}");
        let all = r.warnings.join("\n");
        assert!(
            all.contains("not a regular file") || all.contains("larger than the limit"),
            "{what}: {all}"
        );
        assert_eq!(generated(&out), want, "{what}");
    }
    assert!(clean.warnings.is_empty());
}

#[test]
fn duplicate_and_keyword_input_names_still_give_code_that_names_each_once() {
    let mut g = graph();
    g.inputs[0].name = "type".into();
    g.inputs[1].name = "type".into();
    let dir = tempfile::tempdir().expect("tempdir");
    build_with(&dir.path().join("out"), g);
    let code = generated(&dir.path().join("out"));
    assert!(
        code.contains("pub fn run(input0: &[f32], input1: &[f32], out: &mut [f32])"),
        "{code}"
    );
    // Names that collide with the fallback names or the output.
    let mut g = graph();
    g.inputs[0].name = "input1".into();
    g.inputs[1].name = "out".into();
    build_with(&dir.path().join("out2"), g);
    let code = generated(&dir.path().join("out2"));
    assert!(
        code.contains("pub fn run(input0: &[f32], input1: &[f32], out: &mut [f32])"),
        "{code}"
    );
}

fn build_with(out: &Path, g: Graph) -> Report {
    Builder::new()
        .quiet()
        .tune(TuneMode::Off)
        .out_dir(out)
        .kernel("mm", g)
        .try_compile()
        .expect("build step")
}

/// Graphs whose inlining would blow up: 40 stages that each read the previous one twice
/// (2^40 nodes inlined) and 600 stages that each add one level. The default schedule inlines
/// elementwise stages; past the limits it keeps them as stages, and the code stays correct.
#[test]
fn inlining_that_would_explode_or_nest_too_deep_keeps_the_stages() {
    use harl_build::default_schedule::{default_schedule, CpuTarget};
    use harl_build::lower::lower;
    use harl_te::{load, DType, Expr, GraphBuilder};
    for (what, stages, twice) in [("doubling", 40, true), ("deep", 600, false)] {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[8], DType::F32);
        let mut prev = x;
        for i in 0..stages {
            let v = || load(prev, [Expr::axis(0)]);
            // (Not `+ 1.0`: constants fold, and the body would not grow.)
            let body = if twice {
                v() + v()
            } else {
                v() + load(x, [Expr::axis(0)])
            };
            prev = b.compute(&format!("s{i}"), &[8], DType::F32, body);
        }
        let g = b.finish().expect("a valid graph");
        let started = Instant::now();
        let schedule = default_schedule(&g, &CpuTarget::portable());
        let program = lower(&g, &schedule).expect("the default schedule lowers");
        assert!(started.elapsed() < Duration::from_secs(20), "{what}");
        let buffers = program.has_buffer.iter().filter(|&&b| b).count();
        assert!(buffers > 1, "{what}: everything was inlined");
        let input: Vec<f64> = (0..8).map(f64::from).collect();
        let want = harl_te::interp::run(&g, &[&input]).expect("interpreter");
        let factor = if twice {
            2f64.powi(stages)
        } else {
            f64::from(stages + 1)
        };
        assert_eq!(want[3], 3.0 * factor, "{what}");
        let dir = tempfile::tempdir().expect("tempdir");
        build_with(dir.path(), g);
        assert!(generated(dir.path()).contains("pub fn run("), "{what}");
    }
}

/// An rfactor that multiplies the output by a huge factor makes the binary allocate that much
/// scratch per call: over the limit it is refused; a modest one still lowers.
#[test]
fn an_rfactor_that_would_allocate_gigabytes_is_refused() {
    use harl_build::lower::{lower, ScheduleError};
    let g = workloads::matmul(64, 1 << 16, 64).expect("matmul");
    let wide = Schedule {
        steps: vec![Step::Rfactor {
            stage: 0,
            factor: 1 << 15,
        }],
    };
    assert!(
        matches!(lower(&g, &wide), Err(ScheduleError::Scratch { .. })),
        "{:?}",
        lower(&g, &wide).map(|_| ())
    );
    let modest = Schedule {
        steps: vec![Step::Rfactor {
            stage: 0,
            factor: 16,
        }],
    };
    assert!(lower(&g, &modest).is_ok());
}

/// A file of a hundred thousand corrupt lines and as many copies of a record that fails
/// validation: the build stays fast, validates a bounded number of records and prints a
/// bounded number of warnings.
#[test]
fn a_flood_of_bad_lines_costs_bounded_time_and_warnings() {
    let dir = tempfile::tempdir().expect("tempdir");
    let cache = dir.path().join("cache");
    std::fs::create_dir_all(&cache).expect("mkdir");
    let failing = with_steps(serde_json::json!([
        {"step": "split", "stage": 0, "at": 99, "factors": [2]}
    ]));
    let mut text = String::new();
    for i in 0..100_000 {
        text.push_str(if i % 2 == 0 { "{ not json\n" } else { &failing });
        if i % 2 == 1 {
            text.push('\n');
        }
    }
    std::fs::write(cache_file(&cache), text).expect("write");
    let started = Instant::now();
    let r = build(&cache, &dir.path().join("out"));
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(r.kernels[0].source, ScheduleSource::Default);
    assert!(
        r.warnings.len() <= harl_build::limits::MAX_LOOKUP_WARNINGS,
        "{} warnings",
        r.warnings.len()
    );
    assert!(r
        .warnings
        .last()
        .is_some_and(|w| w.contains("more warnings")));
}
