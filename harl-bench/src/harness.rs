//! What the commands share: tuning runs over the tuning stack, the measurer's settings, timing
//! schedules side by side, the gemm crate's figure, argument checks. Commands depend on this,
//! never on each other.

use crate::peers::Peer;
use crate::timing::measure;
use crate::workload::Matmul;
use crate::Error;
use harl_build::codegen::Variant;
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::schedule::Schedule;
use harl_build::target::TargetFingerprint;
use harl_te::Graph;
use harl_tune::cost_model::{model_by_name, COST_MODEL_NAMES, DEFAULT_COST_MODEL};
use harl_tune::measure::Candidate;
use harl_tune::measure::{host_variant, MeasureConfig, Measurer};
use harl_tune::space::cpu::Task;
use harl_tune::strategy::strategy_by_name;
use harl_tune::task_scheduler::scheduler_by_name;
use harl_tune::tuner::{tune, PhaseTimes, TuneOptions, TuneResult};
use serde_json::{json, Value};
use std::path::{Path, PathBuf};
use std::time::Duration;

/// A clap value parser for counts that must be positive.
pub fn positive(s: &str) -> Result<usize, String> {
    match s.parse::<usize>() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(format!("`{s}` is not a positive count")),
    }
}

/// The measurer's work directory: beside the workspace's target dir, reused across runs.
pub fn work_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/harl-measure")
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
    config.variant = Some(bench_variant());
    config
}

fn measurer(threads: usize, seed: u64) -> Result<Measurer, Error> {
    Ok(Measurer::new(measure_config(threads, seed))?)
}

/// Settings that time every candidate in full (no one-run cutoff, no relative timeout).
fn full_config(threads: usize, seed: u64) -> MeasureConfig {
    MeasureConfig {
        slow_cutoff: 0.0,
        relative_timeout: 0.0,
        ..measure_config(threads, seed)
    }
}

/// A measurer that times every candidate in full (no one-run cutoff, no relative timeout).
pub fn full_measurer(threads: usize, seed: u64) -> Result<Measurer, Error> {
    Ok(Measurer::new(full_config(threads, seed))?)
}

/// The ISA variant the bench tunes and measures: this machine's, or the lower one `HARL_ISA`
/// (`avx2`, `baseline`) names, as it lowers the runtime's (AVX2 figures on an AVX-512 machine).
pub fn bench_variant() -> Variant {
    let host = host_variant();
    let asked = match std::env::var("HARL_ISA").ok().as_deref() {
        Some("avx2") => Variant::Avx2,
        Some("baseline") => Variant::Base,
        _ => host,
    };
    let rank = |v: Variant| Variant::ALL.iter().position(|&x| x == v);
    if rank(asked) > rank(host) {
        asked
    } else {
        host
    }
}

/// The default schedule's plan for the bench's variant with `threads` threads.
pub fn host_target(threads: usize) -> CpuTarget {
    bench_variant().cpu_target(&TargetFingerprint::host().arch, threads)
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
    measure_rotating_flushed(graph, schedules, threads, rounds, 0)
}

/// [`measure_rotating`], writing `flush_bytes` of another buffer before each timed run
/// (`MeasureConfig::flush_bytes`: weights and inputs cold, as in a network).
pub fn measure_rotating_flushed(
    graph: &Graph,
    schedules: &[Schedule],
    threads: usize,
    rounds: usize,
    flush_bytes: usize,
) -> Result<Vec<Vec<f64>>, Error> {
    let n = schedules.len();
    let mut latencies = vec![Vec::new(); n];
    for round in 0..rounds.max(1) {
        let order: Vec<usize> = (0..n).map(|k| (k + round) % n).collect();
        let batch: Vec<Candidate> = order
            .iter()
            .map(|&k| Candidate::Schedule(schedules[k].clone()))
            .collect();
        let mut m = Measurer::new(MeasureConfig {
            flush_bytes,
            ..full_config(threads, round as u64)
        })?;
        for (pos, r) in m.measure(graph, &batch).into_iter().enumerate() {
            latencies[order[pos]].extend(r.latency_s);
        }
    }
    Ok(latencies)
}

/// Median latency of the untuned default schedule, measured like a trial.
pub fn measure_default(graph: &Graph, threads: usize, seed: u64) -> Result<Option<f64>, Error> {
    let schedule = default_schedule(graph, &host_target(threads));
    let mut m = measurer(threads, seed)?;
    let r = m.measure(graph, &[Candidate::Schedule(schedule)]);
    Ok(r.into_iter().next().and_then(|m| m.latency_s))
}

/// Tunes `tasks` with the named strategy and task scheduler on this machine's variant. A
/// strategy may name its cost model after an `@` (`ansor@xgb-transfer`); without one it uses
/// the default ([`DEFAULT_COST_MODEL`]).
pub fn run_tasks(tasks: Vec<Task>, spec: &RunSpec<'_>) -> Result<TuneResult, Error> {
    let (strategy, scheduler, seed) = (spec.strategy, spec.scheduler, spec.seed);
    let (strategy, model) = strategy
        .split_once('@')
        .unwrap_or((strategy, DEFAULT_COST_MODEL));
    let mut strategy = strategy_by_name(strategy, seed).ok_or_else(|| {
        format!(
            "unknown strategy `{strategy}` ({})",
            harl_tune::strategy::STRATEGY_NAMES
        )
    })?;
    let mut scheduler = scheduler_by_name(scheduler)
        .ok_or_else(|| format!("unknown task scheduler `{scheduler}`"))?;
    let isa_class = bench_variant().isa_class(&TargetFingerprint::host().arch);
    let mut model = model_by_name(model, seed, &isa_class)
        .ok_or_else(|| format!("unknown cost model `{model}` ({COST_MODEL_NAMES})"))??;
    let mut measurer = measurer(spec.threads, seed)?;
    let target = host_target(spec.threads);
    let options = TuneOptions {
        trials: spec.trials,
        batch: spec.batch,
        time_budget: None,
        reserve_rounds: 0,
        seed,
        seed_default: spec.seed_default,
    };
    Ok(tune(
        tasks,
        &target,
        &options,
        strategy.as_mut(),
        scheduler.as_mut(),
        model.as_mut(),
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

/// A run's seconds per phase, as JSON.
pub fn phases_json(p: &PhaseTimes) -> Value {
    json!({ "propose": p.propose_s, "measure": p.measure_s, "retrain": p.retrain_s })
}
