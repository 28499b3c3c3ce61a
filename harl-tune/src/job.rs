//! A tuning job: the kernels of a build's [`Manifest`], each without a record for this CPU,
//! tuned one after another within a budget, each winner recorded in the crate's tuning cache as
//! soon as it is found (so an interrupted job keeps every kernel it finished).
//!
//! Every trial also goes to a trial log (one file per kernel, strategy, seed and thread count).
//! A job started again with the same settings replays the logged measurements instead of timing
//! those schedules again: the search is deterministic under its seed, so it walks the same path
//! up to where the interrupted run stopped and goes on from there. `cargo harl report` reads the
//! same logs.

use crate::cost_model::{model_by_name, CostModel, COST_MODEL_NAMES, DEFAULT_COST_MODEL};
use crate::measure::Measure;
use crate::measure::{MeasureConfig, Measurer};
use crate::space::cpu::Task;
use crate::space::CpuSpace;
use crate::strategy::{strategy_by_name, STRATEGY_NAMES};
use crate::task_scheduler::RoundRobin;
use crate::tuner::{finalists, retime_finalists, tune, TuneOptions};
use harl_build::cache::{LookupSource, Record, TuningCache};
use harl_build::codegen::Variant;
use harl_build::default_schedule::default_schedule;
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
    /// Measured trials per kernel.
    pub trials: usize,
    /// Wall-time budget per kernel.
    pub seconds: Option<u64>,
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
}

impl Default for JobOptions {
    fn default() -> Self {
        JobOptions {
            trials: 64,
            seconds: None,
            seed: 0,
            strategy: "ansor".into(),
            cost_model: DEFAULT_COST_MODEL.into(),
            threads: None,
            shard: None,
            force: false,
            log_dir: None,
            gpu_trials: 64,
        }
    }
}

/// Why a job cannot start.
#[derive(Debug, thiserror::Error)]
pub enum JobError {
    /// An unknown strategy name.
    #[error("`{0}` is not a strategy ({STRATEGY_NAMES})")]
    Strategy(String),
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
    /// A kernel's tune starts, with its trial budget.
    fn start(&mut self, kernel: &str, budget: usize);
    /// After each measured batch: trials so far and the best GFLOP/s so far.
    fn advance(&mut self, trials: usize, best_gflops: Option<f64>);
    /// The kernel is done.
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

/// Tunes `kernels` (what [`select`] chose) in turn, and with GPU code the shard's GPU kernels
/// too. A kernel whose tune fails is an outcome with a note, not
/// an error: the others go on.
pub fn run(
    manifest: &Manifest,
    kernels: &[&ManifestKernel],
    options: &JobOptions,
    progress: &mut dyn Progress,
) -> Result<Vec<TuneOutcome>, JobError> {
    if strategy_by_name::<CpuSpace>(&options.strategy, options.seed).is_none() {
        return Err(JobError::Strategy(options.strategy.clone()));
    }
    if !kernels.is_empty() {
        // A bad name fails the job before any work (the prior it fits is kept for the kernels).
        cost_model(manifest, options)?;
    }
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
    if kernels.is_empty() {
        return Ok(outcomes);
    }
    let harl_root = manifest
        .harl_root
        .clone()
        .ok_or_else(|| JobError::NoHarl(manifest.package.clone()))?;
    for &kernel in kernels {
        progress.start(&kernel.name, options.trials);
        let outcome = tune_one(manifest, kernel, &harl_root, options, progress);
        progress.finish(&outcome);
        outcomes.push(outcome);
    }
    Ok(outcomes)
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

fn tune_one(
    manifest: &Manifest,
    kernel: &ManifestKernel,
    harl_root: &Path,
    options: &JobOptions,
    progress: &mut dyn Progress,
) -> TuneOutcome {
    let start = Instant::now();
    let mut outcome = TuneOutcome {
        name: kernel.name.clone(),
        workload_key: kernel.workload_key.clone(),
        ..TuneOutcome::default()
    };
    let threads = threads(manifest, options);
    // Beside the generated code, not in it (`OUT_DIR/harl-measure`, where builds always kept
    // it): the workers' release build of harl and rayon is reused across tunes.
    let work_dir = manifest.gen_dir.parent().map_or_else(
        || manifest.gen_dir.join("measure"),
        |out| out.join("harl-measure"),
    );
    let mut config = MeasureConfig::new(work_dir, harl_root);
    config.threads = threads;
    config.seed = options.seed;
    let mut measurer = match Measurer::new(config) {
        Ok(m) => m,
        Err(e) => {
            outcome.note = Some(format!("cannot measure: {e}"));
            return outcome;
        }
    };
    let Some(variant) = Variant::ALL
        .into_iter()
        .find(|v| v.isa_class(&manifest.target.arch) == manifest.target.isa_class)
    else {
        outcome.note = Some(format!(
            "no code variant for ISA class {}",
            manifest.target.isa_class
        ));
        return outcome;
    };
    let cpu = variant.cpu_target(&manifest.target.arch, threads);
    let log = log_path(manifest, kernel, options);
    let mut logged = TrialLog::open(&log, kernel, options, &mut measurer, progress);
    let default = default_schedule(&kernel.graph, &cpu);
    logged.is_default = true;
    let default_latency = logged
        .measure(&kernel.graph, std::slice::from_ref(&default))
        .into_iter()
        .next()
        .and_then(Result::ok);
    logged.is_default = false;
    outcome.default_latency_s = default_latency;
    let Some(mut strategy) = strategy_by_name(&options.strategy, options.seed) else {
        outcome.note = Some(format!("`{}` is not a strategy", options.strategy));
        return outcome;
    };
    let tune_options = TuneOptions {
        trials: options.trials,
        batch: 16,
        time_budget: options.seconds.map(Duration::from_secs),
        seed: options.seed,
        seed_default: true,
    };
    let mut model = match cost_model(manifest, options) {
        Ok(m) => m,
        Err(e) => {
            outcome.note = Some(e.to_string());
            return outcome;
        }
    };
    let task = Task::new(kernel.name.clone(), kernel.graph.clone(), 1.0);
    let result = tune(
        vec![task],
        &cpu,
        &tune_options,
        strategy.as_mut(),
        &mut RoundRobin::default(),
        model.as_mut(),
        &mut logged,
    );
    outcome.trials = result.trials;
    // What ships is chosen on the finalists and the default timed again side by side, never
    // on the search's one-off timings: the default is shipped unless a finalist beats it there.
    let mut schedules = vec![default.clone()];
    if let Some(state) = result.tasks.first() {
        schedules.extend(
            finalists(state, FINALISTS)
                .into_iter()
                .filter(|s| *s != default),
        );
    }
    // Through the trial log, so a resumed tune replays these too and ships the same.
    logged.is_final = true;
    let medians = if schedules.len() > 1 {
        retime_finalists(&mut logged, &kernel.graph, &schedules, FINAL_ROUNDS)
    } else {
        vec![default_latency]
    };
    drop(logged);
    if let Some(d) = medians[0] {
        outcome.default_latency_s = Some(d);
    }
    let chosen = schedules
        .into_iter()
        .zip(medians)
        .filter_map(|(s, m)| m.map(|m| (s, m)))
        .min_by(|a, b| a.1.total_cmp(&b.1));
    let Some((schedule, latency)) = chosen else {
        outcome.note = Some("every trial failed; the build keeps the default schedule".into());
        outcome.wall_s = start.elapsed().as_secs_f64();
        return outcome;
    };
    outcome.latency_s = Some(latency);
    let record = Record::new(
        kernel.workload_key.clone(),
        &kernel.name,
        manifest.target.clone(),
        schedule,
        latency,
        result.trials as u64,
    );
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
    outcome.wall_s = start.elapsed().as_secs_f64();
    outcome
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
}

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

/// The measurer as the tuner sees it: logged trials are replayed, new ones measured, logged
/// and reported.
struct TrialLog<'a> {
    inner: &'a mut dyn Measure,
    progress: &'a mut dyn Progress,
    replay: HashMap<String, Result<f64, String>>,
    /// The finalists' logged re-timings per schedule, in order.
    finals: HashMap<String, VecDeque<Result<f64, String>>>,
    file: Option<std::fs::File>,
    flops: f64,
    start: Instant,
    trials: usize,
    best: Option<f64>,
    is_default: bool,
    is_final: bool,
}

impl<'a> TrialLog<'a> {
    /// Reads what an earlier run with the same settings logged, then starts the log afresh (it
    /// is rewritten trial by trial, so it always holds exactly the latest run).
    fn open(
        path: &Path,
        kernel: &ManifestKernel,
        options: &JobOptions,
        inner: &'a mut dyn Measure,
        progress: &'a mut dyn Progress,
    ) -> Self {
        let mut replay = HashMap::new();
        let mut finals: HashMap<String, VecDeque<Result<f64, String>>> = HashMap::new();
        let logged = read_log(path).filter(|(h, _)| h.workload_key == kernel.workload_key);
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
        let header = LogHeader {
            kernel: kernel.name.clone(),
            workload_key: kernel.workload_key.clone(),
            flops: kernel.graph.flops(),
            strategy: options.strategy.clone(),
            seed: options.seed,
            trials: options.trials,
        };
        let file = path
            .parent()
            .map(std::fs::create_dir_all)
            .and_then(Result::ok)
            .and_then(|_| std::fs::File::create(path).ok());
        let mut log = TrialLog {
            inner,
            progress,
            replay,
            finals,
            file,
            flops: kernel.graph.flops(),
            start: Instant::now(),
            trials: 0,
            best: None,
            is_default: false,
            is_final: false,
        };
        log.write_line(&header);
        log
    }

    fn write_line(&mut self, value: &impl Serialize) {
        if let (Some(f), Ok(line)) = (self.file.as_mut(), serde_json::to_string(value)) {
            // A log that cannot be written costs resumability, not the tune.
            let _ = writeln!(f, "{line}").and_then(|_| f.flush());
        }
    }
}

impl Measure for TrialLog<'_> {
    fn set_best(&mut self, best_s: Option<f64>) {
        self.inner.set_best(best_s);
    }

    fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        // What an earlier run logged for each schedule; the rest is measured, in one batch.
        // (A finalists' round replays that schedule's next logged re-timing.)
        let logged: Vec<Option<Result<f64, String>>> = schedules
            .iter()
            .map(|s| {
                let key = serde_json::to_string(s).ok()?;
                if self.is_final {
                    self.finals.get_mut(&key)?.pop_front()
                } else {
                    self.replay.get(&key).cloned()
                }
            })
            .collect();
        let fresh: Vec<Schedule> = schedules
            .iter()
            .zip(&logged)
            .filter(|(_, l)| l.is_none())
            .map(|(s, _)| s.clone())
            .collect();
        let mut measured = if fresh.is_empty() {
            Vec::new()
        } else {
            self.inner.measure(graph, &fresh)
        }
        .into_iter();
        let mut results = Vec::with_capacity(schedules.len());
        for (schedule, logged) in schedules.iter().zip(logged) {
            let result = logged.unwrap_or_else(|| {
                measured
                    .next()
                    .unwrap_or_else(|| Err("the measurer returned too few results".into()))
            });
            self.write_line(&LogTrial {
                schedule: schedule.clone(),
                latency_s: result.as_ref().ok().copied(),
                error: result.as_ref().err().cloned(),
                default: self.is_default,
                final_round: self.is_final,
                elapsed_s: self.start.elapsed().as_secs_f64(),
            });
            if let Ok(l) = result {
                self.best = Some(self.best.map_or(l, |b: f64| b.min(l)));
            }
            results.push(result);
        }
        if !self.is_default && !self.is_final {
            self.trials += schedules.len();
        }
        let gflops = self.best.map(|b| self.flops / b / 1e9);
        self.progress.advance(self.trials, gflops);
        results
    }
}

/// A progress that says nothing (library callers, tests).
pub struct Silent;

impl Progress for Silent {
    fn start(&mut self, _: &str, _: usize) {}
    fn advance(&mut self, _: usize, _: Option<f64>) {}
    fn finish(&mut self, _: &TuneOutcome) {}
}
