//! A task as the search sees it: its space, every measured trial, its best.

use crate::features;
pub use crate::space::cpu::Task;
use crate::space::cpu::{CpuSpace, Params};
use crate::space::SearchSpace;
use harl_build::default_schedule::CpuTarget;
use harl_build::lower::lower;
use harl_build::rng::Rng;
use harl_build::schedule::Schedule;
use std::collections::HashSet;

/// A complete candidate: its parameters, the schedule they give, and its features.
#[derive(Clone, Debug)]
pub struct Candidate<P = Params> {
    /// The space's parameters.
    pub params: P,
    /// The schedule (validated: it lowers).
    pub schedule: Schedule,
    /// Features of the lowered program, for the cost model.
    pub features: Vec<f32>,
}

/// One measured trial.
#[derive(Clone, Debug)]
pub struct Trial<P = Params> {
    /// The candidate measured.
    pub candidate: Candidate<P>,
    /// Median latency, or `None` if the trial failed.
    pub latency_s: Option<f64>,
}

/// What strategies see of a task: its space and its measured history.
pub struct TaskState<S: SearchSpace = CpuSpace> {
    /// The task.
    pub task: Task,
    /// Its search space.
    pub space: S,
    /// Floating-point operations of one run.
    pub flops: f64,
    /// Measured trials, in order.
    pub trials: Vec<Trial<S::Params>>,
    /// The space's default-like points ([`SearchSpace::defaults`]) that give distinct valid
    /// schedules: the tuner measures them first.
    pub seeds: Vec<S::Params>,
    measured: HashSet<S::Params>,
}

impl TaskState<CpuSpace> {
    /// The CPU state of a task before any trial: its sketches for `target`.
    pub fn new(task: Task, target: &CpuTarget) -> Self {
        let space = CpuSpace::new(&task.graph, target);
        TaskState::with_space(task, space)
    }
}

impl<S: SearchSpace> TaskState<S> {
    /// The state of a task searched in `space` (made from the task's graph), before any trial.
    pub fn with_space(task: Task, space: S) -> Self {
        let flops = task.graph.flops();
        let mut seeds = Vec::new();
        let mut seen = HashSet::new();
        for p in space.defaults() {
            if space.to_schedule(&p).is_some_and(|s| seen.insert(s)) {
                seeds.push(p);
            }
        }
        TaskState {
            task,
            space,
            flops,
            trials: Vec::new(),
            seeds,
            measured: HashSet::new(),
        }
    }

    /// Builds the candidate for `params`, or `None` if they do not give a valid schedule.
    pub fn candidate(&self, params: S::Params) -> Option<Candidate<S::Params>> {
        let schedule = self.space.to_schedule(&params)?;
        let program = lower(&self.task.graph, &schedule).ok()?;
        Some(Candidate {
            features: features::extract(&program),
            params,
            schedule,
        })
    }

    /// A random valid candidate (`None` only if the task has no sketch).
    pub fn sample(&self, rng: &mut Rng) -> Option<Candidate<S::Params>> {
        let n = self.space.sketch_count();
        if n == 0 {
            return None;
        }
        for _ in 0..16 {
            let index = rng.below(n);
            let params = self.space.sample(index, rng);
            if let Some(c) = self.candidate(params) {
                return Some(c);
            }
        }
        None
    }

    /// A random valid mutation of `params`.
    pub fn mutate(&self, params: &S::Params, rng: &mut Rng) -> Option<Candidate<S::Params>> {
        self.candidate(self.space.mutate(params, rng))
    }

    /// Whether these parameters were measured already.
    pub fn is_measured(&self, params: &S::Params) -> bool {
        self.measured.contains(params)
    }

    /// Records a measured trial.
    pub fn record(&mut self, candidate: Candidate<S::Params>, latency_s: Option<f64>) {
        self.measured.insert(candidate.params.clone());
        self.trials.push(Trial {
            candidate,
            latency_s,
        });
    }

    /// The fastest successful trial.
    pub fn best(&self) -> Option<&Trial<S::Params>> {
        self.trials
            .iter()
            .filter(|t| t.latency_s.is_some())
            .min_by(|a, b| {
                a.latency_s
                    .partial_cmp(&b.latency_s)
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
    }

    /// Best latency so far.
    pub fn best_latency(&self) -> Option<f64> {
        self.best().and_then(|t| t.latency_s)
    }

    /// The successful trials, fastest first.
    pub fn fastest(&self) -> Vec<&Trial<S::Params>> {
        let mut ok: Vec<&Trial<S::Params>> = self
            .trials
            .iter()
            .filter(|t| t.latency_s.is_some())
            .collect();
        ok.sort_by(|a, b| {
            a.latency_s
                .partial_cmp(&b.latency_s)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        ok
    }

    /// The `n` fastest measured trials' parameters.
    pub fn top_measured(&self, n: usize) -> Vec<S::Params> {
        self.fastest()
            .into_iter()
            .take(n)
            .map(|t| t.candidate.params.clone())
            .collect()
    }
}
