//! `cargo harl tune` as a user runs it in their crate: a fresh crate (path dependencies on harl
//! and harl-build, a `#[harl::kernel]` and a `Builder::kernel`, a build.rs) is tuned by the tool,
//! which finds the kernels by building the crate; the records land in the crate's
//! `tuning-cache/`, the next `cargo run` uses them and its kernels check out; `cargo harl report`
//! reads the tune back. The crate shares `CARGO_TARGET_DIR=target/e2e-cargo-harl` across runs.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

const MAIN_RS: &str = r#"
#[harl::kernel(M = 16, K = 24, N = 32)]
fn mm(a: Tensor<f32, M, K>, b: Tensor<f32, K, N>) -> Tensor<f32, M, N> {
    compute([M, N], |i, j| sum(K, |k| a[[i, k]] * b[[k, j]]))
}

mod registered {
    harl::include_kernels!();
}

fn main() {
    let (m, k, n) = (16, 24, 32);
    let a: Vec<f32> = (0..m * k).map(|i| (i % 7) as f32 - 3.0).collect();
    let b: Vec<f32> = (0..k * n).map(|i| (i % 5) as f32 - 2.0).collect();
    let mut out = vec![f32::NAN; m * n];
    mm(&a, &b, &mut out).expect("lengths");
    let mut ok = true;
    for i in 0..m {
        for j in 0..n {
            let want: f32 = (0..k).map(|kk| a[i * k + kk] * b[kk * n + j]).sum();
            ok &= out[i * n + j] == want;
        }
    }
    let x: Vec<f32> = (0..64).map(|i| (i % 9) as f32 * 0.25 - 1.0).collect();
    let mut y = vec![f32::NAN; 64];
    registered::softmax_rows::run(&x, &mut y).expect("lengths");
    for row in 0..4 {
        let r = &x[row * 16..row * 16 + 16];
        let top = r.iter().cloned().fold(f32::MIN, f32::max);
        let sum: f32 = r.iter().map(|v| (v - top).exp()).sum();
        for c in 0..16 {
            ok &= ((r[c] - top).exp() / sum - y[row * 16 + c]).abs() < 1e-5;
        }
    }
    println!("SCHEDULE: {}", mm::schedule_source());
    println!("CHECK: {}", if ok { "ok" } else { "MISMATCH" });
}
"#;

const BUILD_RS: &str = r#"
fn main() {
    harl_build::Builder::new()
        .scan_crate()
        .kernel("softmax_rows", harl_build::te::ops::workloads::softmax(4, 16).expect("softmax"))
        .compile();
}
"#;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .expect("workspace root")
}

fn ok(o: Output, what: &str) -> String {
    let stdout = String::from_utf8_lossy(&o.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{what}:\n{stdout}\n{stderr}");
    format!("{stdout}\n{stderr}")
}

fn new_crate(dir: &Path) -> PathBuf {
    let root = root();
    let krate = dir.join("user-crate");
    std::fs::create_dir_all(krate.join("src")).expect("mkdir");
    std::fs::write(
        krate.join("Cargo.toml"),
        format!(
            "[package]\nname = \"user-crate\"\nversion = \"0.1.0\"\nedition = \"2021\"\n\n[dependencies]\nharl = {{ path = {:?} }}\n\n[build-dependencies]\nharl-build = {{ path = {:?} }}\n\n[workspace]\n",
            root,
            root.join("harl-build")
        ),
    )
    .expect("write");
    std::fs::write(krate.join("src/main.rs"), MAIN_RS).expect("write");
    std::fs::write(krate.join("build.rs"), BUILD_RS).expect("write");
    krate
}

fn cargo_env(cmd: &mut Command) -> &mut Command {
    cmd.env("CARGO_TARGET_DIR", root().join("target/e2e-cargo-harl"))
        .env_remove("HARL_TUNE")
        .env_remove("HARL_CACHE_DIR")
        .env_remove("HARL_TRIALS")
        .env_remove("HARL_SEED")
        .env_remove("HARL_STRATEGY")
        .env_remove("HARL_COST_MODEL")
        .env_remove("CARGO_MANIFEST_DIR")
}

#[test]
fn cargo_harl_tune_tunes_a_crate_which_then_runs_its_tuned_kernels() {
    let dir = tempfile::tempdir().expect("tempdir");
    let krate = new_crate(dir.path());
    let manifest = krate.join("Cargo.toml");
    let tuned = ok(
        cargo_env(&mut Command::new(env!("CARGO_BIN_EXE_cargo-harl")))
            .args(["harl", "tune", "--trials", "6", "--manifest-path"])
            .arg(&manifest)
            .output()
            .expect("run cargo-harl"),
        "cargo harl tune",
    );
    assert!(tuned.contains("2 kernel(s), 2 to tune"), "{tuned}");
    assert!(tuned.contains("speed-up"), "{tuned}");
    let cache = krate.join("tuning-cache");
    let files: Vec<_> = std::fs::read_dir(&cache)
        .expect("the crate's tuning-cache/")
        .filter_map(Result::ok)
        .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
        .collect();
    assert_eq!(files.len(), 1, "{tuned}");
    let lines = std::fs::read_to_string(files[0].path()).expect("read");
    assert_eq!(lines.lines().count(), 2, "{lines}");

    let run = ok(
        cargo_env(
            Command::new("cargo")
                .arg("run")
                .arg("--manifest-path")
                .arg(&manifest),
        )
        .output()
        .expect("cargo run"),
        "cargo run",
    );
    assert!(
        run.contains("SCHEDULE: tuning cache, exact target"),
        "{run}"
    );
    assert!(run.contains("CHECK: ok"), "{run}");

    let report = ok(
        cargo_env(&mut Command::new(env!("CARGO_BIN_EXE_cargo-harl")))
            .args(["harl", "report", "--manifest-path"])
            .arg(&manifest)
            .arg("--out")
            .arg(dir.path().join("plots"))
            .output()
            .expect("run cargo-harl"),
        "cargo harl report",
    );
    assert!(
        report.contains("mm") && report.contains("softmax_rows"),
        "{report}"
    );

    // Everything has a record now: a second tune has nothing to do.
    let again = ok(
        cargo_env(&mut Command::new(env!("CARGO_BIN_EXE_cargo-harl")))
            .args(["harl", "tune", "--manifest-path"])
            .arg(&manifest)
            .output()
            .expect("run cargo-harl"),
        "cargo harl tune, again",
    );
    assert!(again.contains("0 to tune"), "{again}");
}
