//! HARL's search for one task (the paper's sections 4-5, Algorithm 1), as a [`SearchStrategy`].
//!
//! Each round: the sketch bandit (sliding-window UCB, window 256, c = 0.25, reward the best
//! normalised performance in the window) picks a sketch; an episode of `tracks` schedule tracks
//! starts from random fillings of it; at every step the PPO actor picks one action per
//! sub-space (a tile move, compute-at ±1, parallel ±1, unroll ±1, vector ±1, each with a
//! no-op) for every live track; the reward is the relative change of the cost model's score;
//! the advantage `r + γ V(s') - V(s)` drives adaptive stopping (window λ = 20, ratio ρ = 0.5),
//! and the episode ends when fewer than `min_tracks` tracks remain. Then the agent trains on
//! the episode's transitions and the top-K visited schedules by predicted score are proposed
//! for measurement. The agent of each (task, sketch) keeps its weights across rounds.
//!
//! Deviations, stated: a quarter of an episode's tracks (`elite_fraction`) start from the sketch's best measured
//! schedules rather than random fillings (without them HARL lost to Ansor's evolutionary search,
//! which keeps its best in the population, on conv1d at 200 trials); with `adaptive_start`
//! (strategy `harl-adaptive`) the measured gains of each start set that share
//! ([`crate::strategy::harl::track_start`]). XGBoost rank scores can be zero or negative, so the relative change is
//! taken against `max(|C(s)|, σ)` with σ the spread of the episode's initial scores, and clipped
//! to [-1, 1].

pub mod gpu;
pub mod ppo;
pub mod stopping;
pub mod track_start;

use crate::bandit::{Aggregate, SlidingWindowUcb};
use crate::cost_model::CostModel;
use crate::space::cpu::{Params, Sketch};
use crate::strategy::harl::ppo::{ActionSpace, Agent, PpoConfig, Transition};
use crate::strategy::harl::stopping::AdaptiveStopping;
use crate::strategy::harl::track_start::{Origin, TrackStartCredit};
use crate::strategy::{epsilon_greedy, Candidate, SearchStrategy, TaskState};
use harl_build::rng::Rng;
use std::collections::{HashMap, HashSet};

/// HARL's parameters (defaults: the paper's section 6.2 where it gives them).
#[derive(Clone, Debug)]
pub struct HarlConfig {
    /// Schedule tracks per episode (I).
    pub tracks: usize,
    /// Longest episode, in steps.
    pub max_steps: usize,
    /// The episode ends when fewer tracks than this remain.
    pub min_tracks: usize,
    /// Fraction of an episode's tracks that start from the sketch's best measured schedules
    /// (the rest start from random fillings).
    pub elite_fraction: f64,
    /// Let the measured gains of each track start set the elite share, starting from
    /// `elite_fraction` ([`crate::strategy::harl::track_start`]); off by default (not yet shown to win).
    pub adaptive_start: bool,
    /// Adaptive stopping window (λ).
    pub stop_window: usize,
    /// Adaptive stopping elimination ratio (ρ).
    pub stop_ratio: f64,
    /// Sketch bandit window.
    pub sketch_window: usize,
    /// Sketch bandit exploration constant (c).
    pub sketch_c: f64,
    /// Fraction of each batch measured at random, as the baselines do (0 disables).
    pub eps_greedy: f64,
    /// The parameter agent's PPO settings.
    pub ppo: PpoConfig,
}

impl Default for HarlConfig {
    fn default() -> Self {
        HarlConfig {
            tracks: 32,
            max_steps: 60,
            min_tracks: 4,
            elite_fraction: 0.25,
            adaptive_start: false,
            stop_window: 20,
            stop_ratio: 0.5,
            sketch_window: 256,
            sketch_c: 0.25,
            eps_greedy: 0.05,
            ppo: PpoConfig::default(),
        }
    }
}

/// How a sketch's actions map to the agent's heads, and its state encoding.
struct Layout {
    /// (axis, from level, to level) of each tile-move action (action `i + 1`).
    tile_moves: Vec<(usize, usize, usize)>,
    /// Levels per tiled axis and the axis extent.
    axes: Vec<(usize, usize)>,
    compute_at: usize,
    parallel: usize,
    unroll: usize,
    vector: usize,
}

impl Layout {
    fn new(sketch: &Sketch) -> Layout {
        let k = sketch.knobs();
        let mut tile_moves = Vec::new();
        for (a, &(_, levels)) in k.tiled_axes.iter().enumerate() {
            for from in 0..levels {
                for to in 0..levels {
                    if from != to {
                        tile_moves.push((a, from, to));
                    }
                }
            }
        }
        Layout {
            tile_moves,
            axes: k.tiled_axes.iter().map(|&(e, l)| (e, l)).collect(),
            compute_at: k.compute_at_choices,
            parallel: k.parallel_max,
            unroll: k.unroll_choices,
            vector: k.vector_choices,
        }
    }

    fn space(&self) -> ActionSpace {
        ActionSpace {
            heads: vec![1 + self.tile_moves.len(), 3, 3, 3, 3],
        }
    }

    fn state_dim(&self) -> usize {
        self.axes.iter().map(|&(_, l)| l).sum::<usize>() + 5
    }

    /// Normalised features of a parameter set and its score.
    fn encode(&self, p: &Params, score: f64) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.state_dim());
        for (a, &(extent, levels)) in self.axes.iter().enumerate() {
            let inner = p.tiles.get(a).cloned().unwrap_or_default();
            let prod: usize = inner.iter().product::<usize>().max(1);
            let outer = extent.div_ceil(prod);
            let denom = (extent as f32).log2().max(1.0);
            v.push((outer as f32).log2() / denom);
            for l in 0..levels.saturating_sub(1) {
                v.push((inner.get(l).copied().unwrap_or(1) as f32).log2() / denom);
            }
        }
        let frac = |x: usize, n: usize| {
            if n > 1 {
                x as f32 / (n - 1) as f32
            } else {
                0.0
            }
        };
        v.push(frac(p.compute_at, self.compute_at));
        v.push(if self.parallel > 0 {
            p.parallel as f32 / self.parallel as f32
        } else {
            0.0
        });
        v.push(frac(p.unroll, self.unroll));
        v.push(frac(p.vector, self.vector));
        v.push(score.tanh() as f32);
        v
    }

    /// Applies one action per head, each only if legal (an illegal move is a no-op).
    fn apply(&self, sketch: &Sketch, p: &Params, action: &[usize]) -> Params {
        let delta = |a: usize| match a {
            1 => -1,
            2 => 1,
            _ => 0,
        };
        let mut q = p.clone();
        if let Some(&(axis, from, to)) = action
            .first()
            .and_then(|&a| a.checked_sub(1))
            .and_then(|i| self.tile_moves.get(i))
        {
            if let Some(n) = sketch.tile_move(&q, axis, from, to) {
                q = n;
            }
        }
        type Step = fn(&Sketch, &Params, i32) -> Option<Params>;
        let steps: [Step; 4] = [
            Sketch::step_compute_at,
            Sketch::step_parallel,
            Sketch::step_unroll,
            Sketch::step_vector,
        ];
        for (h, step) in steps.iter().enumerate() {
            let d = delta(action.get(h + 1).copied().unwrap_or(0));
            if d != 0 {
                if let Some(n) = step(sketch, &q, d) {
                    q = n;
                }
            }
        }
        q
    }
}

struct SketchAgent {
    agent: Agent,
    layout: Layout,
}

struct TaskMemory {
    bandit: SlidingWindowUcb,
    agents: HashMap<usize, SketchAgent>,
    /// Trials of the task already fed to the bandit.
    fed: usize,
    /// The track start of each schedule proposed for measurement (adaptive start only).
    origins: HashMap<Params, Origin>,
    /// Measured gains per track start (adaptive start only).
    credit: TrackStartCredit,
    /// Trials already credited, and the task's best latency after them.
    credited: usize,
    credited_best: f64,
}

/// HARL's hierarchical search (one strategy among the others).
pub struct Harl {
    config: HarlConfig,
    tasks: HashMap<String, TaskMemory>,
}

impl Harl {
    /// A HARL search with these parameters.
    pub fn new(config: HarlConfig) -> Self {
        Harl {
            config,
            tasks: HashMap::new(),
        }
    }
}

impl Default for Harl {
    fn default() -> Self {
        Harl::new(HarlConfig::default())
    }
}

struct Track {
    cand: Candidate,
    origin: Origin,
    score: f64,
    transitions: Vec<Transition>,
}

impl HasTransitions for Track {
    fn transitions(&mut self) -> &mut Vec<Transition> {
        &mut self.transitions
    }
}

/// A schedule track that records its agent transitions (the CPU and GPU searches' tracks).
pub(crate) trait HasTransitions {
    /// The track's transitions so far.
    fn transitions(&mut self) -> &mut Vec<Transition>;
}

/// An agent's action with its log-probability and value estimate, as `act_batch` returns it.
pub(crate) type Act = (Vec<usize>, f32, f32);

/// The bookkeeping of one episode step (Algorithm 1's inner loop): each live track records its
/// transition, its advantage `r + γ V(s') - V(s)` feeds adaptive stopping, and a stopped
/// track's last transition ends its trajectory. Returns the tracks still alive with their next
/// actions.
#[allow(clippy::too_many_arguments)]
pub(crate) fn record_step<T: HasTransitions>(
    tracks: &mut [T],
    alive: &[usize],
    pending: &[Act],
    following: &[Act],
    before: &[Vec<f32>],
    rewards: &[f32],
    gamma: f32,
    stopping: &mut AdaptiveStopping,
) -> (Vec<usize>, Vec<Act>) {
    for (k, &i) in alive.iter().enumerate() {
        let (action, log_prob, value) = pending[k].clone();
        let advantage = rewards[k] + gamma * following[k].2 - value;
        stopping.observe(i, f64::from(advantage));
        tracks[i].transitions().push(Transition {
            state: before[k].clone(),
            action,
            log_prob,
            value,
            reward: rewards[k],
            done: false,
        });
    }
    let stopped: HashSet<usize> = stopping.eliminate().into_iter().collect();
    let mut keep = Vec::new();
    let mut keep_pending = Vec::new();
    for (k, &i) in alive.iter().enumerate() {
        if stopped.contains(&i) {
            if let Some(last) = tracks[i].transitions().last_mut() {
                last.done = true;
            }
        } else {
            keep.push(i);
            keep_pending.push(following[k].clone());
        }
    }
    (keep, keep_pending)
}

/// Ends an episode: the tracks still alive end their trajectories; the non-empty ones.
pub(crate) fn trajectories<T: HasTransitions>(
    alive: &[usize],
    mut tracks: Vec<T>,
) -> Vec<Vec<Transition>> {
    for &i in alive {
        if let Some(last) = tracks[i].transitions().last_mut() {
            last.done = true;
        }
    }
    tracks
        .iter_mut()
        .map(|t| std::mem::take(t.transitions()))
        .filter(|t| !t.is_empty())
        .collect()
}

impl Harl {
    /// The task's memory (its sketch bandit, agents, credit), made on first use.
    fn memory(&mut self, state: &TaskState) -> &mut TaskMemory {
        let cfg = &self.config;
        self.tasks
            .entry(state.task.graph.workload_key())
            .or_insert_with(|| TaskMemory {
                bandit: SlidingWindowUcb::new(
                    state.sketches.len(),
                    cfg.sketch_window,
                    cfg.sketch_c,
                    Aggregate::Mean,
                ),
                agents: HashMap::new(),
                fed: 0,
                origins: HashMap::new(),
                credit: TrackStartCredit::new(cfg.sketch_window, 8, (0.125, 0.75)),
                credited: 0,
                credited_best: f64::INFINITY,
            })
    }
}

impl SearchStrategy for Harl {
    fn name(&self) -> &'static str {
        "harl"
    }

    /// The sketch bandit's rewards and, with `adaptive_start`, the track starts' credit, from
    /// the trials measured since the last call.
    fn notify(&mut self, state: &TaskState) {
        if state.sketches.is_empty() {
            return;
        }
        let adaptive = self.config.adaptive_start;
        let mem = self.memory(state);
        feed_bandit(mem, state);
        if adaptive {
            credit_starts(mem, state);
        }
    }

    fn propose(
        &mut self,
        state: &TaskState,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate> {
        if state.sketches.is_empty() {
            return Vec::new();
        }
        let cfg = self.config.clone();
        let mem = self.memory(state);
        let elite_share = if cfg.adaptive_start {
            mem.credit.elite_share(cfg.elite_fraction)
        } else {
            cfg.elite_fraction
        };
        let u = mem.bandit.select(rng).min(state.sketches.len() - 1);
        let sketch = &state.sketches[u];
        let sa = mem.agents.entry(u).or_insert_with(|| {
            let layout = Layout::new(sketch);
            let ppo = PpoConfig {
                seed: cfg.ppo.seed ^ (u as u64).wrapping_mul(0x9e37_79b9),
                ..cfg.ppo.clone()
            };
            SketchAgent {
                agent: Agent::new(layout.state_dim(), layout.space(), ppo),
                layout,
            }
        });
        let mut visited: Vec<(f64, Candidate, Origin)> = Vec::new();
        let mut seen: HashSet<Params> = HashSet::new();
        // Phase 1: an episode of parameter modifications.
        let mut tracks: Vec<Track> = Vec::new();
        // Some tracks (a quarter by default) start from the sketch's best measured schedules (the
        // rest from random fillings, as the paper's): without them every episode restarts from
        // scratch.
        let n_elite = ((cfg.tracks as f64) * elite_share.clamp(0.0, 1.0)) as usize;
        let elite = state
            .top_measured(cfg.tracks)
            .into_iter()
            .filter(|p| p.sketch == u)
            .take(n_elite)
            .filter_map(|p| state.candidate(p));
        for c in elite {
            tracks.push(Track {
                cand: c,
                origin: Origin::Elite,
                score: 0.0,
                transitions: Vec::new(),
            });
        }
        for _ in 0..cfg.tracks * 4 {
            if tracks.len() >= cfg.tracks {
                break;
            }
            let p = sketch.sample(u, rng);
            if let Some(c) = state.candidate(p) {
                tracks.push(Track {
                    cand: c,
                    origin: Origin::Random,
                    score: 0.0,
                    transitions: Vec::new(),
                });
            }
        }
        if tracks.is_empty() {
            return Vec::new();
        }
        let initial = predict(model, tracks.iter().map(|t| &t.cand));
        let scale = spread(&initial).max(1e-6);
        for (t, s) in tracks.iter_mut().zip(&initial) {
            t.score = *s;
            if seen.insert(t.cand.params.clone()) {
                visited.push((*s, t.cand.clone(), t.origin));
            }
        }
        let mut stopping = AdaptiveStopping::new(
            cfg.stop_window,
            cfg.stop_ratio,
            cfg.min_tracks.min(tracks.len()),
            tracks.len(),
        );
        let encode = |t: &Track| sa.layout.encode(&t.cand.params, t.score / scale);
        let mut alive: Vec<usize> = (0..tracks.len()).collect();
        let mut pending = sa.agent.act_batch(
            &alive
                .iter()
                .map(|&i| encode(&tracks[i]))
                .collect::<Vec<_>>(),
            rng,
        );
        for _ in 0..cfg.max_steps {
            if alive.is_empty() || stopping.episode_done() {
                break;
            }
            let before: Vec<Vec<f32>> = alive.iter().map(|&i| encode(&tracks[i])).collect();
            let next: Vec<Candidate> = alive
                .iter()
                .zip(&pending)
                .map(|(&i, (action, _, _))| {
                    let q = sa.layout.apply(sketch, &tracks[i].cand.params, action);
                    state.candidate(q).unwrap_or_else(|| tracks[i].cand.clone())
                })
                .collect();
            let scores = predict(model, next.iter());
            let mut rewards = Vec::with_capacity(alive.len());
            for ((&i, c), s) in alive.iter().zip(next).zip(&scores) {
                rewards.push(relative_reward(tracks[i].score, *s, scale));
                tracks[i].cand = c;
                tracks[i].score = *s;
                if seen.insert(tracks[i].cand.params.clone()) {
                    visited.push((*s, tracks[i].cand.clone(), tracks[i].origin));
                }
            }
            let after: Vec<Vec<f32>> = alive.iter().map(|&i| encode(&tracks[i])).collect();
            let following = sa.agent.act_batch(&after, rng);
            (alive, pending) = record_step(
                &mut tracks,
                &alive,
                &pending,
                &following,
                &before,
                &rewards,
                cfg.ppo.gamma as f32,
                &mut stopping,
            );
        }
        let trajectories = trajectories(&alive, tracks);
        if !trajectories.is_empty() {
            sa.agent.train(&trajectories);
        }
        // Phase 2: the top-K visited schedules by predicted score, not measured before.
        visited.sort_by(|a, b| b.0.partial_cmp(&a.0).unwrap_or(std::cmp::Ordering::Equal));
        // Only the adaptive start needs each proposal's origin; the epsilon-greedy random
        // picks come from no track and are not credited.
        let origin_of: HashMap<Params, Origin> = if cfg.adaptive_start {
            visited
                .iter()
                .map(|(_, c, o)| (c.params.clone(), *o))
                .collect()
        } else {
            HashMap::new()
        };
        let pool = visited.into_iter().map(|(_, c, _)| c).collect();
        let proposed = epsilon_greedy(state, pool, batch, cfg.eps_greedy, rng);
        for c in &proposed {
            if let Some(o) = origin_of.get(&c.params) {
                mem.origins.insert(c.params.clone(), *o);
            }
        }
        proposed
    }
}

/// Feeds the bandit every trial measured since the last round. The paper's reward for a
/// sketch is its normalised maximal performance until that step, averaged over the window:
/// here the task's best latency over the best latency the sketch has reached so far (1 = the
/// sketch holds the task's best; 0 while it has no successful trial).
fn feed_bandit(mem: &mut TaskMemory, state: &TaskState) {
    let Some(task_best) = state.best_latency() else {
        for t in &state.trials[mem.fed.min(state.trials.len())..] {
            mem.bandit.update(t.candidate.params.sketch, 0.0);
        }
        mem.fed = state.trials.len();
        return;
    };
    let mut sketch_best: HashMap<usize, f64> = HashMap::new();
    for (i, t) in state.trials.iter().enumerate() {
        let arm = t.candidate.params.sketch;
        if let Some(l) = t.latency_s {
            let b = sketch_best.entry(arm).or_insert(f64::INFINITY);
            *b = b.min(l);
        }
        if i >= mem.fed {
            let reward = sketch_best
                .get(&arm)
                .map_or(0.0, |b| (task_best / b).min(1.0));
            mem.bandit.update(arm, reward);
        }
    }
    mem.fed = state.trials.len();
}

/// Credits every trial measured since the last round to its track's start: its gain is
/// `ln(best before it / its latency)`, 0 when it was slower (or the first success).
fn credit_starts(mem: &mut TaskMemory, state: &TaskState) {
    for t in &state.trials[mem.credited.min(state.trials.len())..] {
        let Some(latency) = t.latency_s else {
            continue;
        };
        let gain = if mem.credited_best.is_finite() {
            (mem.credited_best / latency).ln()
        } else {
            0.0
        };
        if let Some(origin) = mem.origins.remove(&t.candidate.params) {
            mem.credit.observe(origin, gain);
        }
        mem.credited_best = mem.credited_best.min(latency);
    }
    mem.credited = state.trials.len();
}

fn predict<'a>(model: &dyn CostModel, cands: impl Iterator<Item = &'a Candidate>) -> Vec<f64> {
    let feats: Vec<Vec<f32>> = cands.map(|c| c.features.clone()).collect();
    match model.predict(&feats) {
        Ok(s) if s.len() == feats.len() => s
            .into_iter()
            .map(|x| if x.is_finite() { x } else { 0.0 })
            .collect(),
        _ => vec![0.0; feats.len()],
    }
}

/// A step's reward: the relative change of the cost model's score, taken against
/// `max(|old|, scale)` (rank scores can be zero or negative) and clipped to [-1, 1].
pub(crate) fn relative_reward(old: f64, new: f64, scale: f64) -> f32 {
    ((new - old) / old.abs().max(scale)).clamp(-1.0, 1.0) as f32
}

/// The standard deviation of `xs`.
pub(crate) fn spread(xs: &[f64]) -> f64 {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt()
}
