//! `harl-bench tune`: tunes one workload with one strategy and writes `summary.json` and
//! `curve.csv` (the contract other tools read).
//!
//! ```text
//! harl-bench tune --workload W --strategy S --trials N --seed K --threads T --out DIR
//! ```

use crate::peers::Peer;
use crate::suite;
use crate::timing::measure;
use crate::workload::Matmul;
use crate::Error;
use harl_build::codegen::Variant;
use harl_build::target::TargetFingerprint;
use harl_build::tune::cost_model::XgbModel;
use harl_build::tune::measure::{MeasureConfig, Measurer};
use harl_build::tune::search::strategy_by_name;
use harl_build::tune::sketch::Task;
use harl_build::tune::task_scheduler::scheduler_by_name;
use harl_build::tune::tuner::{best_candidate, tune, TuneOptions, TuneResult};
use serde_json::json;
use std::path::{Path, PathBuf};
use std::time::Duration;

/// Options of `tune`.
#[derive(Debug, Clone)]
pub struct Options {
    /// Suite name or spec.
    pub workload: String,
    /// Strategy name.
    pub strategy: String,
    /// Trial budget.
    pub trials: usize,
    /// Seed.
    pub seed: u64,
    /// Threads the kernels run on while measured.
    pub threads: usize,
    /// Output directory.
    pub out: PathBuf,
    /// Candidates per round.
    pub batch: usize,
    /// The spec the workload resolved to (filled in by `run`).
    pub workload_spec: String,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            workload: String::new(),
            strategy: "ansor".into(),
            trials: 200,
            seed: 0,
            threads: 1,
            out: PathBuf::from("tune-out"),
            batch: 16,
            workload_spec: String::new(),
        }
    }
}

/// Parses `--key value` options of `tune`.
pub fn parse(args: &[String]) -> Result<Options, Error> {
    let mut o = Options::default();
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        match flag.as_str() {
            "--workload" => o.workload = value()?.clone(),
            "--strategy" => o.strategy = value()?.clone(),
            "--trials" => o.trials = value()?.parse()?,
            "--seed" => o.seed = value()?.parse()?,
            "--threads" => o.threads = value()?.parse()?,
            "--out" => o.out = value()?.into(),
            "--batch" => o.batch = value()?.parse()?,
            other => return Err(format!("tune: unknown argument `{other}`").into()),
        }
    }
    if o.workload.is_empty() {
        return Err("tune needs --workload (a suite name from `list`, or a spec)".into());
    }
    if o.trials == 0 || o.threads == 0 || o.batch == 0 {
        return Err("--trials, --threads and --batch must be positive".into());
    }
    Ok(o)
}

/// The measurer's work directory: beside the workspace's target dir, reused across runs.
fn work_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/harl-measure")
}

/// Runs one tuning job and writes its summary and curve.
pub fn run(o: &Options) -> Result<(), Error> {
    let workload = suite::resolve(&o.workload)?;
    let graph = suite::build(&workload.spec)?;
    let flops = graph.flops();
    let task = Task::new(workload.name.clone(), graph, 1.0);
    let result = run_tasks(
        vec![task],
        &o.strategy,
        "gradient",
        o.trials,
        o.seed,
        o.threads,
        o.batch,
    )?;
    let (peer, peer_gflops) = match suite::gemm_shape(&workload.spec) {
        Some((m, k, n)) => ("gemm", Some(gemm_gflops(Matmul { m, k, n }, o.threads)?)),
        None => ("none", None),
    };
    let o = Options {
        workload_spec: workload.spec.clone(),
        ..o.clone()
    };
    write(&o, &workload.name, flops, &result, peer, peer_gflops)
}

/// Tunes `tasks` with the named strategy and task scheduler on this machine's variant.
pub fn run_tasks(
    tasks: Vec<Task>,
    strategy: &str,
    scheduler: &str,
    trials: usize,
    seed: u64,
    threads: usize,
    batch: usize,
) -> Result<TuneResult, Error> {
    let mut strategy = strategy_by_name(strategy, seed)
        .ok_or_else(|| format!("unknown strategy `{strategy}` (harl, ansor, autotvm, random)"))?;
    let mut scheduler = scheduler_by_name(scheduler)
        .ok_or_else(|| format!("unknown task scheduler `{scheduler}`"))?;
    let mut model = XgbModel::with_seed(seed);
    let mut config =
        MeasureConfig::new(work_dir(), Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    config.threads = threads;
    config.seed = seed;
    config.timeout = Duration::from_secs(10);
    let mut measurer = Measurer::new(config)?;
    let host = TargetFingerprint::host();
    let variant = Variant::ALL
        .into_iter()
        .find(|v| v.isa_class(&host.arch) == host.isa_class)
        .unwrap_or(Variant::Base);
    let target = variant.cpu_target(&host.arch, threads);
    let options = TuneOptions {
        trials,
        batch,
        time_budget: None,
        seed,
    };
    Ok(tune(
        tasks,
        &target,
        &options,
        strategy.as_mut(),
        scheduler.as_mut(),
        &mut model,
        &mut measurer,
    ))
}

fn gemm_gflops(mm: Matmul, threads: usize) -> Result<f64, Error> {
    let lhs: Vec<f32> = (0..mm.m * mm.k)
        .map(|i| (i % 17) as f32 / 17.0 - 0.5)
        .collect();
    let rhs: Vec<f32> = (0..mm.k * mm.n)
        .map(|i| (i % 13) as f32 / 13.0 - 0.5)
        .collect();
    let mut dst = vec![0.0f32; mm.m * mm.n];
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let t = pool.install(|| {
        measure(|| {
            Peer::Gemm.matmul(mm, &lhs, &rhs, &mut dst, threads);
            Ok::<(), Error>(())
        })
    })?;
    Ok(t.gflops(2.0 * (mm.m * mm.k * mm.n) as f64))
}

fn write(
    o: &Options,
    name: &str,
    flops: f64,
    r: &TuneResult,
    peer: &str,
    peer_gflops: Option<f64>,
) -> Result<(), Error> {
    std::fs::create_dir_all(&o.out)?;
    let best = r.tasks.first().and_then(best_candidate);
    let best_latency = best.map(|(_, l)| l);
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
        "peer": peer,
        "peer_gflops": peer_gflops,
        "failed_trials": failed,
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
        "{name} [{}] {} trials ({} failed) in {:.1} s: best {} ({}), peer {peer} {}",
        o.strategy,
        r.trials,
        failed,
        r.wall_s,
        best_latency.map_or("none".into(), |l| format!("{:.4} ms", l * 1e3)),
        best_latency.map_or("-".into(), |l| format!("{:.1} GFLOP/s", flops / l / 1e9)),
        peer_gflops.map_or("-".into(), |g| format!("{g:.1} GFLOP/s")),
    );
    Ok(())
}
