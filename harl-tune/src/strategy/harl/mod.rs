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
//! for measurement. The agent of each (task, sketch) keeps its weights across rounds. The
//! episode is written once for every [`SearchSpace`]: each space gives the agent its heads,
//! state encoding and moves ([`crate::space::Moves`]); the GPU space's one sketch makes its
//! bandit trivial.
//!
//! Deviations, stated: a quarter of an episode's tracks (`elite_fraction`) start from the sketch's best measured
//! schedules rather than random fillings (without them HARL lost to Ansor's evolutionary search,
//! which keeps its best in the population, on conv1d at 200 trials); with `adaptive_start`
//! (strategy `harl-adaptive`) the measured gains of each start set that share
//! ([`crate::strategy::harl::track_start`]). XGBoost rank scores can be zero or negative, so the relative change is
//! taken against `max(|C(s)|, σ)` with σ the spread of the episode's initial scores, and clipped
//! to [-1, 1].

pub mod ppo;
pub mod stopping;
pub mod track_start;

use crate::bandit::{Aggregate, SlidingWindowUcb};
use crate::cost_model::CostModel;
use crate::space::{CpuSpace, Moves, SearchSpace};
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

struct SketchAgent<S: SearchSpace> {
    agent: Agent,
    moves: S::Moves,
}

struct TaskMemory<S: SearchSpace> {
    bandit: SlidingWindowUcb,
    agents: HashMap<usize, SketchAgent<S>>,
    /// Trials of the task already fed to the bandit.
    fed: usize,
    /// The track start of each schedule proposed for measurement (adaptive start only).
    origins: HashMap<S::Params, Origin>,
    /// Measured gains per track start (adaptive start only).
    credit: TrackStartCredit,
    /// Trials already credited, and the task's best latency after them.
    credited: usize,
    credited_best: f64,
}

/// HARL's hierarchical search (one strategy among the others) over space `S`.
pub struct Harl<S: SearchSpace = CpuSpace> {
    config: HarlConfig,
    tasks: HashMap<String, TaskMemory<S>>,
}

impl<S: SearchSpace> Harl<S> {
    /// A HARL search with these parameters.
    pub fn new(config: HarlConfig) -> Self {
        Harl {
            config,
            tasks: HashMap::new(),
        }
    }
}

impl<S: SearchSpace> Default for Harl<S> {
    fn default() -> Self {
        Harl::new(HarlConfig::default())
    }
}

/// A schedule track: where it is, where it started, its score and its agent transitions.
struct Track<P> {
    cand: Candidate<P>,
    origin: Origin,
    score: f64,
    transitions: Vec<Transition>,
}

/// An agent's action with its log-probability and value estimate, as `act_batch` returns it.
type Act = (Vec<usize>, f32, f32);

/// The bookkeeping of one episode step (Algorithm 1's inner loop): each live track records its
/// transition, its advantage `r + γ V(s') - V(s)` feeds adaptive stopping, and a stopped
/// track's last transition ends its trajectory. Returns the tracks still alive with their next
/// actions.
#[allow(clippy::too_many_arguments)]
fn record_step<P>(
    tracks: &mut [Track<P>],
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
        tracks[i].transitions.push(Transition {
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
            if let Some(last) = tracks[i].transitions.last_mut() {
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
fn trajectories<P>(alive: &[usize], mut tracks: Vec<Track<P>>) -> Vec<Vec<Transition>> {
    for &i in alive {
        if let Some(last) = tracks[i].transitions.last_mut() {
            last.done = true;
        }
    }
    tracks
        .iter_mut()
        .map(|t| std::mem::take(&mut t.transitions))
        .filter(|t| !t.is_empty())
        .collect()
}

impl<S: SearchSpace> Harl<S> {
    /// The task's memory (its sketch bandit, agents, credit), made on first use.
    fn memory(&mut self, state: &TaskState<S>) -> &mut TaskMemory<S> {
        let cfg = &self.config;
        self.tasks
            .entry(state.task.graph.workload_key())
            .or_insert_with(|| TaskMemory {
                bandit: SlidingWindowUcb::new(
                    state.space.sketch_count(),
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

impl<S: SearchSpace> SearchStrategy<S> for Harl<S> {
    fn name(&self) -> &'static str {
        "harl"
    }

    /// The sketch bandit's rewards and, with `adaptive_start`, the track starts' credit, from
    /// the trials measured since the last call.
    fn notify(&mut self, state: &TaskState<S>) {
        if state.space.sketch_count() == 0 {
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
        state: &TaskState<S>,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate<S::Params>> {
        let n_sketches = state.space.sketch_count();
        if n_sketches == 0 {
            return Vec::new();
        }
        let cfg = self.config.clone();
        let mem = self.memory(state);
        let elite_share = if cfg.adaptive_start {
            mem.credit.elite_share(cfg.elite_fraction)
        } else {
            cfg.elite_fraction
        };
        let u = mem.bandit.select(rng).min(n_sketches - 1);
        let space = &state.space;
        let sa = mem.agents.entry(u).or_insert_with(|| {
            let moves = space.moves(u);
            let ppo = PpoConfig {
                seed: cfg.ppo.seed ^ (u as u64).wrapping_mul(0x9e37_79b9),
                ..cfg.ppo.clone()
            };
            let heads = ActionSpace {
                heads: moves.heads(),
            };
            SketchAgent {
                agent: Agent::new(moves.state_dim(), heads, ppo),
                moves,
            }
        });
        let mut visited: Vec<(f64, Candidate<S::Params>, Origin)> = Vec::new();
        let mut seen: HashSet<S::Params> = HashSet::new();
        // Phase 1: an episode of parameter modifications.
        let mut tracks: Vec<Track<S::Params>> = Vec::new();
        // Some tracks (a quarter by default) start from the sketch's best measured schedules (the
        // rest from random fillings, as the paper's): without them every episode restarts from
        // scratch.
        let n_elite = ((cfg.tracks as f64) * elite_share.clamp(0.0, 1.0)) as usize;
        let elite = state
            .top_measured(cfg.tracks)
            .into_iter()
            .filter(|p| space.sketch_of(p) == u)
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
            let p = space.sample(u, rng);
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
        let encode = |t: &Track<S::Params>| sa.moves.encode(&t.cand.params, t.score / scale);
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
            let next: Vec<Candidate<S::Params>> = alive
                .iter()
                .zip(&pending)
                .map(|(&i, (action, _, _))| {
                    let q = sa.moves.apply(space, &tracks[i].cand.params, action);
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
        let origin_of: HashMap<S::Params, Origin> = if cfg.adaptive_start {
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
fn feed_bandit<S: SearchSpace>(mem: &mut TaskMemory<S>, state: &TaskState<S>) {
    let Some(task_best) = state.best_latency() else {
        for t in &state.trials[mem.fed.min(state.trials.len())..] {
            mem.bandit
                .update(state.space.sketch_of(&t.candidate.params), 0.0);
        }
        mem.fed = state.trials.len();
        return;
    };
    let mut sketch_best: HashMap<usize, f64> = HashMap::new();
    for (i, t) in state.trials.iter().enumerate() {
        let arm = state.space.sketch_of(&t.candidate.params);
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
fn credit_starts<S: SearchSpace>(mem: &mut TaskMemory<S>, state: &TaskState<S>) {
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

fn predict<'a, P: 'a>(
    model: &dyn CostModel,
    cands: impl Iterator<Item = &'a Candidate<P>>,
) -> Vec<f64> {
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
fn relative_reward(old: f64, new: f64, scale: f64) -> f32 {
    ((new - old) / old.abs().max(scale)).clamp(-1.0, 1.0) as f32
}

/// The standard deviation of `xs`.
fn spread(xs: &[f64]) -> f64 {
    let n = xs.len().max(1) as f64;
    let mean = xs.iter().sum::<f64>() / n;
    (xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n).sqrt()
}
