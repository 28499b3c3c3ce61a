//! `harl-bench e2e --model M.onnx [--threads 1,2] [--rounds 3] --out DIR`: a whole network,
//! built by harl as a user's crate builds it, against onnxruntime on the same ONNX file.
//!
//! The model is imported (its tasks counted), then a fresh downstream crate registers it with
//! `harl_build::Builder::onnx` and `cargo build --release` builds it (kernels from the tuning
//! cache, `HARL_CACHE_DIR` or none: default schedules). Its binary runs `Model::run` in a
//! rayon pool of the thread count: two warm-up runs, then runs until 1 s and 10 runs, median;
//! `scripts/ort_e2e.py` does the same with onnxruntime (`intra_op_num_threads`). The two
//! alternate over `--rounds`, on one input from `[-0.5, 0.5)`; harl's output is compared with
//! onnxruntime's. `DIR/e2e.json` has `harl_s`, `ort_s` (medians of the rounds' medians) and
//! `max_rel_err` (largest difference over the largest |output|) per thread count.

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
    /// Output directory (e2e.json, table.md); the downstream crate, the input and the
    /// outputs are kept in the workspace's `target/e2e-bench`.
    #[arg(long, default_value = "e2e-out")]
    pub out: PathBuf,
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
    let started = std::time::Instant::now();
    let exe = build(&krate, &package)?;
    let build_s = started.elapsed().as_secs_f64();
    println!("built in {build_s:.0} s");
    let mut rows = Vec::new();
    let mut table = String::from(
        "| threads | harl ms | onnxruntime ms | harl / onnxruntime | max rel. error |\n|---|---|---|---|---|\n",
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
        let err = max_rel_err(&read_floats(&harl_out)?, &read_floats(&ort_out)?)?;
        table.push_str(&format!(
            "| {t} | {:.2} | {:.2} | {:.2}x | {err:.1e} |\n",
            h * 1e3,
            r * 1e3,
            h / r
        ));
        let per_call: Vec<_> = calls
            .iter()
            .map(|(s, what)| json!({"call": what, "harl_s": s}))
            .collect();
        rows.push(json!({"threads": t, "harl_s": h, "ort_s": r, "harl_runs_s": harl, "ort_runs_s": ort, "max_rel_err": err, "calls": per_call}));
    }
    print!("{table}");
    let report = json!({
        "model": name,
        "tasks": net.tasks.len(),
        "calls": net.calls.len(),
        "build_s": build_s,
        "schedules": std::env::var("HARL_CACHE_DIR").map_or("default (no HARL_CACHE_DIR)".to_string(), |c| format!("tuning cache {c}")),
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
            "fn main() {{\n    harl_build::Builder::new().onnx(\"net\", {:?}).compile();\n}}\n",
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

/// `cargo build --release` of the crate; returns its binary.
fn build(krate: &Path, package: &str) -> Result<PathBuf, Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut cmd = Command::new(cargo);
    cmd.current_dir(krate)
        .args(["build", "--release", "--quiet"])
        .env("CARGO_TARGET_DIR", target_dir());
    for var in ["HARL_TUNE", "HARL_TRIALS", "HARL_ISA"] {
        cmd.env_remove(var);
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

fn run_harl(
    exe: &Path,
    input: &Path,
    output: &Path,
    threads: usize,
) -> Result<(f64, Vec<(f64, String)>), Error> {
    let run = Command::new(exe)
        .arg(input)
        .arg(output)
        .arg(threads.to_string())
        .output()?;
    if !run.status.success() {
        return Err(format!(
            "harl's binary failed: {}",
            String::from_utf8_lossy(&run.stderr)
        )
        .into());
    }
    Ok((last_figure(&run.stdout, "HARL ")?, calls_of(&run.stdout)))
}

fn run_ort(model: &Path, input: &Path, output: &Path, threads: usize) -> Result<f64, Error> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/ort_e2e.py");
    let run = Command::new("python3")
        .arg(script)
        .arg(model)
        .arg(input)
        .arg(output)
        .arg(threads.to_string())
        .arg("1.0")
        .output()?;
    if !run.status.success() {
        return Err(format!(
            "onnxruntime failed: {}",
            String::from_utf8_lossy(&run.stderr)
        )
        .into());
    }
    last_figure(&run.stdout, "ORT ")
}
