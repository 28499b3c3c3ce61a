//! `cargo harl cache ...` run as a user runs it, on files written by harl's own cache API.

use harl_build::cache::Record;
use harl_build::schedule::{Schedule, Step};
use harl_build::target::TargetFingerprint;
use std::path::Path;
use std::process::{Command, Output};

const KERNEL: &str = "#[harl::kernel]\nfn neg(x: Tensor<f32, 16>) -> Tensor<f32, 16> { -x }\n";

fn tool(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_cargo-harl"))
        .arg("harl")
        .args(args)
        .output()
        .expect("run cargo-harl")
}

fn text(o: &Output) -> (String, String) {
    (
        String::from_utf8_lossy(&o.stdout).into_owned(),
        String::from_utf8_lossy(&o.stderr).into_owned(),
    )
}

fn target(cpu: &str) -> TargetFingerprint {
    TargetFingerprint {
        arch: "x86_64".into(),
        isa_class: "x86_64-avx2".into(),
        features: vec!["avx2".into(), "fma".into()],
        cpu_model: cpu.into(),
        cores: 4,
    }
}

fn record(key: &str, cpu: &str, latency_s: f64, steps: Vec<Step>) -> Record {
    Record::new(key, "neg", target(cpu), Schedule { steps }, latency_s, 8)
}

fn line(r: &Record) -> String {
    serde_json::to_string(r).expect("serialize")
}

/// The workload key of `KERNEL`, as the build script sees it.
fn kernel_key() -> String {
    let mut decls = Vec::new();
    harl_build::scan::scan_source(KERNEL, &mut decls);
    decls[0].graph.workload_key()
}

/// A crate declaring `KERNEL`, for `--crate`.
fn crate_dir(root: &Path) -> std::path::PathBuf {
    let dir = root.join("crate");
    std::fs::create_dir_all(dir.join("src")).expect("mkdir");
    std::fs::write(dir.join("src/lib.rs"), KERNEL).expect("write");
    dir
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("utf-8 path")
}

#[test]
fn list_prints_every_record_and_bad_line_escaped() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("x86_64-avx2.jsonl");
    let mut hostile = record("k1", "A", 1e-3, vec![]);
    hostile.workload = "neg\ncargo:rustc-cfg=pwned".into();
    std::fs::write(&file, format!("{}\n{{ not json\n", line(&hostile))).expect("write");
    let out = tool(&["cache", "list", path_str(&file)]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    assert_eq!(lines.len(), 2, "{stdout}");
    assert!(lines[0].contains("neg\\u{a}cargo:rustc-cfg=pwned") && lines[0].contains("1.0000 ms"));
    assert!(
        lines[1].contains(":2  not a record: invalid JSON"),
        "{stdout}"
    );
}

#[test]
fn merge_keeps_the_fastest_record_per_workload_and_target_without_duplicates() {
    let dir = tempfile::tempdir().expect("tempdir");
    let a = dir.path().join("a").join("x86_64-avx2.jsonl");
    let b = dir.path().join("b").join("x86_64-avx2.jsonl");
    let slow = record("k1", "A", 2e-3, vec![]);
    let fast = record("k1", "A", 1e-3, vec![]);
    let other_cpu = record("k1", "B", 3e-3, vec![]);
    let other_key = record("k2", "A", 5e-4, vec![]);
    for (path, records) in [(&a, vec![&slow, &other_key]), (&b, vec![&fast, &other_cpu])] {
        std::fs::create_dir_all(path.parent().unwrap()).expect("mkdir");
        let mut text: String = records.iter().map(|r| line(r) + "\n").collect();
        text.push_str("{ corrupt\n");
        std::fs::write(path, text).expect("write");
    }
    let merged = dir.path().join("merged.jsonl");
    let out = tool(&[
        "cache",
        "merge",
        path_str(&a),
        path_str(&b),
        "-o",
        path_str(&merged),
    ]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("merged 3 records from 2 files") && stdout.contains("2 lines skipped"));
    let read = |p: &Path| -> Vec<Record> {
        harl_build::cache::read_file(p)
            .expect("readable")
            .expect("exists")
            .into_iter()
            .map(|(_, r)| r.expect("a record"))
            .collect()
    };
    let got = read(&merged);
    assert_eq!(got.len(), 3);
    for want in [&fast, &other_cpu, &other_key] {
        assert_eq!(got.iter().filter(|r| *r == want).count(), 1, "{want:?}");
    }
    // Merging the result with one of its inputs again changes nothing.
    let out = tool(&[
        "cache",
        "merge",
        path_str(&merged),
        path_str(&a),
        "-o",
        path_str(&merged),
    ]);
    assert!(out.status.success());
    assert_eq!(read(&merged), got);
}

#[test]
fn merge_into_one_file_refuses_several_isa_classes_but_a_directory_takes_them() {
    let dir = tempfile::tempdir().expect("tempdir");
    let avx2 = dir.path().join("x86_64-avx2.jsonl");
    let avx512 = dir.path().join("x86_64-avx512.jsonl");
    let mut r512 = record("k1", "A", 1e-3, vec![]);
    r512.target.isa_class = "x86_64-avx512".into();
    std::fs::write(&avx2, line(&record("k1", "A", 1e-3, vec![])) + "\n").expect("write");
    std::fs::write(&avx512, line(&r512) + "\n").expect("write");
    let one = dir.path().join("one.jsonl");
    let out = tool(&[
        "cache",
        "merge",
        path_str(&avx2),
        path_str(&avx512),
        "-o",
        path_str(&one),
    ]);
    let (_, stderr) = text(&out);
    assert_eq!(out.status.code(), Some(2));
    assert!(stderr.contains("several ISA classes"), "{stderr}");
    assert!(!one.exists());
    let cache = dir.path().join("cache");
    std::fs::create_dir(&cache).expect("mkdir");
    let out = tool(&[
        "cache",
        "merge",
        path_str(&avx2),
        path_str(&avx512),
        "-o",
        path_str(&cache),
    ]);
    assert!(out.status.success(), "{:?}", text(&out));
    assert!(cache.join("x86_64-avx2.jsonl").exists() && cache.join("x86_64-avx512.jsonl").exists());
}

#[test]
fn verify_replays_on_the_crates_kernels_and_prune_keeps_what_passes() {
    let dir = tempfile::tempdir().expect("tempdir");
    let krate = crate_dir(dir.path());
    let key = kernel_key();
    let file = dir.path().join("x86_64-avx2.jsonl");
    let good = record(
        &key,
        "A",
        1e-3,
        vec![Step::Split {
            stage: 0,
            at: 0,
            factors: vec![4],
        }],
    );
    let slower = record(&key, "A", 2e-3, vec![]);
    let unreplayable = record(
        &key,
        "B",
        1e-4,
        vec![Step::Split {
            stage: 0,
            at: 9,
            factors: vec![2],
        }],
    );
    let elsewhere = record("not-in-this-crate", "A", 1e-3, vec![]);
    let future = line(&good).replacen("\"version\":1", "\"version\":7", 1);
    let mut misfiled = record(&key, "A", 1e-5, vec![]);
    misfiled.target.isa_class = "x86_64-avx512".into();
    let text_in = [
        line(&good),
        line(&slower),
        line(&unreplayable),
        line(&elsewhere),
        future,
        line(&misfiled),
    ]
    .join("\n");
    std::fs::write(&file, text_in + "\n").expect("write");
    let krate_s = path_str(&krate);

    let out = tool(&["cache", "verify", "--crate", krate_s, path_str(&file)]);
    let (stdout, _) = text(&out);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(stdout.contains(":3: FAILED: does not replay"), "{stdout}");
    assert!(
        stdout.contains(":5: FAILED: unknown record version 7"),
        "{stdout}"
    );
    assert!(
        stdout.contains("3 records usable, 2 replayed, 1 of workloads the crate does not declare"),
        "{stdout}"
    );
    assert!(
        stdout.contains(":6: FAILED: record is for ISA class \"x86_64-avx512\""),
        "{stdout}"
    );
    assert!(stdout.contains("3 lines failed"), "{stdout}");

    let out = tool(&["cache", "prune", "--crate", krate_s, path_str(&file)]);
    let (stdout, stderr) = text(&out);
    assert!(out.status.success(), "{stderr}");
    assert!(
        stdout.contains("kept 2 records (1 superseded, 3 lines dropped)"),
        "{stdout}"
    );
    let kept: Vec<Record> = harl_build::cache::read_file(&file)
        .expect("readable")
        .expect("exists")
        .into_iter()
        .map(|(_, r)| r.expect("a record"))
        .collect();
    assert!(kept.contains(&good) && kept.contains(&elsewhere) && kept.len() == 2);
    let out = tool(&["cache", "verify", "--crate", krate_s, path_str(&file)]);
    assert!(out.status.success(), "{:?}", text(&out));
}

#[test]
fn a_missing_file_or_a_directory_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("nope.jsonl");
    let out = tool(&["cache", "list", path_str(&missing)]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).1.contains("nope.jsonl: no such file"),
        "{:?}",
        text(&out)
    );
    let out = tool(&["cache", "verify", path_str(dir.path())]);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        text(&out).1.contains("not a regular file"),
        "{:?}",
        text(&out)
    );
}
