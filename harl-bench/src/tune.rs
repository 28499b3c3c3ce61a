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
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::schedule::Schedule;
use harl_build::target::TargetFingerprint;
use harl_te::Graph;
use harl_tune::cost_model::XgbModel;
use harl_tune::measure::Candidate;
use harl_tune::measure::{MeasureConfig, Measurer};
use harl_tune::space::cpu::Task;
use harl_tune::strategy::strategy_by_name;
use harl_tune::task_scheduler::scheduler_by_name;
use harl_tune::tuner::{best_candidate, tune, TuneOptions, TuneResult};
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
    /// Measure the default-like schedules first (off with `--no-default-seed`).
    pub seed_default: bool,
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
            seed_default: true,
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
            "--no-default-seed" => o.seed_default = false,
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

/// One tuning run's settings.
pub struct RunSpec<'a> {
    /// Strategy name.
    pub strategy: &'a str,
    /// Task scheduler name.
    pub scheduler: &'a str,
    /// Trial budget.
    pub trials: usize,
    /// Seed.
    pub seed: u64,
    /// Threads the kernels run on.
    pub threads: usize,
    /// Candidates per round.
    pub batch: usize,
    /// Measure the default-like schedules first.
    pub seed_default: bool,
}

/// The bench's measure settings: this workspace's worker dir, `threads`, `seed`, a 10 s timeout.
fn measure_config(threads: usize, seed: u64) -> MeasureConfig {
    let mut config =
        MeasureConfig::new(work_dir(), Path::new(env!("CARGO_MANIFEST_DIR")).join(".."));
    config.threads = threads;
    config.seed = seed;
    config.timeout = Duration::from_secs(10);
    config
}

fn measurer(threads: usize, seed: u64) -> Result<Measurer, Error> {
    Ok(Measurer::new(measure_config(threads, seed))?)
}

/// A measurer that times every candidate in full (no one-run cutoff, no relative timeout).
pub fn full_measurer(threads: usize, seed: u64) -> Result<Measurer, Error> {
    Ok(Measurer::new(MeasureConfig {
        slow_cutoff: 0.0,
        relative_timeout: 0.0,
        ..measure_config(threads, seed)
    })?)
}

/// The default schedule's plan for this machine's variant with `threads` threads.
pub fn host_target(threads: usize) -> CpuTarget {
    let host = TargetFingerprint::host();
    let variant = Variant::ALL
        .into_iter()
        .find(|v| v.isa_class(&host.arch) == host.isa_class)
        .unwrap_or(Variant::Base);
    variant.cpu_target(&host.arch, threads)
}

/// Latencies of `schedule` and of the default schedule, measured in one batch like trials
/// (`[tuned, default]`, each empty if that trial failed).
pub fn measure_schedules(
    graph: &Graph,
    schedule: &Schedule,
    threads: usize,
    seed: u64,
) -> Result<[Vec<f64>; 2], Error> {
    let default = default_schedule(graph, &host_target(threads));
    // Time both in full: the one-run cutoff for slow candidates is for searching, not for
    // the figures quoted.
    let mut m = full_measurer(threads, seed)?;
    let r = m.measure(
        graph,
        &[
            Candidate::Schedule(schedule.clone()),
            Candidate::Schedule(default),
        ],
    );
    let lat = |i: usize| r.get(i).and_then(|m| m.latency_s).into_iter().collect();
    Ok([lat(0), lat(1)])
}

/// Every latency of each schedule over `rounds` batches (at least one), each batch measured in
/// full by a fresh measurer and rotated so that every schedule is timed at every position.
pub fn measure_rotating(
    graph: &Graph,
    schedules: &[Schedule],
    threads: usize,
    rounds: usize,
) -> Result<Vec<Vec<f64>>, Error> {
    let n = schedules.len();
    let mut latencies = vec![Vec::new(); n];
    for round in 0..rounds.max(1) {
        let order: Vec<usize> = (0..n).map(|k| (k + round) % n).collect();
        let batch: Vec<Candidate> = order
            .iter()
            .map(|&k| Candidate::Schedule(schedules[k].clone()))
            .collect();
        let mut m = full_measurer(threads, round as u64)?;
        for (pos, r) in m.measure(graph, &batch).into_iter().enumerate() {
            latencies[order[pos]].extend(r.latency_s);
        }
    }
    Ok(latencies)
}

/// Median latency of the untuned default schedule, measured like a trial.
fn measure_default(graph: &Graph, threads: usize, seed: u64) -> Result<Option<f64>, Error> {
    let schedule = default_schedule(graph, &host_target(threads));
    let mut m = measurer(threads, seed)?;
    let r = m.measure(graph, &[Candidate::Schedule(schedule)]);
    Ok(r.into_iter().next().and_then(|m| m.latency_s))
}

/// Tunes `tasks` with the named strategy and task scheduler on this machine's variant.
pub fn run_tasks(tasks: Vec<Task>, spec: &RunSpec<'_>) -> Result<TuneResult, Error> {
    let (strategy, scheduler, seed) = (spec.strategy, spec.scheduler, spec.seed);
    let mut strategy = strategy_by_name(strategy, seed).ok_or_else(|| {
        format!(
            "unknown strategy `{strategy}` ({})",
            harl_tune::strategy::STRATEGY_NAMES
        )
    })?;
    let mut scheduler = scheduler_by_name(scheduler)
        .ok_or_else(|| format!("unknown task scheduler `{scheduler}`"))?;
    let mut model = XgbModel::with_seed(seed);
    let mut measurer = measurer(spec.threads, seed)?;
    let target = host_target(spec.threads);
    let options = TuneOptions {
        trials: spec.trials,
        batch: spec.batch,
        time_budget: None,
        seed,
        seed_default: spec.seed_default,
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

/// The `gemm` crate's GFLOP/s on this GEMM with `threads` threads (median of the timing loop).
pub fn gemm_gflops(mm: Matmul, threads: usize) -> Result<f64, Error> {
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
        "phases_s": crate::compare::phases_json(&r.phases),
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
