//! `harl-bench tune`: tunes one workload with one strategy and writes `summary.json` and
//! `curve.csv` (the contract other tools read).
//!
//! ```text
//! harl-bench tune --workload W --strategy S --trials N --seed K --threads T --out DIR
//! ```

use crate::harness::{gemm_gflops, measure_default, run_tasks, RunSpec};
use crate::suite;
use crate::workload::Matmul;
use crate::Error;
use harl_tune::space::cpu::Task;
use harl_tune::tuner::{best_candidate, TuneResult};
use serde_json::json;
use std::path::PathBuf;

/// Options of `tune`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Suite name or spec (see `list`).
    #[arg(long)]
    pub workload: String,
    /// Strategy name: harl, ansor, autotvm, random, harl-elite<P>, harl-adaptive.
    #[arg(long, default_value = "ansor")]
    pub strategy: String,
    /// Trial budget.
    #[arg(long, default_value_t = 200, value_parser = crate::harness::positive)]
    pub trials: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Threads the kernels run on while measured.
    #[arg(long, default_value_t = 1, value_parser = crate::harness::positive)]
    pub threads: usize,
    /// Output directory.
    #[arg(long, default_value = "tune-out")]
    pub out: PathBuf,
    /// Candidates per round.
    #[arg(long, default_value_t = 16, value_parser = crate::harness::positive)]
    pub batch: usize,
    /// The spec the workload resolved to (filled in by `run`).
    #[arg(skip)]
    pub workload_spec: String,
    /// Measure the default-like schedules first (off with `--no-default-seed`).
    #[arg(long = "no-default-seed", action = clap::ArgAction::SetFalse)]
    pub seed_default: bool,
}

/// Runs one tuning job and writes its summary and curve.
pub fn run(o: &Options) -> Result<(), Error> {
    let workload = suite::resolve(&o.workload)?;
    let graph = suite::build(&workload.spec)?;
    let flops = graph.flops();
    let task = Task::new(workload.name.clone(), graph.clone(), 1.0);
    let result = run_tasks(
        vec![task],
        &RunSpec {
            strategy: &o.strategy,
            scheduler: "gradient",
            trials: o.trials,
            seed: o.seed,
            threads: o.threads,
            batch: o.batch,
            seed_default: o.seed_default,
        },
    )?;
    let default_latency = measure_default(&graph, o.threads, o.seed)?;
    let (peer, peer_gflops) = match suite::gemm_shape(&workload.spec) {
        Some((m, k, n)) => ("gemm", Some(gemm_gflops(Matmul { m, k, n }, o.threads)?)),
        None => ("none", None),
    };
    let o = Options {
        workload_spec: workload.spec.clone(),
        ..o.clone()
    };
    let baseline = Baseline {
        peer,
        peer_gflops,
        default_latency,
    };
    write(&o, &workload.name, flops, &result, &baseline)
}

/// What the tuned kernel is compared with.
struct Baseline {
    peer: &'static str,
    peer_gflops: Option<f64>,
    default_latency: Option<f64>,
}

fn write(o: &Options, name: &str, flops: f64, r: &TuneResult, b: &Baseline) -> Result<(), Error> {
    let (peer, peer_gflops) = (b.peer, b.peer_gflops);
    std::fs::create_dir_all(&o.out)?;
    let best = r.tasks.first().and_then(best_candidate);
    let best_latency = best.map(|(_, l)| l);
    // Whether the winner is one of the default-like seeds (the search found nothing better).
    let best_is_seed = match (r.tasks.first(), best) {
        (Some(t), Some((c, _))) => t.seeds.contains(&c.params),
        _ => false,
    };
    let failed = r.tasks.first().map_or(0, |t| {
        t.trials.iter().filter(|t| t.latency_s.is_none()).count()
    });
    let summary = json!({
        "workload": name,
        "strategy": o.strategy,
        "trials": r.trials,
        "seed": o.seed,
        "threads": o.threads,
        "best_latency_s": best_latency,
        "gflops": best_latency.map(|l| flops / l / 1e9),
        "tune_wall_s": r.wall_s,
        "trials_per_s": r.trials as f64 / r.wall_s.max(1e-9),
        "phases_s": crate::harness::phases_json(&r.phases),
        "peer": peer,
        "peer_gflops": peer_gflops,
        "failed_trials": failed,
        "default_latency_s": b.default_latency,
        "default_gflops": b.default_latency.map(|l| flops / l / 1e9),
        "best_is_default_seed": best_is_seed,
        "seed_default": o.seed_default,
        "best_schedule": best.map(|(c, _)| serde_json::to_value(&c.schedule).unwrap_or_default()),
    });
    std::fs::write(
        o.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    // Every trial, for offline cost-model experiments (the schedule, not its features, so the
    // records outlive changes to the feature set).
    let records: Vec<serde_json::Value> = r
        .tasks
        .iter()
        .flat_map(|t| t.trials.iter())
        .map(|t| json!({ "workload": o.workload_spec, "schedule": t.candidate.schedule, "latency_s": t.latency_s }))
        .collect();
    std::fs::write(
        o.out.join("records.json"),
        serde_json::to_string(&records)? + "\n",
    )?;
    let mut csv = String::from("trial,best_latency_s,elapsed_s\n");
    for p in &r.curve {
        csv.push_str(&format!(
            "{},{:e},{:.3}\n",
            p.trial, p.best_latency_s, p.elapsed_s
        ));
    }
    std::fs::write(o.out.join("curve.csv"), csv)?;
    println!(
        "{name} [{}] {} trials ({} failed) in {:.1} s: best {} ({}{}), default {}, peer {peer} {}",
        o.strategy,
        r.trials,
        failed,
        r.wall_s,
        best_latency.map_or("none".into(), |l| format!("{:.4} ms", l * 1e3)),
        best_latency.map_or("-".into(), |l| format!("{:.1} GFLOP/s", flops / l / 1e9)),
        if best_is_seed { ", a default seed" } else { "" },
        b.default_latency
            .map_or("-".into(), |l| format!("{:.1} GFLOP/s", flops / l / 1e9)),
        peer_gflops.map_or("-".into(), |g| format!("{g:.1} GFLOP/s")),
    );
    Ok(())
}
