//! End to end, as a new user would do it: a fresh crate in a temporary directory depends on
//! `harl` and `harl-build`, declares kernels with `#[harl::kernel]`, runs harl's build step from
//! `build.rs`, and checks the kernels against naive loops at run time.
//!
//! Every case runs `cargo run` on its own crate; they share `CARGO_TARGET_DIR=target/e2e` so that
//! the dependencies (harl, syn, rayon, ...) are compiled once and reused across cases and runs.
//!
//! Cases:
//! - no tuning cache: both kernels use the default schedule;
//! - a broken tuning cache (a corrupt line, a future-version record, a record whose schedule
//!   does not lower): the build warns about each line and still succeeds with the default
//!   schedule;
//! - a valid tuning record: the kernel is built with that schedule;
//! - a hostile tuning cache (newlines and directives in every string a warning can quote,
//!   overflowing factors and positions): every line the build script printed is one of harl's
//!   own directives, and the kernels are the default ones and correct.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use harl_build::cache::{Record, TuningCache};
use harl_build::lower::lower;
use harl_build::schedule::{Schedule, Step};
use harl_build::target::TargetFingerprint;
use harl_te::Graph;

/// The downstream programs' helpers: deterministic data, and a naive 3x3 convolution with
/// stride 2 and padding 1 (NCHW, square, one image) to check kernels against.
macro_rules! helpers {
    () => {
        r#"
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn conv3x3_s2_reference(x: &[f32], w: &[f32], c: usize, h: usize, f: usize) -> Vec<f32> {
    let o = (h - 1) / 2 + 1;
    let mut out = vec![0.0f32; f * o * o];
    for ff in 0..f {
        for oh in 0..o {
            for ow in 0..o {
                let mut acc = 0.0f32;
                for cc in 0..c {
                    for r in 0..3 {
                        for s in 0..3 {
                            let (ih, iw) = ((2 * oh + r) as isize - 1, (2 * ow + s) as isize - 1);
                            if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < h {
                                acc += x[(cc * h + ih as usize) * h + iw as usize]
                                    * w[((ff * c + cc) * 3 + r) * 3 + s];
                            }
                        }
                    }
                }
                out[(ff * o + oh) * o + ow] = acc;
            }
        }
    }
    out
}
"#
    };
}

/// The downstream crate's `src/main.rs`: two kernels, checked against naive loops.
const MAIN_RS: &str = concat!(
    r#"//! A harl user's program: two kernels, checked against naive loops.

/// A dense layer written in the compute DSL, with a bias + relu epilogue.
#[harl::kernel(M = 24, K = 40, N = 36)]
fn dense(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>, bias: Tensor<f32, N>) -> Tensor<f32, M, N> {
    let mm = compute([M, N], |i, j| sum(K, |k| a[[i, k]] * w[[k, j]]));
    compute([M, N], |i, j| max(mm[[i, j]] + bias[j], 0.0))
}

/// A strided, padded convolution from the op library (NCHW, output 9 -> 5).
#[harl::kernel(C = 3, H = 9, W = 9, F = 4)]
fn conv(x: Tensor<f32, 1, C, H, W>, w: Tensor<f32, F, C, 3, 3>) -> Tensor<f32, 1, F, 5, 5> {
    conv2d(x, w).stride(2).pad(1)
}

"#,
    helpers!(),
    r#"
fn check(name: &str, got: &[f32], want: &[f32], terms: usize) -> bool {
    let tol = 1e-5 * terms as f32;
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
        .fold(0.0f32, f32::max);
    let ok = got.len() == want.len() && worst <= tol;
    println!("CHECK {name}: max relative error {worst:.2e} (tolerance {tol:.1e}) {}", if ok { "ok" } else { "MISMATCH" });
    ok
}

fn main() {
    println!("SCHEDULE: {}", dense::schedule_source());
    println!("SCHEDULE conv: {}", conv::schedule_source());
    println!("WORKLOAD_KEY: {}", dense::WORKLOAD_KEY);

    let (m, k, n) = (24, 40, 36);
    let (a, w, bias) = (data(m * k, 1), data(k * n, 2), data(n, 3));
    let mut out = vec![f32::NAN; m * n];
    dense(&a, &w, &bias, &mut out).expect("dense: buffer lengths match");
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for kk in 0..k {
                acc += a[i * k + kk] * w[kk * n + j];
            }
            want[i * n + j] = (acc + bias[j]).max(0.0);
        }
    }
    let mut ok = check("dense", &out, &want, k);

    let (c, h, f, o) = (3, 9, 4, 5);
    let (x, wt) = (data(c * h * h, 4), data(f * c * 9, 5));
    let mut y = vec![f32::NAN; f * o * o];
    conv(&x, &wt, &mut y).expect("conv: buffer lengths match");
    let want = conv3x3_s2_reference(&x, &wt, c, h, f);
    ok &= check("conv", &y, &want, c * 9);

    // A wrong length is a typed error, not a panic.
    match dense(&a[1..], &w, &bias, &mut out) {
        Err(e) => println!("SHORT INPUT: {e}"),
        Ok(()) => {
            println!("SHORT INPUT: accepted");
            ok = false;
        }
    }

    if !ok {
        eprintln!("e2e: a kernel did not match the reference");
        std::process::exit(1);
    }
    println!("E2E OK");
}
"#
);

const BUILD_RS: &str = r#"fn main() {
    harl_build::Builder::new().scan_crate().compile();
}
"#;

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Writes a fresh downstream crate named `package` into a new temporary directory.
fn new_crate(package: &str) -> tempfile::TempDir {
    let dir = tempfile::Builder::new()
        .prefix("harl-e2e-")
        .tempdir()
        .expect("create a temporary directory");
    let ws = workspace();
    let manifest = format!(
        r#"[package]
name = "{package}"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
harl = {{ path = '{}' }}

[build-dependencies]
harl-build = {{ path = '{}' }}

# Standalone, as a user's crate would be.
[workspace]
"#,
        ws.display(),
        ws.join("harl-build").display()
    );
    std::fs::write(dir.path().join("Cargo.toml"), manifest).unwrap();
    std::fs::write(dir.path().join("build.rs"), BUILD_RS).unwrap();
    std::fs::create_dir(dir.path().join("src")).unwrap();
    std::fs::write(dir.path().join("src/main.rs"), MAIN_RS).unwrap();
    // Resolve to the versions the workspace already uses (and already compiled under
    // target/e2e): no registry round trip and the same dependency artifacts across cases.
    let lock = ws.join("Cargo.lock");
    if lock.exists() {
        std::fs::copy(&lock, dir.path().join("Cargo.lock")).unwrap();
    }
    dir
}

/// `cargo run` in `dir`, with `HARL_CACHE_DIR` set to `cache` (or unset) and the other HARL_*
/// variables cleared so that the outer environment cannot change the outcome.
fn cargo_run(dir: &Path, cache: Option<&Path>) -> Output {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(dir)
        .args(["run", "--color", "never"])
        .env("CARGO_TARGET_DIR", workspace().join("target").join("e2e"))
        .env("CARGO_TERM_COLOR", "never");
    for var in [
        "HARL_TUNE",
        "HARL_CACHE_DIR",
        "HARL_TRIALS",
        "HARL_SEED",
        "HARL_STRATEGY",
        "HARL_COST_MODEL",
    ] {
        cmd.env_remove(var);
    }
    if let Some(cache) = cache {
        cmd.env("HARL_CACHE_DIR", cache);
    }
    cmd.output().expect("run cargo")
}

struct Run {
    success: bool,
    stdout: String,
    stderr: String,
}

impl Run {
    fn of(out: Output) -> Run {
        Run {
            success: out.status.success(),
            stdout: String::from_utf8_lossy(&out.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
        }
    }

    fn context(&self) -> String {
        format!(
            "--- stdout ---\n{}\n--- stderr ---\n{}",
            self.stdout, self.stderr
        )
    }

    /// The text after `prefix` on the first stdout line that starts with it.
    fn line(&self, prefix: &str) -> &str {
        self.stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no `{prefix}` line in the output\n{}", self.context()))
            .trim()
    }

    /// The `warning:` lines cargo printed that come from harl's build step.
    fn harl_warnings(&self) -> Vec<&str> {
        self.stderr
            .lines()
            .filter(|l| l.starts_with("warning:") && l.contains("harl"))
            .collect()
    }

    /// Both kernels matched their naive loops and the program exited 0.
    fn assert_kernels_correct(&self) {
        assert!(self.success, "the program failed\n{}", self.context());
        for name in ["dense", "conv"] {
            let check = self.line(&format!("CHECK {name}:"));
            assert!(
                check.ends_with(" ok"),
                "{name}: {check}\n{}",
                self.context()
            );
        }
        let short = self.line("SHORT INPUT:");
        assert!(
            short.contains("kernel `dense`") && short.contains("argument `a`"),
            "unexpected length error: {short}"
        );
        assert!(self.stdout.contains("E2E OK"), "{}", self.context());
    }
}

/// The te graph and workload key of kernel `name` in `MAIN_RS`, parsed by the same DSL parser
/// the build script and the macro use.
fn kernel_graph(name: &str) -> (Graph, String) {
    let mut decls = Vec::new();
    harl_build::scan::scan_source(MAIN_RS, &mut decls);
    let decl = decls
        .into_iter()
        .find(|d| d.name == name)
        .unwrap_or_else(|| panic!("kernel `{name}` not found in MAIN_RS"));
    let key = decl.graph.workload_key();
    (decl.graph, key)
}

/// A cache record for `dense` on this machine with `schedule`, as the line
/// `TuningCache::append` writes, plus the path of the file it belongs in.
fn record_line(cache_dir: &Path, key: &str, schedule: Schedule) -> (PathBuf, String) {
    let scratch = tempfile::tempdir().unwrap();
    let cache = TuningCache::new(scratch.path());
    let record = Record::new(
        key,
        "e2e dense",
        TargetFingerprint::host(),
        schedule,
        1e-4,
        16,
    );
    let path = cache.append(&record).expect("append a record");
    let line = std::fs::read_to_string(&path).unwrap().trim().to_string();
    let file_name = path.file_name().unwrap().to_owned();
    (cache_dir.join(file_name), line)
}

#[test]
fn fresh_crate_builds_and_runs_with_default_schedules() {
    let krate = new_crate("harl-e2e-fresh");
    let run = Run::of(cargo_run(krate.path(), None));
    run.assert_kernels_correct();
    assert_eq!(
        run.line("SCHEDULE:"),
        "default schedule",
        "{}",
        run.context()
    );
    assert_eq!(run.line("SCHEDULE conv:"), "default schedule");
    let (_, key) = kernel_graph("dense");
    assert_eq!(
        run.line("WORKLOAD_KEY:"),
        key,
        "the build saw another graph than the test"
    );
    assert!(
        run.harl_warnings().is_empty(),
        "unexpected warnings:\n{}",
        run.harl_warnings().join("\n")
    );
}

#[test]
fn broken_cache_records_warn_and_fall_back_to_the_default_schedule() {
    let krate = new_crate("harl-e2e-badcache");
    let cache_dir = krate.path().join("bad-cache");
    std::fs::create_dir(&cache_dir).unwrap();
    let (graph, key) = kernel_graph("dense");

    // (c) The right workload key, but a split of a loop that does not exist.
    let bad_split = Schedule {
        steps: vec![Step::Split {
            stage: 0,
            at: 99,
            factors: vec![2],
        }],
    };
    assert!(
        lower(&graph, &bad_split).is_err(),
        "the bad schedule lowers"
    );
    let (file, invalid) = record_line(&cache_dir, &key, bad_split);
    assert!(
        invalid.contains(r#"{"step":"split","stage":0,"at":99,"factors":[2]}"#),
        "{invalid}"
    );

    // (b) A record from a future harl: same key and a valid schedule, another version.
    let (_, valid) = record_line(&cache_dir, &key, Schedule::naive());
    assert!(valid.starts_with(r#"{"version":1,"#), "{valid}");
    let future = valid.replacen(r#""version":1,"#, r#""version":2,"#, 1);

    // (a) A corrupt line: a record cut off mid-way.
    let corrupt = &valid[..valid.len() / 2];

    std::fs::write(&file, format!("{corrupt}\n{future}\n{invalid}\n")).unwrap();

    let run = Run::of(cargo_run(krate.path(), Some(&cache_dir)));
    run.assert_kernels_correct();
    assert_eq!(
        run.line("SCHEDULE:"),
        "default schedule",
        "{}",
        run.context()
    );
    assert_eq!(run.line("SCHEDULE conv:"), "default schedule");

    let warnings = run.harl_warnings();
    let file = file.display().to_string();
    for (line, reason) in [
        (1, "invalid JSON"),
        (2, "unknown record version 2"),
        (3, "record rejected"),
    ] {
        let at = format!("{file}:{line}: {reason}");
        assert!(
            warnings
                .iter()
                .any(|w| w.contains(&at) && w.contains("kernel `dense`")),
            "no warning for line {line} ({reason})\n{}",
            run.context()
        );
    }
    // A corrupt line names no workload, so every kernel's lookup reports it; the other two
    // lines belong to `dense` only.
    assert!(
        warnings
            .iter()
            .any(|w| w.contains("kernel `conv`") && w.contains(&format!("{file}:1: invalid JSON"))),
        "{}",
        warnings.join("\n")
    );
    assert_eq!(warnings.len(), 4, "{}", warnings.join("\n"));
}

#[test]
fn valid_cache_record_is_used() {
    let krate = new_crate("harl-e2e-cached");
    let cache_dir = krate.path().join("tuning-cache");
    std::fs::create_dir(&cache_dir).unwrap();
    let (graph, key) = kernel_graph("dense");

    // Tile the output columns by 4, keep the reduction inside, fuse the bias + relu epilogue
    // into the tile and run the rows on the thread pool.
    let schedule = Schedule {
        steps: vec![
            Step::Split {
                stage: 0,
                at: 1,
                factors: vec![4],
            },
            Step::Reorder {
                stage: 0,
                order: vec![0, 1, 3, 2],
            },
            Step::ComputeAt {
                stage: 1,
                target: 0,
                at: 1,
            },
            Step::Parallel { stage: 0, at: 0 },
        ],
    };
    if let Err(e) = lower(&graph, &schedule) {
        panic!("the hand-written schedule does not lower: {e}");
    }
    let (file, line) = record_line(&cache_dir, &key, schedule);
    std::fs::write(&file, format!("{line}\n")).unwrap();

    // Through HARL_CACHE_DIR, pointing at the crate's default location anyway.
    let run = Run::of(cargo_run(krate.path(), Some(&cache_dir)));
    run.assert_kernels_correct();
    let source = run.line("SCHEDULE:");
    assert!(
        source.starts_with("tuning cache") && source.contains("1.000e-4"),
        "dense did not use the cache record: `{source}`\n{}",
        run.context()
    );
    assert_eq!(run.line("SCHEDULE conv:"), "default schedule");
    assert!(
        run.harl_warnings().is_empty(),
        "unexpected warnings:\n{}",
        run.harl_warnings().join("\n")
    );
}

#[test]
fn a_crate_without_the_build_step_gets_an_error_saying_how_to_add_it() {
    let dir = new_crate("harl_e2e_no_build_rs");
    std::fs::remove_file(dir.path().join("build.rs")).expect("remove build.rs");
    let run = Run::of(cargo_run(dir.path(), None));
    assert!(
        !run.success,
        "built without its build step\n{}",
        run.context()
    );
    assert!(
        run.stderr
            .contains("needs a build script that runs harl-build")
            && run
                .stderr
                .contains("harl_build::Builder::new().scan_crate().compile()"),
        "{}",
        run.context()
    );
}

/// The stdout of the newest run of `package`'s build script, as cargo stored it.
fn build_script_output(package: &str) -> String {
    let build = workspace().join("target/e2e/debug/build");
    let newest = std::fs::read_dir(&build)
        .expect("the build directory")
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_string_lossy()
                .starts_with(&format!("{package}-"))
        })
        .map(|e| e.path().join("output"))
        .filter(|p| p.exists())
        .max_by_key(|p| p.metadata().and_then(|m| m.modified()).ok())
        .expect("the build script's output file");
    String::from_utf8_lossy(&std::fs::read(newest).unwrap()).into_owned()
}

#[test]
fn hostile_cache_lines_only_ever_print_harls_own_directives() {
    let package = "harl-e2e-hostile";
    let krate = new_crate(package);
    let cache_dir = krate.path().join("hostile-cache");
    std::fs::create_dir(&cache_dir).unwrap();
    let (_, key) = kernel_graph("dense");
    let (file, valid) = record_line(&cache_dir, &key, Schedule::naive());
    let with_steps = |steps: &str| {
        valid.replacen(
            r#""schedule":{"steps":[]}"#,
            &format!(r#""schedule":{{"steps":{steps}}}"#),
            1,
        )
    };
    assert_ne!(with_steps("[1]"), valid, "the record's layout changed");
    let injected = "\\ncargo:rustc-cfg=harl_pwned\\ncargo:rustc-env=HARL_PWNED=1\\r\\ncargo:rustc-link-arg=-Wl,--pwned\\u2028cargo::rustc-cfg=harl_pwned2";
    let lines = [
        // Every string a serde or schedule error can quote.
        with_steps(&format!(r#"[{{"step":"split{injected}","stage":0}}]"#)),
        with_steps(&format!(r#"[{{"step":"fuse","stage":"{injected}"}}]"#)),
        valid.replacen(r#""version":1"#, &format!(r#""version":"{injected}""#), 1),
        valid.replacen(r#""harl_version":""#, r#""harl_version":1,"x":""#, 1),
        format!("{{\"workload_key\":\"{key}\",\"version\":1,\"{injected}\":0}}"),
        format!("not json {}", injected.replace("\\n", "\n")),
        // A record that wraps its split factors (the binary segfaulted on it) and one that
        // overflows a loop position (the build script panicked).
        with_steps(r#"[{"step":"split","stage":0,"at":1,"factors":[4611686018427387905,4]}]"#),
        with_steps(r#"[{"step":"fuse","stage":0,"at":18446744073709551615}]"#),
    ];
    std::fs::write(&file, lines.join("\n") + "\n").unwrap();

    let run = Run::of(cargo_run(krate.path(), Some(&cache_dir)));
    run.assert_kernels_correct();
    assert_eq!(
        run.line("SCHEDULE:"),
        "default schedule",
        "{}",
        run.context()
    );
    assert!(
        !run.stdout.contains("PWNED") && !run.harl_warnings().is_empty(),
        "{}",
        run.context()
    );
    let output = build_script_output(package);
    let mut warnings = 0;
    for line in output.lines() {
        let ours = line.starts_with("cargo:warning=harl: ")
            || line.starts_with("cargo:rerun-if-env-changed=HARL_")
            || line.starts_with("cargo:rerun-if-changed=");
        assert!(
            ours,
            "the build script printed a line harl did not mean: {line:?}\n{output}"
        );
        warnings += usize::from(line.starts_with("cargo:warning="));
    }
    // One warning per hostile line that names `dense` or no workload, per kernel that reads it.
    assert!(warnings >= lines.len(), "{warnings} warnings\n{output}");
}

#[test]
fn raw_identifiers_an_input_named_out_and_a_300_character_name_build_and_run() {
    let krate = new_crate("harl-e2e-raw-names");
    let main = r#"
#[harl::kernel(N = 6)]
fn r#match(r#type: Tensor<f32, N>, out: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |r#i| r#type[[r#i]] * 2.0 + out[[r#i]])
}

#[harl::kernel]
fn LONG_NAME(x: Tensor<f32, 4>) -> Tensor<f32, 4> { -x }

#[harl::kernel]
fn LONG_NAME_twin(x: Tensor<f32, 4>) -> Tensor<f32, 4> { -x }

fn main() {
    let mut neg = vec![0.0f32; 4];
    LONG_NAME(&[1.0, 2.0, 3.0, 4.0], &mut neg).expect("lengths");
    assert_eq!(neg, [-1.0, -2.0, -3.0, -4.0]);
    LONG_NAME_twin(&[1.0, 2.0, 3.0, 4.0], &mut neg).expect("lengths");
    assert_eq!(neg, [-1.0, -2.0, -3.0, -4.0]);
    let (t, o) = (vec![1.0f32, 2.0, 3.0, 4.0, 5.0, 6.0], vec![0.5f32; 6]);
    let mut got = vec![0.0f32; 6];
    r#match(&t, &o, &mut got).expect("lengths");
    assert_eq!(got, [2.5, 4.5, 6.5, 8.5, 10.5, 12.5]);
    println!("RAW OK {}", r#match::schedule_source());
}
"#;
    // A name longer than a file name may be (255 bytes): the generated file's name is cut.
    let long = format!("neg_{}", "x".repeat(300));
    let main = main.replace("LONG_NAME", &long);
    std::fs::write(krate.path().join("src/main.rs"), main).unwrap();
    let run = Run::of(cargo_run(krate.path(), None));
    assert!(
        run.success && run.stdout.contains("RAW OK default schedule"),
        "{}",
        run.context()
    );
    // The two long names share their first 64 characters and their workload, not their file.
    let mut decls = Vec::new();
    harl_build::scan::scan_source(
        &std::fs::read_to_string(krate.path().join("src/main.rs")).unwrap(),
        &mut decls,
    );
    let files: std::collections::HashSet<String> =
        decls.iter().map(|d| d.generated_file()).collect();
    assert_eq!(files.len(), decls.len(), "{files:?}");
    assert!(files.iter().all(|f| f.len() < 200), "{files:?}");
}

/// Weights: `prepare` once, then `Prepared::run`, computes what the plain call computes, bit for
/// bit, and what naive loops compute: a dense layer whose matrix is read in panels and a
/// strided convolution whose filter is read in a layout, both copied once.
#[test]
fn weights_are_prepared_once_and_compute_the_same() {
    let krate = new_crate("harl-e2e-weights");
    let main = concat!(
        r#"
#[harl::kernel(M = 4, K = 40, N = 64)]
fn dense(x: Tensor<f32, M, K>, w: Weight<f32, K, N>, b: Weight<f32, N>) -> Tensor<f32, M, N> {
    let mm = compute([M, N], |i, j| sum(K, |k| x[[i, k]] * w[[k, j]]));
    compute([M, N], |i, j| max(mm[[i, j]] + b[j], 0.0))
}

#[harl::kernel(C = 8, H = 9, F = 48)]
fn conv(x: Tensor<f32, 1, C, H, H>, w: Weight<f32, F, C, 3, 3>) -> Tensor<f32, 1, F, 5, 5> {
    conv2d(x, w).stride(2).pad(1)
}

"#,
        helpers!(),
        r#"
fn main() {
    let (m, k, n) = (4, 40, 64);
    let (x, w, b) = (data(m * k, 1), data(k * n, 2), data(n, 3));
    let mut plain = vec![f32::NAN; m * n];
    dense(&x, &w, &b, &mut plain).expect("lengths");
    let layer = dense::prepare(&w, &b).expect("lengths");
    assert!(dense::prepare(&w[1..], &b).is_err(), "a short weight is an error");
    for _ in 0..2 {
        let mut got = vec![f32::NAN; m * n];
        layer.run(&x, &mut got).expect("lengths");
        assert_eq!(format!("{got:?}"), format!("{plain:?}"));
    }
    for i in 0..m {
        for j in 0..n {
            let acc: f32 = (0..k).map(|kk| x[i * k + kk] * w[kk * n + j]).sum();
            let want = (acc + b[j]).max(0.0);
            assert!((plain[i * n + j] - want).abs() <= 1e-4 * (1.0 + want.abs()));
        }
    }

    let (c, h, f, o) = (8, 9, 48, 5);
    let (x, w) = (data(c * h * h, 4), data(f * c * 9, 5));
    let mut plain = vec![f32::NAN; f * o * o];
    conv(&x, &w, &mut plain).expect("lengths");
    let prepared = conv::prepare(&w).expect("lengths");
    let mut got = vec![f32::NAN; f * o * o];
    prepared.run(&x, &mut got).expect("lengths");
    assert_eq!(format!("{got:?}"), format!("{plain:?}"));
    for (got, want) in plain.iter().zip(conv3x3_s2_reference(&x, &w, c, h, f)) {
        assert!((got - want).abs() <= 1e-4 * (1.0 + want.abs()), "{got} vs {want}");
    }
    println!("WEIGHTS OK");
}
"#
    );
    std::fs::write(krate.path().join("src/main.rs"), main).unwrap();
    let run = Run::of(cargo_run(krate.path(), None));
    assert!(
        run.success && run.stdout.contains("WEIGHTS OK"),
        "{}",
        run.context()
    );
}

/// ONNX models in, `Model`s out: a fresh crate registers the CNN (weights embedded) and the
/// encoder layer (weights in a file) of harl-te's import tests with `Builder::onnx`, runs each
/// (twice, the second time on the same buffers) and compares with onnxruntime's output; the
/// encoder also from a copy of its weights file, and a damaged copy, a truncated one and the
/// CNN's file are each an error; a model with an op harl does not import fails the build with
/// a message naming it.
#[test]
fn an_onnx_model_builds_into_a_model_that_matches_onnxruntime() {
    let krate = new_crate("harl-e2e-onnx");
    let manifest_path = krate.path().join("Cargo.toml");
    let manifest = std::fs::read_to_string(&manifest_path).unwrap();
    let build_dep = format!(
        "harl-build = {{ path = '{}' }}",
        workspace().join("harl-build").display()
    );
    assert!(manifest.contains(&build_dep));
    let manifest = manifest.replace(
        &build_dep,
        &format!(
            "harl-build = {{ path = '{}', features = [\"onnx\"] }}",
            workspace().join("harl-build").display()
        ),
    );
    std::fs::write(&manifest_path, manifest).unwrap();
    let fixtures = workspace().join("harl-te/tests/onnx");
    let build = |models: &[(&str, &str, &str)]| {
        let calls: String = models
            .iter()
            .map(|(name, file, weights)| {
                format!(
                    ".onnx_with(\"{name}\", r\"{}\", harl_build::ModelWeights::{weights})",
                    fixtures.join(file).display()
                )
            })
            .collect();
        format!("fn main() {{\n    harl_build::Builder::new(){calls}.compile();\n}}\n")
    };
    let models = [
        ("cnn", "cnn.onnx", "Embedded"),
        ("encoder", "encoder.onnx", "File"),
    ];
    std::fs::write(krate.path().join("build.rs"), build(&models)).unwrap();
    let main = format!(
        r#####"harl::include_kernels!();

fn floats(path: &str) -> Vec<f32> {{
    std::fs::read(path)
        .expect("fixture")
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}}

macro_rules! check {{
    ($model:ident, $dir:expr) => {{{{
        check!($model, $dir, $model::Model::new().expect("weights"))
    }}}};
    ($model:ident, $dir:expr, $made:expr) => {{{{
        let x = floats(&format!("{{}}/{{}}.in.bin", $dir, stringify!($model)));
        let want = floats(&format!("{{}}/{{}}.out.bin", $dir, stringify!($model)));
        assert_eq!(x.len(), $model::INPUT_SHAPE.iter().product::<usize>());
        let mut model = $made;
        for _ in 0..2 {{{{
            let mut got = vec![f32::NAN; want.len()];
            model.run(&x, &mut got).expect("lengths");
            let scale = want.iter().fold(1e-6f32, |m, v| m.max(v.abs()));
            for (g, w) in got.iter().zip(&want) {{{{
                assert!((g - w).abs() <= 1e-4 * scale, "{{g}} vs onnxruntime's {{w}}");
            }}}}
        }}}}
        assert!(model.run(&x[1..], &mut vec![0.0; want.len()]).is_err());
    }}}};
}}

fn main() {{
    check!(cnn, r"{dir}");
    check!(encoder, r"{dir}");
    // A shipped copy of the encoder's weights file, read from where the binary finds it.
    let copy = std::env::temp_dir().join(format!("harl-e2e-{{}}.weights", std::process::id()));
    std::fs::copy(encoder::WEIGHTS_PATH, &copy).expect("copy");
    check!(encoder, r"{dir}", encoder::Model::load(&copy).expect("the copy loads"));
    let good = std::fs::read(&copy).expect("read");
    let _ = std::fs::remove_file(&copy);
    let mut damaged = good.clone();
    let last = damaged.len() - 1;
    damaged[last] ^= 0x40;
    let cnn_file = std::fs::read(cnn::WEIGHTS_PATH).expect("cnn's file");
    for (what, bytes) in [("damaged", &damaged[..]), ("truncated", &good[..good.len() - 4]), ("another model", &cnn_file[..])] {{
        match encoder::Model::from_weights(bytes) {{
            Err(harl::KernelError::Weights {{ model: "encoder", why }}) => println!("{{what}}: {{why}}"),
            Err(e) => panic!("{{what}}: {{e}}"),
            Ok(_) => panic!("{{what}} weights were accepted"),
        }}
    }}
    assert!(encoder::Model::load("no/such/file.weights").is_err());
    println!("ONNX OK");
}}
"#####,
        dir = fixtures.display(),
    );
    std::fs::write(krate.path().join("src/main.rs"), main).unwrap();
    let run = Run::of(cargo_run(krate.path(), None));
    assert!(
        run.success && run.stdout.contains("ONNX OK"),
        "{}",
        run.context()
    );
    for said in [
        "damaged: the weights do not match their fingerprint",
        "truncated: the file has",
        "another model: the file holds weights",
    ] {
        assert!(run.stdout.contains(said), "{said}: {}", run.context());
    }
    std::fs::write(
        krate.path().join("build.rs"),
        build(&[("bad", "unsupported.onnx", "Embedded")]),
    )
    .unwrap();
    let run = Run::of(cargo_run(krate.path(), None));
    assert!(
        !run.success && run.stderr.contains("unsupported ONNX op `Concat`"),
        "{}",
        run.context()
    );
}
