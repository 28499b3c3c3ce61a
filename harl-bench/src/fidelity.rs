//! `harl-bench fidelity`: does the latency the tuner records for a schedule match what a user's
//! binary then measures for it?
//!
//! For each kernel (the `models` benchmark's names) and thread count, the schedule a build would
//! ship without tuning (the default for that thread count) is timed by harl's measurer, exactly
//! as a trial is, and written as a tuning-cache record with that latency. A fresh downstream
//! crate then builds the kernel from that cache with `harl_build::Builder` and `cargo build
//! --release` (a user's build: generated code, the user's release profile) and times it in its
//! own binary: a rayon pool of the same threads, inputs from the same kind of distribution,
//! weights prepared once (`prepare`) as the measurer does, two warm-up calls, then calls until
//! 0.5 s and 10 calls, median. The two are taken in alternation over `--rounds`; the table
//! gives the medians and their ratio (binary / recorded). Not a test: the machines are shared
//! and noisy, so this is a figure to read, not to assert.

use crate::harness::{host_target, measure_schedules};
use crate::stats::median;
use crate::Error;
use harl_build::cache::{Record, TuningCache};
use harl_build::default_schedule::default_schedule;
use harl_build::target::TargetFingerprint;
use harl_te::Graph;
use serde_json::json;
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

/// Options of `fidelity`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Kernels of `harl-bench models`.
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "bert_ffn_up_gelu,bert_softmax,resnet_s1_3x3_64,resnet_s4_1x1_2048_residual,mbv2_dw_56_s1,gemv_4096x4096"
    )]
    pub only: Vec<String>,
    /// Thread counts.
    #[arg(long, value_delimiter = ',', default_value = "1,2")]
    pub threads: Vec<usize>,
    /// Alternations of measurer and binary (medians).
    #[arg(long, default_value_t = 3, value_parser = crate::harness::positive)]
    pub rounds: usize,
    /// Output directory (the downstream crate, its caches, fidelity.json); the crate builds in
    /// the workspace's `target/fidelity`.
    #[arg(long, default_value = "fidelity-out")]
    pub out: PathBuf,
}

/// Runs the comparison and prints the table.
pub fn run(o: &Options) -> Result<(), Error> {
    let kernels: Vec<(String, Graph)> = o
        .only
        .iter()
        .map(|name| {
            let g = crate::models::kernel_graph(name)
                .ok_or_else(|| format!("no kernel `{name}` in `harl-bench models`"))??;
            Ok((name.clone(), g))
        })
        .collect::<Result<_, Error>>()?;
    std::fs::create_dir_all(&o.out)?;
    // Absolute: cargo runs in the crate's directory.
    let out = o.out.canonicalize()?;
    let krate = out.join("crate");
    write_crate(&krate, &kernels)?;
    let mut rows = Vec::new();
    let mut table = String::from(
        "| kernel | threads | recorded (measurer) ms | binary ms | binary / recorded |\n|---|---|---|---|---|\n",
    );
    for &t in &o.threads {
        // The schedules of this thread count, recorded in a cache of their own.
        let cache_dir = out.join(format!("cache-{t}"));
        let _ = std::fs::remove_dir_all(&cache_dir);
        let cache = TuningCache::new(&cache_dir);
        let schedules: Vec<_> = kernels
            .iter()
            .map(|(_, g)| default_schedule(g, &host_target(t)))
            .collect();
        let mut recorded = vec![Vec::new(); kernels.len()];
        let mut binary = vec![Vec::new(); kernels.len()];
        for round in 0..o.rounds {
            for (k, ((name, g), sched)) in kernels.iter().zip(&schedules).enumerate() {
                let [lat, _] = measure_schedules(g, sched, t, round as u64)?;
                let lat = lat
                    .first()
                    .copied()
                    .ok_or_else(|| format!("{name}: the measurer could not time it"))?;
                recorded[k].push(lat);
                if round == 0 {
                    let record = Record::new(
                        g.workload_key(),
                        name,
                        TargetFingerprint::host(),
                        sched.clone(),
                        lat,
                        1,
                    );
                    cache.append(&record)?;
                }
            }
            let times = build_and_time(&krate, &cache_dir, t)?;
            for (k, (name, _)) in kernels.iter().enumerate() {
                let s = times
                    .get(name)
                    .ok_or_else(|| format!("{name}: the binary printed no time"))?;
                binary[k].push(*s);
            }
            eprintln!(
                "fidelity: {t} thread(s), round {} of {}",
                round + 1,
                o.rounds
            );
        }
        for (k, (name, _)) in kernels.iter().enumerate() {
            let (Some(r), Some(b)) = (median(&recorded[k]), median(&binary[k])) else {
                continue;
            };
            let _ = writeln!(
                table,
                "| {name} | {t} | {:.3} | {:.3} | {:.2} |",
                r * 1e3,
                b * 1e3,
                b / r
            );
            rows.push(json!({
                "kernel": name, "threads": t,
                "recorded_s": recorded[k], "binary_s": binary[k],
                "ratio": b / r,
            }));
        }
    }
    println!(
        "\nharl-bench fidelity ({})\n{table}",
        TargetFingerprint::host().cpu_model
    );
    std::fs::write(
        out.join("fidelity.json"),
        serde_json::to_string_pretty(&json!({ "rows": rows }))?,
    )?;
    Ok(())
}

/// A user's crate: `build.rs` registers the kernels (their graphs from `graphs.json`) with
/// `harl_build::Builder`; `main.rs` times each kernel as a user would call it.
fn write_crate(dir: &Path, kernels: &[(String, Graph)]) -> Result<(), Error> {
    let ws = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()?;
    std::fs::create_dir_all(dir.join("src"))?;
    let manifest = format!(
        "[package]\nname = \"harl-fidelity\"\nversion = \"0.0.0\"\nedition = \"2021\"\npublish = false\n\n\
         [dependencies]\nharl = {{ path = {ws:?} }}\nrayon = \"1\"\n\n\
         [build-dependencies]\nharl-build = {{ path = {hb:?} }}\nserde_json = \"1\"\n\n[workspace]\n",
        ws = ws.display().to_string(),
        hb = ws.join("harl-build").display().to_string(),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest)?;
    if ws.join("Cargo.lock").exists() {
        std::fs::copy(ws.join("Cargo.lock"), dir.join("Cargo.lock"))?;
    }
    let graphs: Vec<_> = kernels.iter().map(|(n, g)| json!([n, g])).collect();
    std::fs::write(dir.join("graphs.json"), serde_json::to_string(&graphs)?)?;
    std::fs::write(
        dir.join("build.rs"),
        "fn main() {\n    println!(\"cargo:rerun-if-changed=graphs.json\");\n    let text = std::fs::read_to_string(\"graphs.json\").expect(\"graphs.json\");\n    let graphs: Vec<(String, harl_build::te::Graph)> = serde_json::from_str(&text).expect(\"graphs\");\n    let mut b = harl_build::Builder::new();\n    for (name, graph) in graphs {\n        b = b.kernel(&name, graph);\n    }\n    b.compile();\n}\n",
    )?;
    std::fs::write(dir.join("src/main.rs"), main_rs(kernels))?;
    Ok(())
}

/// The binary: for each kernel, inputs in `[-1, 1)`, weights prepared once, two warm-up calls,
/// then calls until 0.5 s and 10 calls; prints `TIME name median_s source`.
fn main_rs(kernels: &[(String, Graph)]) -> String {
    let mut s = String::from(
        "#![allow(clippy::all)]\nharl::include_kernels!();\n\n\
         fn data(n: usize, seed: u64) -> Vec<f32> {\n    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;\n    (0..n).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; ((x >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0 }).collect()\n}\n\n\
         fn time(mut call: impl FnMut()) -> f64 {\n    call();\n    call();\n    let start = std::time::Instant::now();\n    let mut t = Vec::new();\n    while t.len() < 10 || start.elapsed().as_secs_f64() < 0.5 {\n        let c = std::time::Instant::now();\n        call();\n        t.push(c.elapsed().as_secs_f64());\n    }\n    t.sort_by(|a, b| a.total_cmp(b));\n    t[t.len() / 2]\n}\n\n\
         fn main() {\n    let threads: usize = std::env::args().nth(1).and_then(|a| a.parse().ok()).expect(\"threads\");\n    let pool = rayon::ThreadPoolBuilder::new().num_threads(threads).build().expect(\"pool\");\n    pool.install(|| {\n",
    );
    for (k, (name, g)) in kernels.iter().enumerate() {
        let out: usize = g.stages.last().map_or(0, |st| st.size());
        let _ = writeln!(s, "        {{");
        for (i, p) in g.inputs.iter().enumerate() {
            let n: usize = p.shape.iter().product();
            let _ = writeln!(s, "            let x{i} = data({n}, {});", k * 16 + i + 1);
        }
        let _ = writeln!(s, "            let mut out = vec![0f32; {out}];");
        let pick = |weights: bool| -> Vec<String> {
            (0..g.inputs.len())
                .filter(|&i| g.inputs[i].constant == weights)
                .map(|i| format!("&x{i}"))
                .collect()
        };
        let call = if g.inputs.iter().any(|p| p.constant) {
            let _ = writeln!(
                s,
                "            let p = {name}::prepare({}).expect(\"lengths\");",
                pick(true).join(", ")
            );
            let mut args = pick(false);
            args.push("&mut out".into());
            format!("p.run({}).expect(\"lengths\")", args.join(", "))
        } else {
            let mut args = pick(false);
            args.push("&mut out".into());
            format!("{name}::run({}).expect(\"lengths\")", args.join(", "))
        };
        let _ = writeln!(
            s,
            "            let t = time(|| {{ {call}; }});\n            println!(\"TIME {name} {{t:e}} {{}}\", {name}::schedule_source());\n        }}"
        );
    }
    s.push_str("    });\n}\n");
    s
}

/// Builds the crate against `cache` (release) and runs it on `threads`: each kernel's median.
fn build_and_time(
    krate: &Path,
    cache: &Path,
    threads: usize,
) -> Result<std::collections::HashMap<String, f64>, Error> {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    // The workspace's target directory: harl compiles once, and nothing large lands in `out`.
    let target = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/fidelity");
    let mut build = Command::new(&cargo);
    build
        .current_dir(krate)
        .args(["build", "--release", "--quiet"])
        .env("CARGO_TARGET_DIR", &target)
        .env("HARL_CACHE_DIR", cache);
    for var in ["HARL_TUNE", "HARL_TRIALS", "HARL_ISA"] {
        build.env_remove(var);
    }
    let status = build.status()?;
    if !status.success() {
        return Err("the downstream crate did not build".into());
    }
    let exe = target.join("release").join("harl-fidelity");
    let run = Command::new(exe).arg(threads.to_string()).output()?;
    if !run.status.success() {
        return Err(format!(
            "the downstream binary failed: {}",
            String::from_utf8_lossy(&run.stderr)
        )
        .into());
    }
    let mut times = std::collections::HashMap::new();
    for line in String::from_utf8_lossy(&run.stdout).lines() {
        let mut f = line.split_whitespace();
        if let (Some("TIME"), Some(name), Some(t)) = (f.next(), f.next(), f.next()) {
            let source: String = f.collect::<Vec<_>>().join(" ");
            if !source.starts_with("tuning cache") {
                return Err(
                    format!("{name}: built from `{source}`, not the recorded schedule").into(),
                );
            }
            times.insert(name.to_string(), t.parse()?);
        }
    }
    Ok(times)
}
