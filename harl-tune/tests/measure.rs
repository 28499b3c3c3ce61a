//! The measurer compiles candidates as they ship, runs each in its own process and labels every
//! failure as one failed trial: a crash, a hang, a wrong result, a compile error, a schedule that
//! does not lower. The good candidates of the same batch are still measured.
//!
//! All tests share one work dir (and so one target dir) under the workspace's `target/`, so
//! harl and rayon compile in release once; builds serialise on the work dir's lock.

#[path = "../../harl-build/tests/common/mod.rs"]
mod common;

use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::schedule::{Schedule, Step};
use harl_te::ops::workloads as w;
use harl_te::{DType, ReduceOp};
use harl_tune::measure::{
    reference_data, Candidate, MeasureConfig, MeasureError, Measurer, TrialError,
};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn harl_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn config() -> MeasureConfig {
    MeasureConfig {
        work_dir: harl_path().join("target").join("measure-tests"),
        harl_path: harl_path(),
        threads: 1,
        timeout: Duration::from_secs(2),
        min_time: Duration::from_millis(20),
        min_repeats: 3,
        warmup: 1,
        check_points: 32,
        seed: 1,
        // Off here: the failure tests need every candidate timed in full; see
        // `slow_candidates_are_timed_once` for the cutoff.
        slow_cutoff: 0.0,
        relative_timeout: 0.0,
        build_timeout: Duration::from_secs(10 * 60),
        variant: None,
        flush_bytes: 0,
    }
}

/// A raw candidate for a `[m, k] x [k, n]` f32 matmul with the given body.
fn raw(body: &str) -> Candidate {
    Candidate::RawSource(format!(
        "pub fn run(a: &[f32], b: &[f32], out: &mut [f32]) -> Result<(), harl::KernelError> {{\n    let _ = (a, b);\n    {body}\n}}"
    ))
}

#[test]
fn every_failure_is_one_labelled_trial() {
    let graph = w::matmul(48, 64, 40).expect("matmul");
    let good = default_schedule(&graph, &CpuTarget::host());
    let bad = Schedule {
        steps: vec![Step::Split {
            stage: 7,
            at: 0,
            factors: vec![4],
        }],
    };
    let candidates = vec![
        Candidate::Schedule(good),
        raw("let p = std::hint::black_box(std::ptr::null_mut::<f32>());\n    // SAFETY: none; this candidate crashes on purpose.\n    unsafe { p.write_volatile(out[0]) };\n    Ok(())"),
        raw("loop { std::hint::spin_loop(); }"),
        raw("out.fill(1.0);\n    Ok(())"),
        Candidate::Schedule(bad),
        raw("let x: u32 = \"not a number\";\n    Ok(())"),
        raw("panic!(\"candidate gave up\")"),
        Candidate::Schedule(Schedule::naive()),
    ];
    let mut m = Measurer::new(config()).expect("measurer");
    let t = Instant::now();
    let res = m.measure(&graph, &candidates);
    eprintln!("batch of {} measured in {:?}", res.len(), t.elapsed());
    for (i, r) in res.iter().enumerate() {
        eprintln!("{i}: {r:?}");
    }
    assert_eq!(res.len(), candidates.len());

    for i in [0, 7] {
        let r = &res[i];
        assert!(r.is_ok(), "candidate {i}: {r:?}");
        let lat = r.latency_s.expect("latency");
        assert!(lat > 0.0 && r.min_s <= lat && lat <= r.max_s, "{r:?}");
        assert!(r.runs >= 3);
        assert!(r.compile_s > 0.0);
    }
    assert!(
        matches!(&res[1].error, Some(TrialError::Crash(m)) if m.starts_with("signal 11 (SIGSEGV)")),
        "{:?}",
        res[1]
    );
    assert_eq!(res[2].error, Some(TrialError::Timeout));
    assert!(
        matches!(&res[3].error, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        "{:?}",
        res[3]
    );
    assert!(
        matches!(&res[4].error, Some(TrialError::Invalid(_))),
        "{:?}",
        res[4]
    );
    assert_eq!(res[4].compile_s, 0.0);
    assert!(
        matches!(&res[5].error, Some(TrialError::Compile(m)) if m.contains("mismatched types")),
        "{:?}",
        res[5]
    );
    assert!(
        matches!(&res[6].error, Some(TrialError::Crash(m)) if m.contains("candidate gave up")),
        "{:?}",
        res[6]
    );
    for r in &res[1..7] {
        assert_eq!(r.latency_s, None);
        assert_eq!(r.runs, 0);
    }
}

#[test]
fn slow_candidates_are_timed_once() {
    let graph = w::matmul(48, 64, 40).expect("matmul");
    let sleepy = || {
        raw("std::thread::sleep(std::time::Duration::from_millis(30));\n    for i in 0..48 {\n        for j in 0..40 {\n            out[i * 40 + j] = (0..64).map(|k| a[i * 64 + k] * b[k * 40 + j]).sum();\n        }\n    }\n    Ok(())")
    };
    let mut m = Measurer::new(MeasureConfig {
        slow_cutoff: 2.0,
        relative_timeout: 10.0,
        ..config()
    })
    .expect("measurer");
    // Unknown best: timed in full.
    let full = m.measure(&graph, &[sleepy()]);
    assert!(full[0].is_ok() && full[0].runs >= 3, "{:?}", full[0]);
    // A best 10x faster than the candidate: one run.
    m.set_best(Some(0.003));
    let once = m.measure(&graph, &[sleepy()]);
    assert!(once[0].is_ok() && once[0].runs == 1, "{:?}", once[0]);
    assert!(
        once[0].latency_s.is_some_and(|l| l >= 0.03),
        "{:?}",
        once[0]
    );
    // Within twice the best: timed in full.
    m.set_best(Some(0.025));
    let near = m.measure(&graph, &[sleepy()]);
    assert!(near[0].is_ok() && near[0].runs >= 3, "{:?}", near[0]);
}

/// A candidate whose first call pays a one-time cost (as preparing weights does) is timed
/// by its later calls, even when that first call is far slower than the best: the first
/// call is the checked one, never the measurement.
#[test]
fn a_first_call_setup_cost_is_not_the_measurement() {
    let graph = w::matmul(48, 64, 40).expect("matmul");
    let prepares_once = raw("static READY: std::sync::OnceLock<()> = std::sync::OnceLock::new();\n    READY.get_or_init(|| std::thread::sleep(std::time::Duration::from_millis(40)));\n    for i in 0..48 {\n        for j in 0..40 {\n            out[i * 40 + j] = (0..64).map(|k| a[i * 64 + k] * b[k * 40 + j]).sum();\n        }\n    }\n    Ok(())");
    let mut m = Measurer::new(MeasureConfig {
        slow_cutoff: 2.0,
        relative_timeout: 10.0,
        ..config()
    })
    .expect("measurer");
    // A best far under the 40 ms first call: the cutoff applies, to a steady-state run.
    m.set_best(Some(0.001));
    let got = m.measure(&graph, &[prepares_once]);
    assert!(got[0].is_ok(), "{:?}", got[0]);
    assert!(
        got[0].latency_s.is_some_and(|l| l < 0.02),
        "the first call's setup was timed: {:?}",
        got[0]
    );
}

/// With `flush_bytes`, caches are evicted before each timed run, and that eviction is not
/// part of the measurement: a kernel far shorter than the flush is still timed as itself,
/// the result still checked, and the run count still reaches `min_repeats`.
#[test]
fn a_flushed_measurement_times_the_kernel_not_the_flush() {
    let graph = w::matmul(48, 64, 40).expect("matmul");
    let body = "for i in 0..48 {\n        for j in 0..40 {\n            out[i * 40 + j] = (0..64).map(|k| a[i * 64 + k] * b[k * 40 + j]).sum();\n        }\n    }\n    Ok(())";
    let mut m = Measurer::new(MeasureConfig {
        flush_bytes: 128 << 20,
        ..config()
    })
    .expect("measurer");
    let got = m.measure(&graph, &[raw(body)]);
    assert!(got[0].is_ok() && got[0].runs >= 3, "{:?}", got[0]);
    // Writing 128 MiB takes several milliseconds on any machine; the kernel, microseconds.
    assert!(
        got[0].latency_s.is_some_and(|l| l < 0.002),
        "the flush was timed: {:?}",
        got[0]
    );
}

#[test]
fn pipelined_batches_measure_like_single_ones() {
    let graph = w::dense_bias_relu(16, 32, 24).expect("dense");
    let batches = vec![
        vec![Candidate::Schedule(default_schedule(
            &graph,
            &CpuTarget::host(),
        ))],
        vec![
            Candidate::Schedule(Schedule::naive()),
            raw("not rust at all"),
        ],
    ];
    let mut m = Measurer::new(config()).expect("measurer");
    // dense_bias_relu has a bias input: the raw candidate's two-input signature is wrong, and
    // it is not Rust anyway; either way it fails to compile in its own file.
    let res = m.measure_pipelined(&graph, &batches);
    assert_eq!(res.len(), 2);
    assert!(res[0][0].is_ok(), "{:?}", res[0][0]);
    assert!(res[1][0].is_ok(), "{:?}", res[1][0]);
    assert!(
        matches!(res[1][1].error, Some(TrialError::Compile(_))),
        "{:?}",
        res[1][1]
    );
}

#[test]
fn a_link_error_is_bisected_to_its_candidate() {
    // The linker names no source file: the batch is bisected to find the culprit.
    let graph = w::matmul(8, 8, 8).expect("matmul");
    let candidates = vec![
        Candidate::Schedule(Schedule::naive()),
        raw("#[link(name = \"harl_no_such_library\")]\n    unsafe extern \"C\" {\n        fn harl_no_such_function();\n    }\n    // SAFETY: never links.\n    unsafe { harl_no_such_function() };\n    Ok(())"),
        Candidate::Schedule(default_schedule(&graph, &CpuTarget::host())),
    ];
    let mut m = Measurer::new(config()).expect("measurer");
    let res = m.measure(&graph, &candidates);
    assert!(res[0].is_ok(), "{:?}", res[0]);
    assert!(res[2].is_ok(), "{:?}", res[2]);
    assert!(
        matches!(&res[1].error, Some(TrialError::Compile(m)) if m.contains("harl_no_such_library")),
        "{:?}",
        res[1]
    );
}

#[test]
fn same_seed_same_inputs_and_points() {
    let graph = w::conv2d(1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1).expect("conv2d");
    let a = reference_data(&graph, 42, 50).expect("reference");
    let b = reference_data(&graph, 42, 50).expect("reference");
    assert_eq!(a, b);
    let c = reference_data(&graph, 43, 50).expect("reference");
    assert_ne!(a.inputs, c.inputs);
    // The output (4 x 8 x 8) is small: every element is checked.
    assert_eq!(a.points, (0..256).collect::<Vec<_>>());
    assert_eq!(a.points, c.points);
    assert!(a.inputs.iter().flatten().all(|v| v.abs() < 16.0));
    assert!(a.inputs.iter().flatten().any(|v| v.abs() > 4.0));
    // The expected values are the interpreter's.
    let refs: Vec<&[f64]> = a.inputs.iter().map(Vec::as_slice).collect();
    let full = harl_te::interp::run(&graph, &refs).expect("run");
    for (p, v) in a.points.iter().zip(&a.expected) {
        assert_eq!(full[*p], *v);
    }
}

#[test]
fn a_bad_configuration_is_an_error_not_a_panic() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut c = config();
    c.work_dir = dir.path().join("work");
    c.harl_path = dir.path().join("no-such-crate");
    assert!(matches!(
        Measurer::new(c.clone()),
        Err(MeasureError::HarlPath(_))
    ));
    c.harl_path = harl_path();
    c.threads = 0;
    assert!(matches!(
        Measurer::new(c.clone()),
        Err(MeasureError::Config(_))
    ));
    c.threads = 1;
    c.min_time = c.timeout;
    assert!(matches!(
        Measurer::new(c.clone()),
        Err(MeasureError::Config(_))
    ));
    c.min_time = Duration::from_millis(20);
    c.build_timeout = Duration::ZERO;
    assert!(matches!(Measurer::new(c), Err(MeasureError::Config(_))));
}

#[cfg(unix)]
#[test]
fn a_build_past_its_limit_is_bisected_to_its_candidate() {
    // A candidate whose build never ends: rustc blocks opening a FIFO nobody writes to (a hang
    // that costs no CPU, standing in for a pathologically slow compile).
    let dir = tempfile::tempdir().expect("tempdir");
    let fifo = dir.path().join("never-written");
    let made = std::process::Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .expect("mkfifo");
    assert!(made.success());
    let graph = w::matmul(8, 8, 8).expect("matmul");
    let hanging = raw(&format!(
        "let bytes: &[u8] = include_bytes!({:?});\n    out.fill(bytes.len() as f32);\n    Ok(())",
        fifo.display().to_string()
    ));
    // Warm the shared target dir first, so the limit below times candidates, not harl itself.
    let mut warm = Measurer::new(config()).expect("measurer");
    assert!(warm.measure(&graph, &[Candidate::Schedule(Schedule::naive())])[0].is_ok());

    let limit = Duration::from_secs(30);
    let mut m = Measurer::new(MeasureConfig {
        build_timeout: limit,
        ..config()
    })
    .expect("measurer");
    let t = Instant::now();
    let res = m.measure(
        &graph,
        &[
            Candidate::Schedule(default_schedule(&graph, &CpuTarget::host())),
            hanging,
        ],
    );
    let took = t.elapsed();
    assert!(res[0].is_ok(), "{:?}", res[0]);
    assert!(
        matches!(&res[1].error, Some(TrialError::Compile(m)) if m.contains("limit of 15 s")),
        "{:?}",
        res[1]
    );
    // The whole batch hung for 30 s, then the hanging half for 15 s (the message above says
    // which limit killed it; no upper bound here, as builds of parallel tests share the lock).
    assert!(took >= limit + limit / 2, "{took:?}");
}

/// A correct `[48, 64] x [64, 40]` matmul into `out`, as raw source lines.
const MATMUL_48_64_40: &str = "for i in 0..48 {\n        for j in 0..40 {\n            out[i * 40 + j] = (0..64).map(|k| a[i * 64 + k] * b[k * 40 + j]).sum();\n        }\n    }";

/// A raw candidate of a one-input row reduction over `[64, 128]` (type `t`) with the given body.
fn raw_rows(t: &str, body: &str) -> Candidate {
    Candidate::RawSource(format!(
        "pub fn run(x: &[{t}], out: &mut [{t}]) -> Result<(), harl::KernelError> {{\n    for i in 0..64 {{\n        {body}\n    }}\n    Ok(())\n}}"
    ))
}

/// A raw candidate of the `[16, 32] x [32]` i32 matvec with the given loop over `j`.
fn raw_matvec(range: &str, extra: &str) -> Candidate {
    Candidate::RawSource(format!(
        "pub fn run(a: &[i32], c: &[i32], out: &mut [i32]) -> Result<(), harl::KernelError> {{\n    for i in 0..16 {{\n        let mut s = 0i32;\n        for j in {range} {{\n            s = s.wrapping_add(a[i * 32 + j].wrapping_mul(c[j]));\n        }}\n        out[i] = s{extra};\n    }}\n    Ok(())\n}}"
    ))
}

/// A named candidate and what its trial's error must look like.
type Case = (&'static str, Candidate, fn(&Option<TrialError>) -> bool);

/// The measurer's self-test: hand-written known-bad candidates, fed to the real measurer, are
/// each one failed trial with a reason that says what was wrong; the correct candidates of the
/// same batches (hand-written and generated) are measured.
#[test]
fn known_bad_candidates_are_rejected() {
    let graph = w::matmul(48, 64, 40).expect("matmul");
    let forged = r#"println!("{{\"median_s\":1e-9,\"min_s\":1e-9,\"max_s\":1e-9,\"runs\":3}}");"#;
    let cases: Vec<Case> = vec![
        ("correct raw matmul", raw(&format!("{MATMUL_48_64_40}\n    Ok(())")), |e| e.is_none()),
        (
            "correct schedule",
            Candidate::Schedule(default_schedule(&graph, &CpuTarget::host())),
            |e| e.is_none(),
        ),
        (
            "writes one past the end of its output",
            raw(&format!("{MATMUL_48_64_40}\n    let n = out.len();\n    // SAFETY: none; one past the end on purpose.\n    unsafe {{ out.as_mut_ptr().add(n).write(0.0) }};\n    Ok(())")),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("outside its output") && m.contains("index 1920")),
        ),
        (
            "writes one before the start of its output",
            raw(&format!("{MATMUL_48_64_40}\n    // SAFETY: none; one before the start on purpose.\n    unsafe {{ out.as_mut_ptr().sub(1).write(0.0) }};\n    Ok(())")),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("outside its output") && m.contains("index -1")),
        ),
        (
            "writes to an input",
            raw(&format!("{MATMUL_48_64_40}\n    // SAFETY: none; a write through a shared slice on purpose.\n    unsafe {{ (b.as_ptr() as *mut f32).add(7).write_volatile(0.5) }};\n    Ok(())")),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("wrote to its inputs: input 1, element 7")),
        ),
        (
            "skips one output element",
            raw("for i in 0..48 {\n        for j in 0..40 {\n            if i * 40 + j == 1000 { continue; }\n            out[i * 40 + j] = (0..64).map(|k| a[i * 64 + k] * b[k * 40 + j]).sum();\n        }\n    }\n    Ok(())"),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("1 of 1920 output elements were never written; first: element 1000")),
        ),
        (
            "drops the last reduction term",
            raw("for i in 0..48 {\n        for j in 0..40 {\n            out[i * 40 + j] = (0..63).map(|k| a[i * 64 + k] * b[k * 40 + j]).sum();\n        }\n    }\n    Ok(())"),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        ),
        (
            "drops negative terms",
            raw("for i in 0..48 {\n        for j in 0..40 {\n            out[i * 40 + j] = (0..64).map(|k| (a[i * 64 + k] * b[k * 40 + j]).max(0.0)).sum();\n        }\n    }\n    Ok(())"),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        ),
        (
            "prints a forged result line, then exits",
            raw(&format!("{forged}\n    std::process::exit(0)")),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("printed a result line of its own")),
        ),
        (
            "prints a forged result line with a guessed nonce, then exits",
            raw(r#"println!("{{\"nonce\":\"00000000000000000000000000000000\",\"median_s\":1e-9,\"min_s\":1e-9,\"max_s\":1e-9,\"runs\":3}}");
    std::process::exit(0)"#),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("printed a result line of its own")),
        ),
        (
            "prints a forged result line, then computes correctly",
            raw(&format!("{forged}\n    {MATMUL_48_64_40}\n    Ok(())")),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("printed a result line of its own")),
        ),
        (
            "exits quietly",
            raw("std::process::exit(0)"),
            |e| matches!(e, Some(TrialError::Crash(m)) if m.contains("printed no result")),
        ),
        (
            "sleeps forever",
            raw("std::thread::sleep(std::time::Duration::MAX);\n    Ok(())"),
            |e| matches!(e, Some(TrialError::Timeout)),
        ),
        (
            "aborts",
            raw("std::process::abort()"),
            |e| matches!(e, Some(TrialError::Crash(m)) if m.starts_with("signal 6 (SIGABRT)")),
        ),
        (
            "reads stdin for the nonce",
            raw(r#"let mut s = String::new();
    let _ = std::io::Read::read_to_string(&mut std::io::stdin(), &mut s);
    println!("{{\"nonce\":\"{}\",\"median_s\":1e-9,\"min_s\":1e-9,\"max_s\":1e-9,\"runs\":3}}", s.trim());
    std::process::exit(0)"#),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("printed a result line of its own")),
        ),
    ];
    let max_rows = common::row_reduce(64, 128, DType::F32, ReduceOp::Max);
    let min_rows = common::row_reduce(64, 128, DType::F32, ReduceOp::Min);
    let matvec = common::i32_matvec(16, 32);
    let max_cases: Vec<Case> = vec![
        (
            "correct row max",
            raw_rows("f32", "out[i] = x[i * 128..(i + 1) * 128].iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));"),
            |e| e.is_none(),
        ),
        (
            "row max schedule",
            Candidate::Schedule(default_schedule(&max_rows, &CpuTarget::host())),
            |e| e.is_none(),
        ),
        (
            "row max that starts at 0",
            raw_rows("f32", "out[i] = x[i * 128..(i + 1) * 128].iter().fold(0.0f32, |m, &v| m.max(v));"),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        ),
    ];
    let min_cases: Vec<Case> = vec![
        (
            "row min schedule",
            Candidate::Schedule(default_schedule(&min_rows, &CpuTarget::host())),
            |e| e.is_none(),
        ),
        (
            "row min that starts at 0",
            raw_rows(
                "f32",
                "out[i] = x[i * 128..(i + 1) * 128].iter().fold(0.0f32, |m, &v| m.min(v));",
            ),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        ),
    ];
    let matvec_cases: Vec<Case> = vec![
        ("correct i32 matvec", raw_matvec("0..32", ""), |e| {
            e.is_none()
        }),
        (
            "i32 matvec schedule",
            Candidate::Schedule(default_schedule(&matvec, &CpuTarget::host())),
            |e| e.is_none(),
        ),
        (
            "i32 matvec with a loop bound off by one",
            raw_matvec("0..31", ""),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        ),
        (
            "i32 matvec off by one",
            raw_matvec("0..32", ".wrapping_add(1)"),
            |e| matches!(e, Some(TrialError::WrongResult(m)) if m.contains("checked elements differ")),
        ),
    ];
    let mut m = Measurer::new(config()).expect("measurer");
    let mut failures = Vec::new();
    for (g, cases) in [
        (&graph, cases),
        (&max_rows, max_cases),
        (&min_rows, min_cases),
        (&matvec, matvec_cases),
    ] {
        let candidates: Vec<Candidate> = cases.iter().map(|(_, c, _)| c.clone()).collect();
        let res = m.measure(g, &candidates);
        assert_eq!(res.len(), cases.len());
        for ((what, _, ok), r) in cases.iter().zip(&res) {
            eprintln!("{what}: {:?}", r.error);
            if !ok(&r.error) {
                failures.push(format!("{what}: {r:?}"));
            } else if r.error.is_some() {
                // A rejection never counts a time.
                assert!(r.latency_s.is_none() && r.runs == 0, "{what}: {r:?}");
            } else {
                assert!(r.is_ok() && r.runs >= 3, "{what}: {r:?}");
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

/// The stronger checks (signed slices, large values, full checks, exact integers, guards) do
/// not reject legitimate kernels: generated candidates of graphs with long sums, exp, division
/// by a norm, max reductions, f64 math and i32 arithmetic all pass, reassociated and FMA-
/// contracted as their schedules make them.
#[test]
fn legitimate_schedules_pass_the_stronger_checks() {
    let graphs = vec![
        (
            "dense_bias_relu",
            w::dense_bias_relu(24, 512, 40).expect("dense"),
        ),
        ("softmax", w::softmax(16, 96).expect("softmax")),
        ("layer_norm", w::layer_norm(16, 96).expect("layer_norm")),
        (
            "conv2d",
            w::conv2d(1, 16, 10, 10, 8, 3, 3, 1, 1, 1, 1).expect("conv2d"),
        ),
        ("f64_math", common::f64_math()),
        ("i32_arith", common::i32_arith()),
    ];
    let mut m = Measurer::new(config()).expect("measurer");
    let mut failures = Vec::new();
    for (name, g) in &graphs {
        let mut candidates = vec![
            Candidate::Schedule(default_schedule(g, &CpuTarget::host())),
            Candidate::Schedule(Schedule::naive()),
        ];
        candidates.extend((0..3).map(|s| Candidate::Schedule(common::random_schedule(g, s, 12))));
        for (i, r) in m.measure(g, &candidates).iter().enumerate() {
            if !r.is_ok() {
                failures.push(format!("{name} candidate {i}: {:?}", r.error));
            }
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn a_lower_variant_is_built_and_dispatched_to() {
    // The portable variant runs everywhere: its worker must dispatch to it (`HARL_ISA`), or
    // the worker refuses to time a variant it would not call.
    let graph = w::matmul(16, 24, 8).expect("matmul");
    let mut m = Measurer::new(MeasureConfig {
        work_dir: harl_path().join("target").join("measure-tests-base"),
        variant: Some(harl_build::codegen::Variant::Base),
        ..config()
    })
    .expect("measurer");
    assert_eq!(m.variant(), harl_build::codegen::Variant::Base);
    let target = harl_build::codegen::Variant::Base.cpu_target(std::env::consts::ARCH, 1);
    let r = m.measure(
        &graph,
        &[Candidate::Schedule(default_schedule(&graph, &target))],
    );
    assert!(r[0].latency_s.is_some(), "{:?}", r[0].error);
}
