//! The tuning loop: the task scheduler picks a task, its strategy proposes a batch, the
//! measurer times it, the cost model retrains on every record, until the trial or time budget
//! is spent. Every decision draws from one seeded [`Rng`], so a seed and the same measurements
//! give the same sequence of schedules. The loop is generic over the [`SearchSpace`]: [`tune`]
//! runs it on the CPU sketch space of a set of tasks, [`tune_states`] on any space's tasks
//! (the GPU's: [`crate::space::GpuSpace`]).

use crate::cost_model::CostModel;
use crate::measure::Measure;
use crate::space::cpu::Task;
use crate::space::{CpuSpace, SearchSpace};
use crate::strategy::{Candidate, SearchStrategy, TaskState};
use crate::task_scheduler::{TaskScheduler, TaskView};
use harl_build::default_schedule::CpuTarget;
use harl_build::rng::Rng;
use harl_build::schedule::Schedule;
use harl_te::Graph;
use std::time::{Duration, Instant};

/// Budget and knobs of a tuning run.
#[derive(Clone, Debug)]
pub struct TuneOptions {
    /// Total measured trials over all tasks.
    pub trials: usize,
    /// Candidates measured per round.
    pub batch: usize,
    /// Stop starting new rounds after this long.
    pub time_budget: Option<Duration>,
    /// Rounds' worth of work the caller does after the search within the same `time_budget`
    /// (re-timing each task's finalists): the search stops early enough to leave that many
    /// of its own mean rounds for it.
    pub reserve_rounds: usize,
    /// The seed of every random decision.
    pub seed: u64,
    /// Measure each task's default-like schedules ([`TaskState::seeds`]) in its first round,
    /// so the search starts from the default schedule's neighbourhood.
    pub seed_default: bool,
}

impl Default for TuneOptions {
    fn default() -> Self {
        TuneOptions {
            trials: 200,
            batch: 16,
            time_budget: None,
            reserve_rounds: 0,
            seed: 0,
            seed_default: true,
        }
    }
}

/// One point of a best-so-far curve.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct CurvePoint {
    /// Trials spent so far (all tasks).
    pub trial: usize,
    /// Weighted sum of the tasks' best latencies (the network's latency), or the single task's.
    pub best_latency_s: f64,
    /// Seconds since tuning started.
    pub elapsed_s: f64,
}

/// What a tuning run found.
pub struct TuneResult<S: SearchSpace = CpuSpace> {
    /// Final state of each task (its trials, its best).
    pub tasks: Vec<TaskState<S>>,
    /// Best-so-far after every trial.
    pub curve: Vec<CurvePoint>,
    /// Trials spent per task.
    pub allocation: Vec<usize>,
    /// Trials spent in all.
    pub trials: usize,
    /// Wall time of the whole run.
    pub wall_s: f64,
    /// Where that wall time went.
    pub phases: PhaseTimes,
}

/// Seconds a tuning run spent in each phase of its rounds: what to speed up first.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PhaseTimes {
    /// The strategy's proposals (search over the cost model, and any agent training in it).
    pub propose_s: f64,
    /// Building and timing candidates.
    pub measure_s: f64,
    /// Retraining the cost model.
    pub retrain_s: f64,
}

/// Tunes `tasks`' CPU schedules for `target` within the budget.
pub fn tune(
    tasks: Vec<Task>,
    target: &CpuTarget,
    options: &TuneOptions,
    strategy: &mut dyn SearchStrategy,
    scheduler: &mut dyn TaskScheduler,
    model: &mut dyn CostModel,
    measurer: &mut dyn Measure,
) -> TuneResult {
    let states = tasks
        .into_iter()
        .map(|t| TaskState::new(t, target))
        .collect();
    tune_states(states, options, strategy, scheduler, model, measurer)
}

/// Tunes tasks in any search space within the budget: the one tuning loop.
pub fn tune_states<S: SearchSpace>(
    mut states: Vec<TaskState<S>>,
    options: &TuneOptions,
    strategy: &mut dyn SearchStrategy<S>,
    scheduler: &mut dyn TaskScheduler,
    model: &mut dyn CostModel,
    measurer: &mut dyn Measure,
) -> TuneResult<S> {
    let start = Instant::now();
    let mut rng = Rng::new(options.seed);
    let mut histories: Vec<Vec<Option<f64>>> = vec![Vec::new(); states.len()];
    let mut curve = Vec::new();
    let mut spent = 0usize;
    let mut stalled_rounds = 0usize;
    let mut phases = PhaseTimes::default();
    let mut rounds = 0u32;
    while spent < options.trials && !states.is_empty() {
        let elapsed = start.elapsed();
        if options
            .time_budget
            .is_some_and(|b| elapsed + reserve(elapsed, rounds, options) >= b)
        {
            break;
        }
        rounds = rounds.saturating_add(1);
        let views = task_views(&states, &histories);
        let ti = scheduler.next(&views, &mut rng).min(states.len() - 1);
        let batch = options.batch.min(options.trials - spent);
        let mut proposals = if options.seed_default && states[ti].trials.is_empty() {
            seed_candidates(&states[ti], batch)
        } else {
            Vec::new()
        };
        let proposing = Instant::now();
        if proposals.len() < batch {
            let rest = strategy.propose(&states[ti], &*model, batch - proposals.len(), &mut rng);
            for c in rest {
                if proposals.iter().all(|p| p.params != c.params) {
                    proposals.push(c);
                }
            }
        }
        phases.propose_s += proposing.elapsed().as_secs_f64();
        if proposals.is_empty() {
            // The task's space is exhausted (or empty); let the others go on.
            histories[ti].push(states[ti].best_latency());
            scheduler.notify(ti, &task_views(&states, &histories));
            stalled_rounds += 1;
            if stalled_rounds > 2 * states.len() {
                break;
            }
            continue;
        }
        stalled_rounds = 0;
        let schedules: Vec<Schedule> = proposals.iter().map(|c| c.schedule.clone()).collect();
        measurer.set_best(states[ti].best_latency());
        let measuring = Instant::now();
        let results = measurer.measure(&states[ti].task.graph, &schedules);
        phases.measure_s += measuring.elapsed().as_secs_f64();
        for (cand, res) in proposals.into_iter().zip(results) {
            states[ti].record(cand, res.ok());
            spent += 1;
            if let Some(l) = network_latency(&states) {
                curve.push(CurvePoint {
                    trial: spent,
                    best_latency_s: l,
                    elapsed_s: start.elapsed().as_secs_f64(),
                });
            }
        }
        histories[ti].push(states[ti].best_latency());
        strategy.notify(&states[ti]);
        scheduler.notify(ti, &task_views(&states, &histories));
        let retraining = Instant::now();
        retrain(model, &states);
        phases.retrain_s += retraining.elapsed().as_secs_f64();
    }
    TuneResult {
        allocation: states.iter().map(|s| s.trials.len()).collect(),
        tasks: states,
        curve,
        trials: spent,
        wall_s: start.elapsed().as_secs_f64(),
        phases,
    }
}

/// The time to leave for `options.reserve_rounds` rounds, at the mean round's wall time so far.
fn reserve(elapsed: Duration, rounds: u32, options: &TuneOptions) -> Duration {
    if rounds == 0 {
        return Duration::ZERO;
    }
    let reserve = u32::try_from(options.reserve_rounds).unwrap_or(u32::MAX);
    (elapsed / rounds).saturating_mul(reserve)
}

/// What the task scheduler sees of every task.
fn task_views<S: SearchSpace>(
    states: &[TaskState<S>],
    histories: &[Vec<Option<f64>>],
) -> Vec<TaskView> {
    states
        .iter()
        .zip(histories)
        .map(|(s, h)| TaskView {
            weight: s.task.weight,
            flops: s.flops,
            history: h.clone(),
            trials: s.trials.len(),
            class: op_class(&s.task.graph),
        })
        .collect()
}

/// Up to `batch` of the task's default-like candidates.
fn seed_candidates<S: SearchSpace>(
    state: &TaskState<S>,
    batch: usize,
) -> Vec<Candidate<S::Params>> {
    state
        .seeds
        .iter()
        .filter_map(|p| state.candidate(p.clone()))
        .take(batch)
        .collect()
}

/// Weighted sum of every task's best latency, once every task has one.
fn network_latency<S: SearchSpace>(states: &[TaskState<S>]) -> Option<f64> {
    states
        .iter()
        .map(|s| s.best_latency().map(|l| l * s.task.weight))
        .sum::<Option<f64>>()
}

/// Trains the model on every successful record: throughput normalised by the task's best, so
/// tasks of different sizes share one scale; failed trials count as zero throughput.
fn retrain<S: SearchSpace>(model: &mut dyn CostModel, states: &[TaskState<S>]) {
    let mut xs = Vec::new();
    let mut ys = Vec::new();
    let mut groups = Vec::new();
    for (ti, s) in states.iter().enumerate() {
        let Some(best) = s.best_latency() else {
            continue;
        };
        for t in &s.trials {
            xs.push(t.candidate.features.clone());
            ys.push(t.latency_s.map_or(0.0, |l| best / l));
            groups.push(ti);
        }
    }
    if xs.len() >= 2 {
        // A model that cannot train keeps its previous state; the search goes on.
        let _ = model.train(&xs, &ys, &groups);
    }
}

/// A coarse op class for the scheduler's "similar tasks": the reduction structure.
fn op_class(g: &Graph) -> String {
    g.stages
        .iter()
        .filter_map(|s| {
            s.reduce
                .as_ref()
                .map(|r| format!("{}r{}", s.shape.len(), r.extents.len()))
        })
        .collect::<Vec<_>>()
        .join("+")
}

/// The best candidate of a task, if any trial succeeded.
pub fn best_candidate<S: SearchSpace>(
    state: &TaskState<S>,
) -> Option<(&Candidate<S::Params>, f64)> {
    state
        .best()
        .and_then(|t| t.latency_s.map(|l| (&t.candidate, l)))
}

/// The latency of the task's first default point ([`TaskState::seeds`]; on the GPU space, the
/// default GPU schedule), if it was measured and succeeded.
pub fn default_latency<S: SearchSpace>(state: &TaskState<S>) -> Option<f64> {
    let default = state.seeds.first()?;
    state
        .trials
        .iter()
        .find(|t| &t.candidate.params == default)
        .and_then(|t| t.latency_s)
}

/// Times `schedules` again side by side, `rounds` times, each round one batch in a rotated
/// order, and returns each one's median (`None` if it failed in every round). A search's
/// figures are each one timing taken minutes apart, with noise larger than the differences it
/// ranks; what a build ships is chosen on these instead.
pub fn retime_finalists(
    measurer: &mut dyn Measure,
    graph: &Graph,
    schedules: &[Schedule],
    rounds: usize,
) -> Vec<Option<f64>> {
    measurer.set_best(None);
    let mut runs: Vec<Runs> = schedules.iter().map(|_| Runs::default()).collect();
    for round in 0..rounds {
        time_round(measurer, graph, schedules, round, &mut runs);
    }
    runs.iter().map(Runs::median).collect()
}

/// One schedule's runs in a re-timing: its latency in each round (`None` where it failed)
/// and its last error.
#[derive(Clone, Debug, Default)]
pub struct Runs {
    /// Latency of each round, in seconds.
    pub latencies: Vec<Option<f64>>,
    /// The last error, if a round failed.
    pub error: Option<String>,
}

impl Runs {
    /// The median of the rounds that ran.
    pub fn median(&self) -> Option<f64> {
        let mut t: Vec<f64> = self.latencies.iter().flatten().copied().collect();
        t.sort_by(f64::total_cmp);
        (!t.is_empty()).then(|| t[t.len() / 2])
    }
}

/// Round `round` of a re-timing: `schedules` timed in one batch, the order rotated by the
/// round, each result added to its schedule's `runs`.
pub fn time_round(
    measurer: &mut dyn Measure,
    graph: &Graph,
    schedules: &[Schedule],
    round: usize,
    runs: &mut [Runs],
) {
    let n = schedules.len();
    if n == 0 {
        return;
    }
    let order: Vec<usize> = (0..n).map(|k| (k + round) % n).collect();
    let batch: Vec<Schedule> = order.iter().map(|&i| schedules[i].clone()).collect();
    let mut results = measurer.measure(graph, &batch).into_iter();
    for &i in &order {
        let r = results
            .next()
            .unwrap_or_else(|| Err("the measurer returned no result".into()));
        runs[i].latencies.push(r.as_ref().ok().copied());
        if let Err(e) = r {
            runs[i].error = Some(e);
        }
    }
}

/// The `n` fastest distinct schedules of a task's successful trials, fastest first.
pub fn finalists<S: SearchSpace>(state: &TaskState<S>, n: usize) -> Vec<Schedule> {
    let mut out: Vec<Schedule> = Vec::new();
    for t in state.fastest() {
        if out.len() >= n {
            break;
        }
        if !out.contains(&t.candidate.schedule) {
            out.push(t.candidate.schedule.clone());
        }
    }
    out
}
