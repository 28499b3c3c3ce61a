//! `harl-bench e2e --model M.onnx [--threads 1,2] [--rounds 3] [--trials N [--seconds S]
//! --scheduler harl|gradient --strategy ansor|harl --seed K] --out DIR`: a whole network, built
//! by harl as a user's crate builds it, against onnxruntime on the same ONNX file.
//!
//! With `--trials` the build tunes first, as `HARL_TUNE=on` does: this workspace's
//! `cargo-harl` (release-built) tunes all the network's tasks as one job of N trials, the task
//! scheduler spreading them by each task's weight, records into `DIR/tuning-cache`; the
//! tune's table and log are copied to `DIR/tune-results.json` and `DIR/tune.log`.
//!
//! The model is imported (its tasks counted), then a fresh downstream crate registers it with
//! `harl_build::Builder::onnx` and `cargo build --release` builds it (kernels from the tuning
//! cache, `HARL_CACHE_DIR` or none: default schedules). Its binary runs `Model::run` in a
//! rayon pool of the thread count: two warm-up runs, then runs until 1 s and 10 runs, median;
//! `scripts/ort_e2e.py` does the same with onnxruntime (`intra_op_num_threads`). The two
//! alternate over `--rounds`, on one input from `[-0.5, 0.5)`; harl's output is compared with
//! onnxruntime's. `DIR/e2e.json` has `harl_s`, `ort_s` (medians of the rounds' medians),
//! `paired_ratio` (the median over the rounds of harl's median over onnxruntime's in the same
//! round: a slow spell of a shared machine then moves both sides of a ratio, not one median)
//! and `max_rel_err` (largest difference over the largest |output|) per thread count;
//! `DIR/tasks.json` lists the network's tasks (kernel name, weight, workload key, graph).

use crate::stats::median;
use crate::Error;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of `e2e`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// The ONNX model (`scripts/make_networks.py` makes ResNet-50, MobileNet-V2, BERT-base).
    #[arg(long)]
    pub model: PathBuf,
    /// Thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Alternations of harl and onnxruntime (medians).
    #[arg(long, default_value_t = 3, value_parser = crate::harness::positive)]
    pub rounds: usize,
    /// Output directory (e2e.json, table.md, and with `--trials` the tuning cache the tune
    /// wrote); the downstream crate, the input and the outputs are kept in the workspace's
    /// `target/e2e-bench`.
    #[arg(long, default_value = "e2e-out")]
    pub out: PathBuf,
    /// Tune the network first, as a build with `HARL_TUNE=on` does: this many trials shared
    /// by all its tasks (`HARL_TOTAL_TRIALS`), records into `DIR/tuning-cache`.
    #[arg(long)]
    pub trials: Option<usize>,
    /// With `--trials`: the tune's wall-time budget in seconds (`HARL_TOTAL_SECONDS`).
    #[arg(long)]
    pub seconds: Option<u64>,
    /// With `--trials`: the task scheduler (`HARL_TASK_SCHEDULER`: harl, gradient, round-robin).
    #[arg(long, default_value = harl_tune::task_scheduler::DEFAULT_SCHEDULER)]
    pub scheduler: String,
    /// With `--trials`: the search strategy (`HARL_STRATEGY`).
    #[arg(long, default_value = "ansor")]
    pub strategy: String,
    /// With `--trials`: the seed (`HARL_SEED`).
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
}

/// How the downstream crate gets its schedules.
enum Schedules {
    /// From `HARL_CACHE_DIR` if set, else the defaults.
    Cached,
    /// Tuned by the build, with this tuner, into this cache.
    Tuned { tuner: PathBuf, cache: PathBuf },
}

/// Runs the comparison and prints the table.
pub fn run(o: &Options) -> Result<(), Error> {
    let model = o.model.canonicalize()?;
    let net = harl_te::onnx::import(&model)?;
    let name = model
        .file_stem()
        .and_then(|s| s.to_str())
        .unwrap_or("model")
        .to_string();
    println!(
        "{name}: {} kernel calls of {} distinct tasks",
        net.calls.len(),
        net.tasks.len()
    );
    std::fs::create_dir_all(&o.out)?;
    // The tasks' graphs (no weights): what the records in a tuning cache replay on.
    let tasks: Vec<_> = net
        .tasks
        .iter()
        .enumerate()
        .map(|(i, t)| json!({"kernel": format!("net_t{i}"), "name": t.name, "weight": t.weight, "workload_key": t.graph.workload_key(), "graph": t.graph}))
        .collect();
    std::fs::write(o.out.join("tasks.json"), serde_json::to_string(&tasks)?)?;
    // The crate, the input and the outputs go to the target directory; `out` keeps the report.
    let work = target_dir().join(format!("work-{name}"));
    std::fs::create_dir_all(&work)?;
    let work = work.canonicalize()?;
    let input_len: usize = net
        .inputs
        .first()
        .map(|&v| net.values[v].shape.iter().product())
        .ok_or("the model has no input")?;
    let input = work.join("input.bin");
    std::fs::write(&input, floats_bytes(&crate::workload::data(input_len, 7)))?;
    let krate = work.join("crate");
    // A package of its own per model: crates of one name share their binary's path in the
    // target directory, and a fresh one would run another model's binary.
    let package: String = format!("harl-e2e-{name}")
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    write_crate(&krate, &model, &package)?;
    let schedules = match o.trials {
        None => Schedules::Cached,
        Some(_) => {
            let cache = o.out.join("tuning-cache");
            // A fresh tune: records of an earlier run would make it skip every task.
            let _ = std::fs::remove_dir_all(&cache);
            std::fs::create_dir_all(&cache)?;
            Schedules::Tuned {
                tuner: tuner()?,
                cache: cache.canonicalize()?,
            }
        }
    };
    let started = std::time::Instant::now();
    let exe = build(&krate, &package, o, &schedules)?;
    let build_s = started.elapsed().as_secs_f64();
    println!("built in {build_s:.0} s");
    if matches!(schedules, Schedules::Tuned { .. }) {
        keep_tune_outputs(&package, &o.out)?;
    }
    let mut rows = Vec::new();
    let mut table = String::from(
        "| threads | harl ms | onnxruntime ms | harl / onnxruntime | paired ratio | max rel. error |\n|---|---|---|---|---|---|\n",
    );
    for &t in &o.threads {
        let (mut harl, mut ort) = (Vec::new(), Vec::new());
        let (harl_out, ort_out) = (
            work.join(format!("harl-{t}.bin")),
            work.join(format!("ort-{t}.bin")),
        );
        let mut calls = Vec::new();
        for _ in 0..o.rounds {
            let (h, c) = run_harl(&exe, &input, &harl_out, t)?;
            harl.push(h);
            calls = c;
            ort.push(run_ort(&model, &input, &ort_out, t)?);
        }
        // The slowest calls of the last round, for reading where the time goes.
        let mut slow = calls.clone();
        slow.sort_by(|a, b| b.0.total_cmp(&a.0));
        for (s, what) in slow.iter().take(8) {
            println!("  {t} thread(s): {:.3} ms  {what}", s * 1e3);
        }
        let (h, r) = (
            median(&harl).ok_or("no runs")?,
            median(&ort).ok_or("no runs")?,
        );
        let paired: Vec<f64> = harl.iter().zip(&ort).map(|(h, r)| h / r).collect();
        let paired = median(&paired).ok_or("no runs")?;
        let err = max_rel_err(&read_floats(&harl_out)?, &read_floats(&ort_out)?)?;
        table.push_str(&format!(
            "| {t} | {:.2} | {:.2} | {:.2}x | {paired:.2}x | {err:.1e} |\n",
            h * 1e3,
            r * 1e3,
            h / r
        ));
        let per_call: Vec<_> = calls
            .iter()
            .map(|(s, what)| json!({"call": what, "harl_s": s}))
            .collect();
        rows.push(json!({"threads": t, "harl_s": h, "ort_s": r, "harl_runs_s": harl, "ort_runs_s": ort, "paired_ratio": paired, "max_rel_err": err, "calls": per_call}));
    }
    print!("{table}");
    let report = json!({
        "model": name,
        "tasks": net.tasks.len(),
        "calls": net.calls.len(),
        "build_s": build_s,
        "schedules": match &schedules {
            Schedules::Cached => std::env::var("HARL_CACHE_DIR").map_or("default (no HARL_CACHE_DIR)".to_string(), |c| format!("tuning cache {c}")),
            Schedules::Tuned { .. } => format!(
                "tuned by the build: {} trials{}, task scheduler {}, strategy {}, seed {}",
                o.trials.unwrap_or(0),
                o.seconds.map_or(String::new(), |s| format!(" or {s} s")),
                o.scheduler, o.strategy, o.seed
            ),
        },
        "tuned": o.trials.map(|t| json!({"trials": t, "seconds": o.seconds, "scheduler": o.scheduler, "strategy": o.strategy, "seed": o.seed})),
        "rows": rows,
    });
    std::fs::write(
        o.out.join("e2e.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    std::fs::write(o.out.join("table.md"), table)?;
    Ok(())
}

fn floats_bytes(x: &[f32]) -> Vec<u8> {
    x.iter().flat_map(|v| v.to_le_bytes()).collect()
}

fn read_floats(path: &Path) -> Result<Vec<f32>, Error> {
    Ok(std::fs::read(path)?
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect())
}

fn max_rel_err(got: &[f32], want: &[f32]) -> Result<f64, Error> {
    if got.len() != want.len() {
        return Err(format!(
            "harl gave {} outputs, onnxruntime {}",
            got.len(),
            want.len()
        )
        .into());
    }
    let scale = want
        .iter()
        .fold(1e-12f64, |m, &v| m.max(f64::from(v).abs()));
    Ok(got
        .iter()
        .zip(want)
        .map(|(&g, &w)| (f64::from(g) - f64::from(w)).abs() / scale)
        .fold(0.0, f64::max))
}

/// The user's crate: `build.rs` registers the model; `main.rs` times `Model::run`.
fn write_crate(dir: &Path, model: &Path, package: &str) -> Result<(), Error> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()?;
    std::fs::create_dir_all(dir.join("src"))?;
    let manifest = format!(
        "[package]\nname = \"{package}\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dependencies]\nharl = {{ path = {ws:?} }}\nrayon = \"1\"\n\n\
         [build-dependencies]\nharl-build = {{ path = {hb:?}, features = [\"onnx\"] }}\n\n[workspace]\n",
        ws = ws.display().to_string(),
        hb = ws.join("harl-build").display().to_string(),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    if ws.join("Cargo.lock").exists() {
        std::fs::copy(ws.join("Cargo.lock"), dir.join("Cargo.lock"))?;
    }
    std::fs::write(
        dir.join("build.rs"),
        format!(
            // Weights in a file: a 100-340 MB model embedded adds half a minute to each build.
            "fn main() {{\n    harl_build::Builder::new().onnx_with(\"net\", {:?}, harl_build::ModelWeights::File).compile();\n}}\n",
            model.display().to_string()
        ),
    )?;
    std::fs::write(dir.join("src/main.rs"), MAIN_RS)?;
    Ok(())
}

const MAIN_RS: &str = r#"harl::include_kernels!();

fn main() {
    let mut args = std::env::args().skip(1);
    let (input, output, threads) = (args.next().expect("input"), args.next().expect("output"), args.next().and_then(|t| t.parse::<usize>().ok()).expect("threads"));
    let x: Vec<f32> = std::fs::read(&input).expect("input").chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect("pool");
    pool.install(|| {
        let mut model = net::Model::new().expect("weights");
        let mut y = vec![0f32; net::OUTPUT_SHAPE.iter().product()];
        model.run(&x, &mut y).expect("lengths");
        model.run(&x, &mut y).expect("lengths");
        let start = std::time::Instant::now();
        let mut t = Vec::new();
        while t.len() < 10 || start.elapsed().as_secs_f64() < 1.0 {
            let c = std::time::Instant::now();
            model.run(&x, &mut y).expect("lengths");
            t.push(c.elapsed().as_secs_f64());
        }
        t.sort_by(|a, b| a.total_cmp(b));
        // Each call's median over 10 timed runs.
        let runs: Vec<Vec<f64>> = (0..10).map(|_| model.run_timed(&x, &mut y).expect("lengths")).collect();
        for (i, call) in net::CALLS.iter().enumerate() {
            let mut c: Vec<f64> = runs.iter().map(|r| r[i]).collect();
            c.sort_by(|a, b| a.total_cmp(b));
            println!("CALL {:e} {call}", c[c.len() / 2]);
        }
        let bytes: Vec<u8> = y.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(&output, bytes).expect("output");
        println!("HARL {:e}", t[t.len() / 2]);
    });
}
"#;

fn target_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/e2e-bench")
}

/// Copies the tune's table (`tune-results.json`) and log (`tune.log`) from the build's
/// `OUT_DIR/harl` (the newest of the package's build directories) into `out`.
fn keep_tune_outputs(package: &str, out: &Path) -> Result<(), Error> {
    let builds = target_dir().join("release/build");
    let newest = std::fs::read_dir(&builds)?
        .filter_map(Result::ok)
        .filter(|e| {
            e.file_name()
                .to_str()
                .and_then(|n| n.strip_prefix(package))
                .is_some_and(|rest| rest.starts_with('-'))
        })
        .map(|e| e.path().join("out/harl"))
        .filter(|p| p.join("tune-results.json").exists())
        .max_by_key(|p| {
            std::fs::metadata(p.join("tune-results.json"))
                .and_then(|m| m.modified())
                .ok()
        })
        .ok_or("the tuning build left no tune-results.json")?;
    for file in ["tune-results.json", "tune.log"] {
        std::fs::copy(newest.join(file), out.join(file))?;
    }
    Ok(())
}

/// The tuner a tuning build calls: this workspace's `cargo-harl`, release-built here.
fn tuner() -> Result<PathBuf, Error> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let built = Command::new(cargo)
        .current_dir(&ws)
        .args(["build", "--release", "--quiet", "-p", "cargo-harl"])
        .status()?;
    if !built.success() {
        return Err("cargo-harl did not build".into());
    }
    Ok(ws.join("target/release/cargo-harl").canonicalize()?)
}

/// `cargo build --release` of the crate (tuning it first when asked); returns its binary.
fn build(
    krate: &Path,
    package: &str,
    o: &Options,
    schedules: &Schedules,
) -> Result<PathBuf, Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(krate)
        .args(["build", "--release", "--quiet"])
        .env("CARGO_TARGET_DIR", target_dir());
    // The budget comes from the options alone; `HARL_ISA` passes through, so that an AVX2
    // run (`HARL_ISA=avx2`) tunes, records and runs the AVX2 variant.
    for var in [
        "HARL_TUNE",
        "HARL_TRIALS",
        "HARL_TUNE_SECONDS",
        "HARL_TOTAL_TRIALS",
        "HARL_TOTAL_SECONDS",
    ] {
        cmd.env_remove(var);
    }
    if let Schedules::Tuned { tuner, cache } = schedules {
        cmd.env("HARL_TUNE", "on")
            .env("HARL_TUNER", tuner)
            .env("HARL_CACHE_DIR", cache)
            .env("HARL_TOTAL_TRIALS", o.trials.unwrap_or(0).to_string())
            .env("HARL_TASK_SCHEDULER", &o.scheduler)
            .env("HARL_STRATEGY", &o.strategy)
            .env("HARL_SEED", o.seed.to_string());
        if let Some(s) = o.seconds {
            cmd.env("HARL_TOTAL_SECONDS", s.to_string());
        }
    }
    if !cmd.status()?.success() {
        return Err("the downstream crate did not build".into());
    }
    Ok(target_dir().join("release").join(package))
}

fn last_figure(stdout: &[u8], tag: &str) -> Result<f64, Error> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix(tag))
        .next_back()
        .ok_or_else(|| format!("no `{tag}` line").into())
        .and_then(|v| v.trim().parse::<f64>().map_err(Into::into))
}

/// Each call's median seconds and what it computes, from the binary's `CALL` lines.
fn calls_of(stdout: &[u8]) -> Vec<(f64, String)> {
    String::from_utf8_lossy(stdout)
        .lines()
        .filter_map(|l| l.strip_prefix("CALL "))
        .filter_map(|l| {
            let (t, what) = l.split_once(' ')?;
            Some((t.parse().ok()?, what.to_string()))
        })
        .collect()
}

/// Runs `cmd` to its end; its output, or an error quoting its stderr if it failed.
fn output_of(cmd: &mut Command, what: &str) -> Result<std::process::Output, Error> {
    let run = cmd.output()?;
    if !run.status.success() {
        return Err(format!("{what} failed: {}", String::from_utf8_lossy(&run.stderr)).into());
    }
    Ok(run)
}

fn run_harl(
    exe: &Path,
    input: &Path,
    output: &Path,
    threads: usize,
) -> Result<(f64, Vec<(f64, String)>), Error> {
    let run = output_of(
        Command::new(exe)
            .arg(input)
            .arg(output)
            .arg(threads.to_string()),
        "harl's binary",
    )?;
    Ok((last_figure(&run.stdout, "HARL ")?, calls_of(&run.stdout)))
}

fn run_ort(model: &Path, input: &Path, output: &Path, threads: usize) -> Result<f64, Error> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ort_e2e.py");
    let run = output_of(
        Command::new("python3")
            .arg(script)
            .arg(model)
            .arg(input)
            .arg(output)
            .arg(threads.to_string())
            .arg("1.0"),
        "onnxruntime",
    )?;
    last_figure(&run.stdout, "ORT ")
}
