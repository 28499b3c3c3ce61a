//! Search strategies behind one trait: random, Ansor-style evolutionary search and AutoTVM-style
//! simulated annealing. A strategy proposes the next batch of unmeasured candidates of a task;
//! it sees the space only through [`Sketch`] and scores candidates only through the cost model.

use harl_build::default_schedule::CpuTarget;
use harl_build::lower::lower;
use harl_build::schedule::Schedule;
use crate::cost_model::CostModel;
use crate::features;
use harl_build::rng::Rng;
use crate::sketch::{generate_sketches, Params, Sketch, Task};
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

/// A search strategy: proposes the next batch of unmeasured candidates of a task.
pub trait SearchStrategy {
    /// Its name (`HARL_STRATEGY`).
    fn name(&self) -> &'static str;
    /// Up to `batch` distinct, unmeasured, valid candidates.
    fn propose(
        &mut self,
        state: &TaskState,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate>;
}

/// The names [`strategy_by_name`] accepts (besides their aliases and `harl-elite<P>`), for
/// error messages.
pub const STRATEGY_NAMES: &str = "harl, ansor, autotvm, random";

/// The strategy called `name`: `harl` (hierarchical RL), `ansor` (evolutionary), `autotvm`
/// (annealing) or `random`. `harl-elite<P>` is HARL with `P` percent of its tracks started
/// from the best measured schedules (an ablation; `harl` is `harl-elite25`). `seed` seeds what
/// a strategy initialises on its own (HARL's networks); every other random decision comes from
/// the tuner's generator. `harl-adaptive` is HARL whose elite share follows the measured gains
/// of each track start (an experiment, see [`crate::track_start`]).
pub fn strategy_by_name(name: &str, seed: u64) -> Option<Box<dyn SearchStrategy>> {
    let harl =
        |adjust: &dyn Fn(&mut crate::harl::HarlConfig)| -> Option<Box<dyn SearchStrategy>> {
            let mut config = crate::harl::HarlConfig::default();
            config.ppo.seed = seed;
            adjust(&mut config);
            Some(Box::new(crate::harl::Harl::new(config)))
        };
    if name == "harl-adaptive" {
        return harl(&|c| c.adaptive_start = true);
    }
    if let Some(pct) = name.strip_prefix("harl-elite") {
        return match pct.parse::<u32>() {
            Ok(p) if p <= 100 => harl(&|c| c.elite_fraction = f64::from(p) / 100.0),
            _ => None,
        };
    }
    match name {
        "harl" => harl(&|_| {}),
        "random" => Some(Box::new(RandomSearch)),
        "ansor" | "evolutionary" => Some(Box::new(Evolutionary::default())),
        "autotvm" | "annealing" => Some(Box::new(Annealing::default())),
        _ => None,
    }
}

/// Adds `c` to `out` unless measured or already chosen.
fn push_new(state: &TaskState, out: &mut Vec<Candidate>, seen: &mut HashSet<Params>, c: Candidate) {
    if !state.is_measured(&c.params) && seen.insert(c.params.clone()) {
        out.push(c);
    }
}

/// Uniform samples of the space, no model.
pub struct RandomSearch;

impl SearchStrategy for RandomSearch {
    fn name(&self) -> &'static str {
        "random"
    }
    fn propose(
        &mut self,
        state: &TaskState,
        _: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate> {
        epsilon_greedy(state, Vec::new(), batch, 1.0, rng)
    }
}

/// Up to `n_best` of the best measured schedules, then random samples, `size` in all.
fn seeded_population(
    state: &TaskState,
    n_best: usize,
    size: usize,
    rng: &mut Rng,
) -> Vec<Candidate> {
    let mut pop: Vec<Candidate> = state
        .top_measured(n_best)
        .into_iter()
        .filter_map(|p| state.candidate(p))
        .collect();
    while pop.len() < size {
        match state.sample(rng) {
            Some(c) => pop.push(c),
            None => break,
        }
    }
    pop
}

/// Scores candidates with the model; an untrained or failing model scores all alike.
fn scores(model: &dyn CostModel, cands: &[Candidate]) -> Vec<f64> {
    let feats: Vec<Vec<f32>> = cands.iter().map(|c| c.features.clone()).collect();
    match model.predict(&feats) {
        Ok(s) if s.len() == cands.len() => s
            .into_iter()
            .map(|x| if x.is_finite() { x } else { f64::MIN })
            .collect(),
        _ => vec![0.0; cands.len()],
    }
}

/// Picks `batch` of `pool` (sorted best first) with epsilon-greedy random picks, as Ansor does
/// (`eps` = 1 is pure random sampling).
pub(crate) fn epsilon_greedy(
    state: &TaskState,
    pool: Vec<Candidate>,
    batch: usize,
    eps: f64,
    rng: &mut Rng,
) -> Vec<Candidate> {
    let n_random = ((batch as f64) * eps).round() as usize;
    let mut out = Vec::new();
    let mut seen = HashSet::new();
    for c in pool {
        if out.len() + n_random >= batch {
            break;
        }
        push_new(state, &mut out, &mut seen, c);
    }
    for _ in 0..batch * 8 {
        if out.len() >= batch {
            break;
        }
        if let Some(c) = state.sample(rng) {
            push_new(state, &mut out, &mut seen, c);
        }
    }
    out
}

/// Ansor-style evolutionary search: a population from random samples and the best measured
/// schedules, evolved by mutation with fitness-proportional selection under the cost model,
/// then the best predicted (plus an epsilon of random ones) are measured.
pub struct Evolutionary {
    /// Population size.
    pub population: usize,
    /// Generations per round.
    pub generations: usize,
    /// Fraction of the initial population taken from the best measured schedules.
    pub elite_fraction: f64,
    /// Fraction of each batch chosen at random (exploration).
    pub eps_greedy: f64,
}

impl Default for Evolutionary {
    fn default() -> Self {
        Evolutionary {
            population: 256,
            generations: 4,
            elite_fraction: 0.25,
            eps_greedy: 0.05,
        }
    }
}

impl SearchStrategy for Evolutionary {
    fn name(&self) -> &'static str {
        "ansor"
    }

    fn propose(
        &mut self,
        state: &TaskState,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate> {
        let n_elite = ((self.population as f64) * self.elite_fraction) as usize;
        let mut pop = seeded_population(state, n_elite, self.population, rng);
        // Every candidate seen, with its score; the best unmeasured ones are proposed.
        let mut visited: Vec<(f64, Candidate)> = Vec::new();
        let mut seen = HashSet::new();
        for _ in 0..self.generations {
            let s = scores(model, &pop);
            for (score, c) in s.iter().zip(&pop) {
                if seen.insert(c.params.clone()) {
                    visited.push((*score, c.clone()));
                }
            }
            let weights = selection_weights(&s);
            let mut next = Vec::with_capacity(self.population);
            while next.len() < self.population && !pop.is_empty() {
                let parent = &pop[roulette(&weights, rng)];
                match state.mutate(&parent.params, rng) {
                    Some(child) => next.push(child),
                    None => next.push(parent.clone()),
                }
            }
            pop = next;
        }
        let s = scores(model, &pop);
        for (score, c) in s.into_iter().zip(pop) {
            if seen.insert(c.params.clone()) {
                visited.push((score, c));
            }
        }
        visited.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
        let pool = visited.into_iter().map(|(_, c)| c).collect();
        epsilon_greedy(state, pool, batch, self.eps_greedy, rng)
    }
}

/// Selection weights from scores: shifted to be positive, rank-stable.
fn selection_weights(scores: &[f64]) -> Vec<f64> {
    let lo = scores.iter().cloned().fold(f64::INFINITY, f64::min);
    let hi = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let span = (hi - lo).max(1e-12);
    scores.iter().map(|s| 0.05 + (s - lo) / span).collect()
}

/// Index drawn with probability proportional to `weights`.
fn roulette(weights: &[f64], rng: &mut Rng) -> usize {
    let total: f64 = weights.iter().sum();
    let mut x = rng.unit() * total;
    for (i, w) in weights.iter().enumerate() {
        if x < *w {
            return i;
        }
        x -= w;
    }
    weights.len().saturating_sub(1)
}

/// AutoTVM-style simulated annealing: parallel chains walk the space by mutation, accepting a
/// worse predicted score with a probability that falls with the temperature; the best
/// predicted candidates seen are measured.
pub struct Annealing {
    /// Parallel chains.
    pub chains: usize,
    /// Steps per chain per round.
    pub steps: usize,
    /// Initial temperature, on the scale of normalised scores.
    pub temperature: f64,
    /// Fraction of each batch chosen at random.
    pub eps_greedy: f64,
}

impl Default for Annealing {
    fn default() -> Self {
        Annealing {
            chains: 64,
            steps: 12,
            temperature: 1.0,
            eps_greedy: 0.05,
        }
    }
}

impl SearchStrategy for Annealing {
    fn name(&self) -> &'static str {
        "autotvm"
    }

    fn propose(
        &mut self,
        state: &TaskState,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate> {
        let mut chains = seeded_population(state, self.chains / 2, self.chains, rng);
        let mut current = scores(model, &chains);
        let mut visited: Vec<(f64, Candidate)> = Vec::new();
        let mut seen = HashSet::new();
        for (s, c) in current.iter().zip(&chains) {
            if seen.insert(c.params.clone()) {
                visited.push((*s, c.clone()));
            }
        }
        for step in 0..self.steps {
            let t = self.temperature * (1.0 - step as f64 / self.steps as f64).max(0.05);
            let proposals: Vec<Candidate> = chains
                .iter()
                .map(|c| state.mutate(&c.params, rng).unwrap_or_else(|| c.clone()))
                .collect();
            let new_scores = scores(model, &proposals);
            let span = normaliser(&current, &new_scores);
            for (i, (p, s)) in proposals.into_iter().zip(new_scores).enumerate() {
                if seen.insert(p.params.clone()) {
                    visited.push((s, p.clone()));
                }
                let delta = (s - current[i]) / span;
                if delta >= 0.0 || rng.unit() < (delta / t).exp() {
                    chains[i] = p;
                    current[i] = s;
                }
            }
        }
        visited.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
        let pool = visited.into_iter().map(|(_, c)| c).collect();
        epsilon_greedy(state, pool, batch, self.eps_greedy, rng)
    }
}

fn normaliser(a: &[f64], b: &[f64]) -> f64 {
    let all = a.iter().chain(b);
    let lo = all.clone().cloned().fold(f64::INFINITY, f64::min);
    let hi = all.cloned().fold(f64::NEG_INFINITY, f64::max);
    (hi - lo).max(1e-12)
}
