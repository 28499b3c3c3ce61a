//! A task as the search sees it: its sketches, every measured trial, its best.

use crate::features;
pub use crate::space::cpu::Task;
use crate::space::cpu::{generate_sketches, Params, Sketch};
use harl_build::default_schedule::CpuTarget;
use harl_build::lower::lower;
use harl_build::rng::Rng;
use harl_build::schedule::Schedule;
use std::collections::HashSet;

/// A complete candidate: its parameters, the schedule they give, and its features.
#[derive(Clone, Debug)]
pub struct Candidate {
    /// Sketch parameters.
    pub params: Params,
    /// The schedule (validated: it lowers).
    pub schedule: Schedule,
    /// Features of the lowered program, for the cost model.
    pub features: Vec<f32>,
}

/// One measured trial.
#[derive(Clone, Debug)]
pub struct Trial {
    /// The candidate measured.
    pub candidate: Candidate,
    /// Median latency, or `None` if the trial failed.
    pub latency_s: Option<f64>,
}

/// What strategies see of a task: its space and its measured history.
pub struct TaskState {
    /// The task.
    pub task: Task,
    /// Its sketches (the space).
    pub sketches: Vec<Sketch>,
    /// Floating-point operations of one run.
    pub flops: f64,
    /// Measured trials, in order.
    pub trials: Vec<Trial>,
    /// The default schedule's counterpart in each sketch that has one
    /// ([`Sketch::default_params`]), distinct schedules only: the tuner measures them first.
    pub seeds: Vec<Params>,
    measured: HashSet<Params>,
}

impl TaskState {
    /// The state of a task before any trial.
    pub fn new(task: Task, target: &CpuTarget) -> Self {
        let sketches = generate_sketches(&task.graph, target);
        let flops = task.graph.flops();
        let mut seeds = Vec::new();
        let mut seen = HashSet::new();
        for (i, sketch) in sketches.iter().enumerate() {
            if let Some(p) = sketch.default_params(i, target) {
                if sketch.to_schedule(&p).is_ok_and(|s| seen.insert(s)) {
                    seeds.push(p);
                }
            }
        }
        TaskState {
            task,
            sketches,
            flops,
            trials: Vec::new(),
            seeds,
            measured: HashSet::new(),
        }
    }

    /// Builds the candidate for `params`, or `None` if they do not give a valid schedule.
    pub fn candidate(&self, params: Params) -> Option<Candidate> {
        let sketch = self.sketches.get(params.sketch)?;
        let schedule = sketch.to_schedule(&params).ok()?;
        let program = lower(&self.task.graph, &schedule).ok()?;
        Some(Candidate {
            features: features::extract(&program),
            params,
            schedule,
        })
    }

    /// A random valid candidate (`None` only if the task has no sketch).
    pub fn sample(&self, rng: &mut Rng) -> Option<Candidate> {
        for _ in 0..16 {
            let index = rng.below(self.sketches.len());
            let params = self.sketches.get(index)?.sample(index, rng);
            if let Some(c) = self.candidate(params) {
                return Some(c);
            }
        }
        None
    }

    /// A random valid mutation of `params`.
    pub fn mutate(&self, params: &Params, rng: &mut Rng) -> Option<Candidate> {
        let sketch = self.sketches.get(params.sketch)?;
        self.candidate(sketch.mutate(params, rng))
    }

    /// Whether these parameters were measured already.
    pub fn is_measured(&self, params: &Params) -> bool {
        self.measured.contains(params)
    }

    /// Records a measured trial.
    pub fn record(&mut self, candidate: Candidate, latency_s: Option<f64>) {
        self.measured.insert(candidate.params.clone());
        self.trials.push(Trial {
            candidate,
            latency_s,
        });
    }

    /// The fastest successful trial.
    pub fn best(&self) -> Option<&Trial> {
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

    /// The `n` fastest measured trials' parameters.
    pub fn top_measured(&self, n: usize) -> Vec<Params> {
        let mut ok: Vec<&Trial> = self
            .trials
            .iter()
            .filter(|t| t.latency_s.is_some())
            .collect();
        ok.sort_by(|a, b| {
            a.latency_s
                .partial_cmp(&b.latency_s)
                .unwrap_or(std::cmp::Ordering::Equal)
        });
        ok.into_iter()
            .take(n)
            .map(|t| t.candidate.params.clone())
            .collect()
    }
}
