//! A tuning job: the kernels of a build's [`Manifest`] without a record for this CPU, tuned
//! together under one budget. HARL's task bandit (or the scheduler named in
//! [`JobOptions::scheduler`]) picks which kernel gets each round, weighing each by how often
//! the crate runs it (an imported network's calls of a task), so the budget goes where the
//! end-to-end time is. Afterwards each kernel's fastest schedules are timed again beside its
//! default and the winner is recorded in the crate's tuning cache.
//!
//! Every trial also goes to a trial log (one file per kernel, strategy, seed and thread count).
//! A job started again with the same settings replays the logged measurements instead of timing
//! those schedules again: the search is deterministic under its seed, so it walks the same path
//! up to where the interrupted run stopped and goes on from there (the records of an
//! interrupted job are written only at its end, so the logs are what it keeps). `cargo harl
//! report` reads the same logs.

use crate::cost_model::{model_by_name, CostModel, COST_MODEL_NAMES, DEFAULT_COST_MODEL};
use crate::measure::Measure;
use crate::measure::{MeasureConfig, Measurer};
use crate::space::cpu::Task;
use crate::space::CpuSpace;
use crate::strategy::{strategy_by_name, STRATEGY_NAMES};
use crate::task_scheduler::{scheduler_by_name, RoundRobin, DEFAULT_SCHEDULER, SCHEDULER_NAMES};
use crate::tuner::{finalists, retime_finalists, tune, TuneOptions};
use harl_build::cache::{LookupSource, Record, TuningCache};
use harl_build::codegen::Variant;
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::lower::lower;
use harl_build::manifest::{Manifest, ManifestKernel, TuneOutcome};
use harl_build::schedule::Schedule;
use harl_te::Graph;
use serde::{Deserialize, Serialize};
use std::collections::{HashMap, VecDeque};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// The knobs of a job.
#[derive(Clone, Debug)]
pub struct JobOptions {
    /// Measured trials per kernel, on average: a job of N kernels shares N times this, unless
    /// [`JobOptions::total_trials`] says otherwise.
    pub trials: usize,
    /// Wall-time budget per kernel, on average (N times this for the job), unless
    /// [`JobOptions::total_seconds`] says otherwise.
    pub seconds: Option<u64>,
    /// The whole job's trial budget, shared by its kernels.
    pub total_trials: Option<usize>,
    /// The whole job's wall-time budget, shared by its kernels.
    pub total_seconds: Option<u64>,
    /// Which kernel gets the next round ([`SCHEDULER_NAMES`]).
    pub scheduler: String,
    /// Seed of every search decision.
    pub seed: u64,
    /// Search strategy ([`STRATEGY_NAMES`]).
    pub strategy: String,
    /// Cost model ([`COST_MODEL_NAMES`]).
    pub cost_model: String,
    /// Threads the kernels run with while measured (default: the manifest's).
    pub threads: Option<usize>,
    /// Tune only share `I` of `N` (`(I, N)`, `I < N`) of the kernels needing it.
    pub shard: Option<(usize, usize)>,
    /// Tune kernels that already have a record for this CPU too.
    pub force: bool,
    /// Where trial logs go (default: `<gen_dir>/tune-log`).
    pub log_dir: Option<PathBuf>,
    /// Trials per GPU kernel, for builds that generate GPU code (on a host with a GPU).
    pub gpu_trials: usize,
    /// Time every candidate with its weights and inputs evicted from the caches
    /// ([`COLD_FLUSH_BYTES`] written before each timed run) instead of warm.
    pub cold: bool,
}

/// Bytes the measurer writes before each timed run of a [`JobOptions::cold`] job: twice a
/// large L3's share, so weights and inputs come from memory, as a network's tasks meet them
/// at two threads.
pub const COLD_FLUSH_BYTES: usize = 64 << 20;

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            trials: 64,
            seconds: None,
            total_trials: None,
            total_seconds: None,
            scheduler: DEFAULT_SCHEDULER.into(),
            seed: 0,
            strategy: "ansor".into(),
            cost_model: DEFAULT_COST_MODEL.into(),
            threads: None,
            shard: None,
            force: false,
            log_dir: None,
            gpu_trials: 64,
            cold: false,
        }
    }
}

impl JobOptions {
    /// The trial budget of a job of `kernels` kernels.
    pub fn job_trials(&self, kernels: usize) -> usize {
        self.total_trials
            .unwrap_or_else(|| self.trials.saturating_mul(kernels))
    }

    /// The wall-time budget of a job of `kernels` kernels, if any.
    pub fn job_seconds(&self, kernels: usize) -> Option<u64> {
        self.total_seconds
            .or_else(|| self.seconds.map(|s| s.saturating_mul(kernels as u64)))
    }
}

/// Why a job cannot start.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// An unknown strategy name.
    #[error("`{0}` is not a strategy ({STRATEGY_NAMES})")]
    Strategy(String),
    /// An unknown task scheduler name.
    #[error("`{0}` is not a task scheduler ({SCHEDULER_NAMES})")]
    Scheduler(String),
    /// An unknown cost model, or one that cannot be made (its dataset is unusable).
    #[error("cost model `{0}`: {1}")]
    CostModel(String, String),
    /// A shard that is not `I/N` with `I < N`.
    #[error("shard {0}/{1}: need 0 <= I < N")]
    Shard(usize, usize),
    /// The crate does not depend on `harl` directly, so workers cannot link its runtime.
    #[error("the crate `{0}` does not depend on `harl` directly (DEP_HARL_ROOT was unset in its build), so its kernels cannot be measured")]
    NoHarl(String),
}

/// What a job reports as it goes (a terminal's progress bars, a build script's log).
pub trait Progress {
    /// The job's search starts: what it tunes (a kernel's name, or how many kernels) and its
    /// trial budget.
    fn start(&mut self, label: &str, budget: usize);
    /// After each measured batch: the job's trials so far, the kernel just measured and its
    /// best GFLOP/s so far.
    fn advance(&mut self, trials: usize, kernel: &str, best_gflops: Option<f64>);
    /// A kernel is done (after the search, one call per kernel).
    fn finish(&mut self, outcome: &TuneOutcome);
}

/// The kernels a job tunes, in a fixed order: one per workload (kernels sharing a workload share
/// its record), without an exact record for this CPU unless `force`, and of those the shard's
/// share (every N-th of the workloads sorted by key, from the I-th), so shards of one job
/// partition its work whatever machine runs them.
pub fn select<'a>(
    manifest: &'a Manifest,
    options: &JobOptions,
) -> Result<Vec<&'a ManifestKernel>, JobError> {
    let mut by_key: Vec<&ManifestKernel> = Vec::new();
    for k in &manifest.kernels {
        if by_key.iter().all(|o| o.workload_key != k.workload_key) {
            by_key.push(k);
        }
    }
    by_key.sort_by(|a, b| a.workload_key.cmp(&b.workload_key));
    if let Some((i, n)) = options.shard {
        if i >= n {
            return Err(JobError::Shard(i, n));
        }
        by_key = by_key
            .into_iter()
            .enumerate()
            .filter(|(j, _)| j % n == i)
            .map(|(_, k)| k)
            .collect();
    }
    Ok(by_key
        .into_iter()
        .filter(|k| options.force || !has_exact_record(manifest, k))
        .collect())
}

/// Whether the cache (or the build's local fallback) holds a replayable record of the kernel for
/// exactly this CPU.
pub fn has_exact_record(manifest: &Manifest, kernel: &ManifestKernel) -> bool {
    let valid = |r: &Record| {
        lower(&kernel.graph, &r.schedule)
            .map(|_| ())
            .map_err(|e| e.to_string())
    };
    [&manifest.cache_dir, &manifest.local_cache]
        .iter()
        .any(|dir| {
            TuningCache::new(dir)
                .lookup(&kernel.workload_key, &manifest.target, valid)
                .source
                == LookupSource::Exact
        })
}

/// How often the crate runs a workload: the weights of its kernels that share it, summed.
pub fn workload_weight(manifest: &Manifest, kernel: &ManifestKernel) -> f64 {
    manifest
        .kernels
        .iter()
        .filter(|k| k.workload_key == kernel.workload_key)
        .map(|k| k.weight)
        .sum::<f64>()
        .max(f64::MIN_POSITIVE)
}

/// Tunes `kernels` (what [`select`] chose) together, and with GPU code the shard's GPU
/// kernels too. A kernel whose tune fails is an outcome with a note, not an error: the others
/// go on.
pub fn run(
    manifest: &Manifest,
    kernels: &[&ManifestKernel],
    options: &JobOptions,
    progress: &mut dyn Progress,
) -> Result<Vec<TuneOutcome>, JobError> {
    if strategy_by_name::<CpuSpace>(&options.strategy, options.seed).is_none() {
        return Err(JobError::Strategy(options.strategy.clone()));
    }
    if scheduler_by_name(&options.scheduler).is_none() {
        return Err(JobError::Scheduler(options.scheduler.clone()));
    }
    // A bad name fails the job before any work.
    let model = if kernels.is_empty() {
        None
    } else {
        Some(cost_model(manifest, options)?)
    };
    let mut outcomes = Vec::new();
    if manifest.cuda {
        // GPU records are per device, which only the GPU measurer knows: every kernel of the
        // shard goes to tune_gpu, which skips those with a record for this device.
        let mut all = options.clone();
        all.force = true;
        for kernel in select(manifest, &all)? {
            outcomes.extend(tune_gpu(manifest, kernel, options));
        }
    }
    let Some(mut model) = model else {
        return Ok(outcomes);
    };
    let threads = threads(manifest, options);
    let failed = |note: String| -> Vec<TuneOutcome> {
        kernels
            .iter()
            .map(|k| TuneOutcome {
                note: Some(note.clone()),
                ..blank_outcome(k)
            })
            .collect()
    };
    let (mut measurer, variant) = match measurer(manifest, threads, options)? {
        Ok(m) => m,
        Err(note) => {
            outcomes.extend(failed(note));
            return Ok(outcomes);
        }
    };
    let cpu = variant.cpu_target(&manifest.target.arch, threads);
    outcomes.extend(tune_kernels(
        manifest,
        kernels,
        &cpu,
        options,
        model.as_mut(),
        &mut measurer,
        progress,
    ));
    Ok(outcomes)
}

/// The measurer of a job on `manifest`'s CPU and the code variant it builds: workers build and
/// dispatch to the manifest's ISA class, which may be below the host's (`HARL_ISA=avx2` in
/// the build). `Err` for a crate that cannot be measured at all; `Ok(Err(note))` when this
/// machine cannot measure it (the kernels keep their defaults, with the note).
pub fn measurer(
    manifest: &Manifest,
    threads: usize,
    options: &JobOptions,
) -> Result<Result<(Measurer, Variant), String>, JobError> {
    let harl_root = manifest
        .harl_root
        .clone()
        .ok_or_else(|| JobError::NoHarl(manifest.package.clone()))?;
    let Some(variant) = Variant::ALL
        .into_iter()
        .find(|v| v.isa_class(&manifest.target.arch) == manifest.target.isa_class)
    else {
        return Ok(Err(format!(
            "no code variant for ISA class {}",
            manifest.target.isa_class
        )));
    };
    // Beside the generated code, not in it (`OUT_DIR/harl-measure`, where builds always kept
    // it): the workers' release build of harl and rayon is reused across tunes.
    let work_dir = manifest.gen_dir.parent().map_or_else(
        || manifest.gen_dir.join("measure"),
        |out| out.join("harl-measure"),
    );
    let mut config = MeasureConfig::new(work_dir, &harl_root);
    config.threads = threads;
    config.variant = Some(variant);
    config.flush_bytes = if options.cold { COLD_FLUSH_BYTES } else { 0 };
    config.seed = options.seed;
    Ok(Measurer::new(config)
        .map(|m| (m, variant))
        .map_err(|e| format!("cannot measure: {e}")))
}

fn blank_outcome(kernel: &ManifestKernel) -> TuneOutcome {
    TuneOutcome {
        name: kernel.name.clone(),
        workload_key: kernel.workload_key.clone(),
        ..TuneOutcome::default()
    }
}

/// The job's cost model.
fn cost_model(manifest: &Manifest, options: &JobOptions) -> Result<Box<dyn CostModel>, JobError> {
    let bad = |why: String| JobError::CostModel(options.cost_model.clone(), why);
    match model_by_name(
        &options.cost_model,
        options.seed,
        &manifest.target.isa_class,
    ) {
        Some(Ok(m)) => Ok(m),
        Some(Err(e)) => Err(bad(e.to_string())),
        None => Err(bad(format!("not a cost model ({COST_MODEL_NAMES})"))),
    }
}

/// The search's fastest schedules timed again beside the default before one is shipped.
const FINALISTS: usize = 3;
/// Rounds of that re-timing (medians).
const FINAL_ROUNDS: usize = 3;

/// The threads a job measures with.
pub fn threads(manifest: &Manifest, options: &JobOptions) -> usize {
    options.threads.unwrap_or(manifest.threads).max(1)
}

/// The trial log of one kernel under these options.
pub fn log_path(manifest: &Manifest, kernel: &ManifestKernel, options: &JobOptions) -> PathBuf {
    let strategy: String = options
        .strategy
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .take(32)
        .collect();
    options
        .log_dir
        .clone()
        .unwrap_or_else(|| manifest.gen_dir.join("tune-log"))
        .join(format!(
            "{}-{strategy}-s{}-t{}.jsonl",
            kernel.workload_key,
            options.seed,
            threads(manifest, options)
        ))
}

/// The CPU search of a job over `measurer`: every kernel's default timed first, then one
/// budget spread over the kernels by the task scheduler, then each kernel's finalists re-timed
/// beside its default and the winner recorded. One outcome per kernel, in order.
pub fn tune_kernels(
    manifest: &Manifest,
    kernels: &[&ManifestKernel],
    cpu: &CpuTarget,
    options: &JobOptions,
    model: &mut dyn CostModel,
    measurer: &mut dyn Measure,
    progress: &mut dyn Progress,
) -> Vec<TuneOutcome> {
    let start = Instant::now();
    let mut outcomes: Vec<TuneOutcome> = kernels.iter().map(|k| blank_outcome(k)).collect();
    let (Some(mut strategy), Some(mut scheduler)) = (
        strategy_by_name(&options.strategy, options.seed),
        scheduler_by_name(&options.scheduler),
    ) else {
        for o in &mut outcomes {
            o.note = Some(format!(
                "`{}` / `{}` is not a strategy / task scheduler",
                options.strategy, options.scheduler
            ));
        }
        return outcomes;
    };
    if kernels.len() == 1 {
        // Nothing to choose between: the control, which draws nothing from the seed.
        scheduler = Box::new(RoundRobin::default());
    }
    let budget = options.job_trials(kernels.len());
    let label = match kernels {
        [one] => one.name.clone(),
        _ => format!(
            "{} kernels ({} task scheduler)",
            kernels.len(),
            options.scheduler
        ),
    };
    progress.start(&label, budget);
    let mut log = JobLog::open(manifest, kernels, options, measurer, progress);
    let defaults: Vec<Schedule> = kernels
        .iter()
        .map(|k| default_schedule(&k.graph, cpu))
        .collect();
    log.phase = Phase::Default;
    for ((kernel, default), outcome) in kernels.iter().zip(&defaults).zip(&mut outcomes) {
        outcome.default_latency_s = log
            .measure(&kernel.graph, std::slice::from_ref(default))
            .into_iter()
            .next()
            .and_then(Result::ok);
    }
    log.phase = Phase::Search;
    let tune_options = TuneOptions {
        trials: budget,
        // As Ansor's task scheduler: rounds small enough that every kernel gets one.
        batch: (budget / kernels.len().max(1)).clamp(1, 16),
        // The budget counts from the job's start (the defaults' timing is in it) and keeps
        // room for the finalists' re-timing after the search: about one search round a kernel
        // (MobileNet-V2's 32 kernels: 162 s of re-timing after 57 rounds in 307 s).
        time_budget: options
            .job_seconds(kernels.len())
            .map(|s| Duration::from_secs(s).saturating_sub(start.elapsed())),
        reserve_rounds: kernels.len(),
        seed: options.seed,
        seed_default: true,
    };
    let tasks = kernels
        .iter()
        .map(|k| {
            Task::new(
                k.name.clone(),
                k.graph.clone(),
                workload_weight(manifest, k),
            )
        })
        .collect();
    let result = tune(
        tasks,
        cpu,
        &tune_options,
        strategy.as_mut(),
        scheduler.as_mut(),
        model,
        &mut log,
    );
    // What ships is chosen on the finalists and the default timed again side by side, never
    // on the search's one-off timings: the default is shipped unless a finalist beats it there.
    // Through the trial log, so a resumed tune replays these too and ships the same.
    log.phase = Phase::Final;
    for (i, ((kernel, default), outcome)) in
        kernels.iter().zip(defaults).zip(&mut outcomes).enumerate()
    {
        let mut schedules = vec![default.clone()];
        if let Some(state) = result.tasks.get(i) {
            outcome.trials = state.trials.len();
            schedules.extend(
                finalists(state, FINALISTS)
                    .into_iter()
                    .filter(|s| *s != default),
            );
        }
        let medians = if schedules.len() > 1 {
            retime_finalists(&mut log, &kernel.graph, &schedules, FINAL_ROUNDS)
        } else {
            vec![outcome.default_latency_s]
        };
        if let Some(d) = medians[0] {
            outcome.default_latency_s = Some(d);
        }
        // The default is first: on a tie it wins, as nothing beat it.
        let chosen = schedules
            .into_iter()
            .zip(medians)
            .enumerate()
            .filter_map(|(i, (s, m))| m.map(|m| (i, s, m)))
            .min_by(|a, b| a.2.total_cmp(&b.2));
        match chosen {
            Some((i, schedule, latency)) => {
                outcome.latency_s = Some(latency);
                let r = new_record(manifest, kernel, schedule, latency, outcome.trials);
                record(manifest, r.with_default_won(i == 0), outcome);
            }
            None => {
                outcome.note =
                    Some("every trial failed; the build keeps the default schedule".into())
            }
        }
    }
    // Each kernel's share of the job's time: its own measurements, and the rest (proposals,
    // retraining) in proportion to its trials.
    let wall = start.elapsed().as_secs_f64();
    let measured: f64 = log.seconds.iter().sum();
    let trials = outcomes.iter().map(|o| o.trials).sum::<usize>().max(1);
    for (o, own) in outcomes.iter_mut().zip(&log.seconds) {
        o.wall_s = own + (wall - measured).max(0.0) * o.trials as f64 / trials as f64;
    }
    for o in &outcomes {
        log.progress.finish(o);
    }
    outcomes
}

/// The record of `kernel`'s winner on the manifest's target.
fn new_record(
    manifest: &Manifest,
    kernel: &ManifestKernel,
    schedule: Schedule,
    latency: f64,
    trials: usize,
) -> Record {
    Record::new(
        kernel.workload_key.clone(),
        &kernel.name,
        manifest.target.clone(),
        schedule,
        latency,
        trials as u64,
    )
}

/// Appends the kernel's record to the crate's cache (or, if that is read-only, to the build's
/// local cache), noting where it went.
fn record(manifest: &Manifest, record: Record, outcome: &mut TuneOutcome) {
    match TuningCache::new(&manifest.cache_dir).append(&record) {
        Ok(path) => outcome.recorded_in = Some(path),
        // A read-only cache (a vendored crate, a locked-down CI checkout): keep the record in
        // the build's OUT_DIR, where that build finds it, so it does not tune again.
        Err(e) => match TuningCache::new(&manifest.local_cache).append(&record) {
            Ok(path) => {
                outcome.recorded_in = Some(path);
                outcome.note = Some(format!(
                    "could not record it in the tuning cache ({e}); kept it in OUT_DIR, so later builds of this crate reuse it"
                ));
            }
            Err(e2) => {
                outcome.note = Some(format!(
                    "could not record it in the tuning cache ({e}) nor in OUT_DIR ({e2})"
                ))
            }
        },
    }
}

/// Tunes a kernel's GPU schedule on this machine's GPU (device 0) when the cache has no record
/// for exactly this device: the tuning loop over [`crate::space::GpuSpace`], the winner (never
/// slower than the default GPU schedule, which is measured first) appended to `cuda-sm_XY.jsonl`. `None` when there is
/// nothing to do (a record exists, or the kernel has no GPU schedule).
#[cfg(feature = "cuda")]
fn tune_gpu(
    manifest: &Manifest,
    kernel: &ManifestKernel,
    options: &JobOptions,
) -> Option<TuneOutcome> {
    use crate::measure::gpu::{GpuMeasureConfig, GpuMeasurer};
    use crate::space::GpuSpace;
    use crate::task::TaskState;
    use crate::tuner::{best_candidate, default_latency, tune_states};
    let graph = &kernel.graph;
    let space = GpuSpace::new(graph)?;
    let mut outcome = TuneOutcome {
        name: format!("{} (gpu)", kernel.name),
        workload_key: kernel.workload_key.clone(),
        ..TuneOutcome::default()
    };
    let mut m = match GpuMeasurer::new(GpuMeasureConfig {
        seed: options.seed,
        ..GpuMeasureConfig::default()
    }) {
        Ok(m) => m,
        Err(e) => {
            outcome.note = Some(format!(
                "not tuning its GPU schedule ({e}); it ships the cached or default GPU schedule"
            ));
            return Some(outcome);
        }
    };
    let fingerprint = m.fingerprint();
    let cache = TuningCache::new(&manifest.cache_dir);
    let lookup = cache.lookup(&kernel.workload_key, &fingerprint, |r| {
        lower(graph, &r.schedule)
            .map(|_| ())
            .map_err(|e| e.to_string())
    });
    if lookup.source == LookupSource::Exact && !options.force {
        return None;
    }
    let Some(mut strategy) = strategy_by_name::<GpuSpace>(&options.strategy, options.seed) else {
        outcome.note = Some(format!("`{}` is not a strategy", options.strategy));
        return Some(outcome);
    };
    let tune_options = TuneOptions {
        trials: options.gpu_trials,
        batch: 16,
        time_budget: None,
        reserve_rounds: 0,
        seed: options.seed,
        seed_default: true,
    };
    let task = Task::new(kernel.name.clone(), graph.clone(), 1.0);
    let result = tune_states(
        vec![TaskState::with_space(task, space)],
        &tune_options,
        strategy.as_mut(),
        &mut RoundRobin::default(),
        // Cold: the shipped datasets are CPU measurements, and a prior made on one ISA ranks
        // another's schedules barely above chance, let alone a GPU's.
        &mut crate::cost_model::XgbModel::with_seed(options.seed),
        &mut m,
    );
    outcome.trials = result.trials;
    outcome.wall_s = result.wall_s;
    let Some(state) = result.tasks.first() else {
        return Some(outcome);
    };
    outcome.default_latency_s = default_latency(state);
    let Some((best, latency)) = best_candidate(state) else {
        outcome.note = Some("every GPU trial failed; it ships the default GPU schedule".into());
        return Some(outcome);
    };
    let schedule = best.schedule.clone();
    outcome.latency_s = Some(latency);
    let record = Record::new(
        kernel.workload_key.clone(),
        &kernel.name,
        fingerprint,
        schedule,
        latency,
        result.trials as u64,
    );
    match cache.append(&record) {
        Ok(path) => outcome.recorded_in = Some(path),
        Err(e) => outcome.note = Some(format!("could not record it: {e}")),
    }
    Some(outcome)
}

/// Without the `cuda` feature there is no GPU measurer: one note per kernel says so.
#[cfg(not(feature = "cuda"))]
fn tune_gpu(_: &Manifest, kernel: &ManifestKernel, _: &JobOptions) -> Option<TuneOutcome> {
    Some(TuneOutcome {
        name: format!("{} (gpu)", kernel.name),
        workload_key: kernel.workload_key.clone(),
        note: Some(
            "not tuning its GPU schedule: this tuner was built without its `cuda` feature".into(),
        ),
        ..TuneOutcome::default()
    })
}

/// The first line of a trial log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogHeader {
    /// The kernel's name.
    pub kernel: String,
    /// Its workload key.
    pub workload_key: String,
    /// Its floating-point operations per run.
    pub flops: f64,
    /// The strategy.
    pub strategy: String,
    /// The seed.
    pub seed: u64,
    /// The trial budget.
    pub trials: usize,
    /// The timing protocol the figures were taken with ([`LOG_PROTOCOL`]; 0 in logs from
    /// before it was recorded).
    #[serde(default)]
    pub protocol: u32,
}

/// The measurer's timing protocol, recorded in every trial log: a log taken under another one
/// is not replayed, since its figures are not comparable (2: a candidate over the cutoff is
/// timed by a steady-state run, no longer by its first call).
pub const LOG_PROTOCOL: u32 = 2;

/// One measured schedule of a trial log.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct LogTrial {
    /// The schedule.
    pub schedule: Schedule,
    /// Its latency in seconds, or `None` when the trial failed.
    pub latency_s: Option<f64>,
    /// Why it failed.
    pub error: Option<String>,
    /// Whether this is the default schedule (measured before the search).
    #[serde(default)]
    pub default: bool,
    /// Whether this is a re-timing of the finalists after the search (not a search trial).
    #[serde(default)]
    pub final_round: bool,
    /// Seconds since the kernel's tune started.
    pub elapsed_s: f64,
}

/// A trial log as read back: its header and trials in order; unreadable lines are skipped.
pub fn read_log(path: &Path) -> Option<(LogHeader, Vec<LogTrial>)> {
    let text = std::fs::read_to_string(path).ok()?;
    let mut lines = text.lines();
    let header: LogHeader = serde_json::from_str(lines.next()?).ok()?;
    let trials = lines.filter_map(|l| serde_json::from_str(l).ok()).collect();
    Some((header, trials))
}

/// Which measurements a job is taking: they are logged with it, and a resumed job replays
/// each from its own kind.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    /// The defaults, before the search.
    Default,
    /// The search's trials.
    Search,
    /// The finalists' re-timings.
    Final,
}

/// One kernel's part of a [`JobLog`].
struct KernelLog {
    name: String,
    key: String,
    flops: f64,
    replay: HashMap<String, Result<f64, String>>,
    /// The finalists' logged re-timings per schedule, in order.
    finals: HashMap<String, VecDeque<Result<f64, String>>>,
    file: Option<std::fs::File>,
    best: Option<f64>,
}

impl KernelLog {
    /// Reads what an earlier run with the same settings logged, then starts the log afresh (it
    /// is rewritten trial by trial, so it always holds exactly the latest run).
    fn open(path: &Path, kernel: &ManifestKernel, options: &JobOptions) -> Self {
        let mut replay = HashMap::new();
        let mut finals: HashMap<String, VecDeque<Result<f64, String>>> = HashMap::new();
        let logged = read_log(path)
            .filter(|(h, _)| h.workload_key == kernel.workload_key && h.protocol == LOG_PROTOCOL);
        for t in logged.map(|(_, trials)| trials).unwrap_or_default() {
            let Ok(key) = serde_json::to_string(&t.schedule) else {
                continue;
            };
            let result = match (t.latency_s, t.error) {
                (Some(l), _) if l.is_finite() && l > 0.0 => Ok(l),
                (_, e) => Err(e.unwrap_or_else(|| "failed".into())),
            };
            if t.final_round {
                finals.entry(key).or_default().push_back(result);
            } else {
                replay.insert(key, result);
            }
        }
        let file = path
            .parent()
            .map(std::fs::create_dir_all)
            .and_then(Result::ok)
            .and_then(|_| std::fs::File::create(path).ok());
        let mut log = KernelLog {
            name: kernel.name.clone(),
            key: kernel.workload_key.clone(),
            flops: kernel.graph.flops(),
            replay,
            finals,
            file,
            best: None,
        };
        log.write_line(&LogHeader {
            kernel: kernel.name.clone(),
            workload_key: kernel.workload_key.clone(),
            flops: log.flops,
            strategy: options.strategy.clone(),
            seed: options.seed,
            trials: options.trials,
            protocol: LOG_PROTOCOL,
        });
        log
    }

    fn write_line(&mut self, value: &impl Serialize) {
        if let (Some(f), Ok(line)) = (self.file.as_mut(), serde_json::to_string(value)) {
            // A log that cannot be written costs resumability, not the tune.
            let _ = writeln!(f, "{line}").and_then(|_| f.flush());
        }
    }

    /// What an earlier run logged for this schedule in this phase, if anything. (A finalists'
    /// round replays that schedule's next logged re-timing.)
    fn logged(&mut self, schedule: &Schedule, phase: Phase) -> Option<Result<f64, String>> {
        let key = serde_json::to_string(schedule).ok()?;
        match phase {
            Phase::Final => self.finals.get_mut(&key)?.pop_front(),
            Phase::Default | Phase::Search => self.replay.get(&key).cloned(),
        }
    }
}

/// The measurer as the tuner sees it: each kernel's logged trials are replayed, new ones
/// measured, logged and reported.
struct JobLog<'a> {
    inner: &'a mut dyn Measure,
    progress: &'a mut dyn Progress,
    kernels: Vec<KernelLog>,
    /// Seconds spent measuring each kernel.
    seconds: Vec<f64>,
    start: Instant,
    /// Search trials of the whole job so far.
    trials: usize,
    phase: Phase,
}

impl<'a> JobLog<'a> {
    fn open(
        manifest: &Manifest,
        kernels: &[&ManifestKernel],
        options: &JobOptions,
        inner: &'a mut dyn Measure,
        progress: &'a mut dyn Progress,
    ) -> Self {
        JobLog {
            inner,
            progress,
            kernels: kernels
                .iter()
                .map(|k| KernelLog::open(&log_path(manifest, k, options), k, options))
                .collect(),
            seconds: vec![0.0; kernels.len()],
            start: Instant::now(),
            trials: 0,
            phase: Phase::Search,
        }
    }
}

impl Measure for JobLog<'_> {
    fn set_best(&mut self, best_s: Option<f64>) {
        self.inner.set_best(best_s);
    }

    fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        let key = graph.workload_key();
        let Some(k) = self.kernels.iter().position(|l| l.key == key) else {
            // Not one of the job's kernels: nothing to replay or log.
            return self.inner.measure(graph, schedules);
        };
        let phase = self.phase;
        let logged: Vec<Option<Result<f64, String>>> = schedules
            .iter()
            .map(|s| self.kernels[k].logged(s, phase))
            .collect();
        let fresh: Vec<Schedule> = schedules
            .iter()
            .zip(&logged)
            .filter(|(_, l)| l.is_none())
            .map(|(s, _)| s.clone())
            .collect();
        let measuring = Instant::now();
        let mut measured = if fresh.is_empty() {
            Vec::new()
        } else {
            self.inner.measure(graph, &fresh)
        }
        .into_iter();
        self.seconds[k] += measuring.elapsed().as_secs_f64();
        let elapsed_s = self.start.elapsed().as_secs_f64();
        let log = &mut self.kernels[k];
        let mut results = Vec::with_capacity(schedules.len());
        for (schedule, logged) in schedules.iter().zip(logged) {
            let result = logged.unwrap_or_else(|| {
                measured
                    .next()
                    .unwrap_or_else(|| Err("the measurer returned too few results".into()))
            });
            log.write_line(&LogTrial {
                schedule: schedule.clone(),
                latency_s: result.as_ref().ok().copied(),
                error: result.as_ref().err().cloned(),
                default: phase == Phase::Default,
                final_round: phase == Phase::Final,
                elapsed_s,
            });
            if let Ok(l) = result {
                log.best = Some(log.best.map_or(l, |b: f64| b.min(l)));
            }
            results.push(result);
        }
        if phase == Phase::Search {
            self.trials += schedules.len();
        }
        let gflops = log.best.map(|b| log.flops / b / 1e9);
        self.progress.advance(self.trials, &log.name, gflops);
        results
    }
}

/// A progress that says nothing (library callers, tests).
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _: &str, _: usize) {}
    fn advance(&mut self, _: usize, _: &str, _: Option<f64>) {}
    fn finish(&mut self, _: &TuneOutcome) {}
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost_model::XgbModel;
    use harl_build::target::TargetFingerprint;
    use harl_te::ops::workloads;

    /// A deterministic stand-in for the measurer: latency from a hash of the schedule, scaled
    /// by the graph's work; counts the schedules it was asked to time.
    #[derive(Default)]
    struct Fake {
        timed: usize,
    }

    impl Measure for Fake {
        fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
            self.timed += schedules.len();
            schedules
                .iter()
                .map(|s| {
                    let h = format!("{:?}", s.steps)
                        .bytes()
                        .fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
                            (h ^ b as u64).wrapping_mul(0x100_0000_01b3)
                        });
                    Ok(graph.flops() * 1e-11 * (1.0 + (h % 1000) as f64 / 1000.0))
                })
                .collect()
        }
    }

    fn kernel(name: &str, graph: Graph, weight: f64) -> ManifestKernel {
        ManifestKernel {
            name: name.into(),
            workload_key: graph.workload_key(),
            graph,
            weight,
        }
    }

    fn manifest(dir: &Path) -> Manifest {
        Manifest {
            version: harl_build::manifest::MANIFEST_VERSION,
            package: "t".into(),
            manifest_dir: dir.to_path_buf(),
            cache_dir: dir.join("cache"),
            local_cache: dir.join("local"),
            gen_dir: dir.join("out/harl"),
            harl_root: None,
            target: TargetFingerprint::host(),
            threads: 1,
            cuda: false,
            kernels: vec![
                kernel(
                    "heavy",
                    workloads::matmul(64, 64, 64).expect("matmul"),
                    12.0,
                ),
                kernel("light", workloads::matmul(32, 48, 16).expect("matmul"), 1.0),
                // The same workload under a second name: one task, their weights summed.
                kernel(
                    "light2",
                    workloads::matmul(32, 48, 16).expect("matmul"),
                    2.0,
                ),
            ],
        }
    }

    fn job(m: &Manifest, options: &JobOptions, fake: &mut Fake) -> Vec<TuneOutcome> {
        let kernels = select(m, options).expect("select");
        let cpu = Variant::Avx512.cpu_target("x86_64", 1);
        let mut model = XgbModel::with_seed(options.seed);
        tune_kernels(m, &kernels, &cpu, options, &mut model, fake, &mut Silent)
    }

    fn options(scheduler: &str) -> JobOptions {
        JobOptions {
            trials: 32,
            scheduler: scheduler.into(),
            cost_model: "xgb".into(),
            force: true,
            ..JobOptions::default()
        }
    }

    #[test]
    fn one_budget_is_shared_by_the_kernels_and_each_gets_a_record() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = manifest(dir.path());
        let kernels = select(&m, &options("harl")).expect("select");
        assert_eq!(kernels.len(), 2, "kernels sharing a workload are one task");
        let light = kernels.iter().find(|k| k.name == "light").expect("light");
        assert_eq!(workload_weight(&m, light), 3.0);
        let outcomes = job(&m, &options("harl"), &mut Fake::default());
        assert_eq!(outcomes.len(), 2);
        assert_eq!(outcomes.iter().map(|o| o.trials).sum::<usize>(), 64);
        for o in &outcomes {
            assert!(
                o.trials > 0,
                "{}: every kernel gets its first round",
                o.name
            );
            let (Some(t), Some(d)) = (o.latency_s, o.default_latency_s) else {
                panic!("{}: no latency", o.name);
            };
            assert!(
                t <= d,
                "{}: shipped {t}, slower than the default {d}",
                o.name
            );
            assert!(o.recorded_in.is_some(), "{}: {:?}", o.name, o.note);
        }
        for k in &kernels {
            assert!(has_exact_record(&m, k), "{} has no record", k.name);
        }
    }

    /// Times the default schedule at 1 ms and every other at 2 ms, or the other way round.
    struct DefaultIs {
        fastest: bool,
    }

    impl Measure for DefaultIs {
        fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
            let default = default_schedule(graph, &Variant::Avx512.cpu_target("x86_64", 1));
            schedules
                .iter()
                .map(|s| {
                    Ok(if (*s == default) == self.fastest {
                        1e-3
                    } else {
                        2e-3
                    })
                })
                .collect()
        }
    }

    #[test]
    fn a_record_says_whether_the_default_won_its_tune() {
        for fastest in [true, false] {
            let dir = tempfile::tempdir().expect("tempdir");
            let m = manifest(dir.path());
            let kernels = select(&m, &options("round-robin")).expect("select");
            let cpu = Variant::Avx512.cpu_target("x86_64", 1);
            let mut model = XgbModel::with_seed(0);
            let outcomes = tune_kernels(
                &m,
                &kernels,
                &cpu,
                &options("round-robin"),
                &mut model,
                &mut DefaultIs { fastest },
                &mut Silent,
            );
            let (records, warnings) = TuningCache::new(&m.cache_dir).records(&m.target.isa_class);
            assert!(warnings.is_empty(), "{warnings:?}");
            assert_eq!(records.len(), outcomes.len());
            for r in &records {
                assert_eq!(r.default_won, fastest, "{}", r.workload);
                // The fastest schedule is shipped either way.
                assert_eq!(r.latency_s, 1e-3, "{}", r.workload);
            }
        }
    }

    #[test]
    fn the_scheduler_decides_the_split_and_a_rerun_replays_it() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = manifest(dir.path());
        let split = |o: &[TuneOutcome]| o.iter().map(|o| o.trials).collect::<Vec<_>>();
        let mut fake = Fake::default();
        let round_robin = split(&job(&m, &options("round-robin"), &mut fake));
        assert_eq!(round_robin, [32, 32]);
        let mut first = Fake::default();
        let harl = job(&m, &options("harl"), &mut first);
        assert!(first.timed > 0);
        // The heavy kernel is ~40x the light one's share of the end-to-end time (12x its
        // weight, 3x the light's 3; ~10x its work): the bandit spends more on it.
        let trials_of = |name: &str| harl.iter().find(|o| o.name == name).map(|o| o.trials);
        assert!(
            trials_of("heavy") > trials_of("light"),
            "{:?}",
            split(&harl)
        );
        // The same settings again: every measurement comes from the trial logs, and the search
        // walks the same path to the same split and the same records.
        let mut again = Fake::default();
        let replayed = job(&m, &options("harl"), &mut again);
        assert_eq!(again.timed, 0, "a rerun measured anew");
        assert_eq!(split(&harl), split(&replayed));
        for (a, b) in harl.iter().zip(&replayed) {
            assert_eq!(a.latency_s, b.latency_s);
        }
    }

    #[test]
    fn logs_of_another_timing_protocol_are_not_replayed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let m = manifest(dir.path());
        let mut first = Fake::default();
        job(&m, &options("harl"), &mut first);
        let logs = m.gen_dir.join("tune-log");
        for entry in std::fs::read_dir(&logs).expect("logs") {
            let path = entry.expect("entry").path();
            let text = std::fs::read_to_string(&path).expect("log");
            let old = text.replacen(&format!("\"protocol\":{LOG_PROTOCOL}"), "\"protocol\":1", 1);
            assert_ne!(old, text, "the header records its protocol");
            std::fs::write(&path, old).expect("write");
        }
        let mut again = Fake::default();
        job(&m, &options("harl"), &mut again);
        assert_eq!(
            again.timed, first.timed,
            "an older protocol's figures were replayed"
        );
    }

    #[test]
    fn budgets_pool_per_kernel_figures_unless_a_total_is_given() {
        let o = JobOptions {
            trials: 64,
            seconds: Some(60),
            ..JobOptions::default()
        };
        assert_eq!((o.job_trials(5), o.job_seconds(5)), (320, Some(300)));
        let o = JobOptions {
            total_trials: Some(100),
            total_seconds: Some(1200),
            ..o
        };
        assert_eq!((o.job_trials(5), o.job_seconds(5)), (100, Some(1200)));
        assert_eq!(
            JobOptions {
                trials: usize::MAX,
                ..JobOptions::default()
            }
            .job_trials(3),
            usize::MAX
        );
    }
}
