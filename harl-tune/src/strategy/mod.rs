//! Search strategies behind one trait: random, Ansor-style evolutionary search, AutoTVM-style
//! simulated annealing and HARL. A strategy proposes the next batch of unmeasured candidates of
//! a task; it sees the space only through [`TaskState`] (so every strategy searches the CPU
//! and the GPU spaces alike) and scores candidates only through the cost model; it hears how
//! its proposals measured through [`SearchStrategy::notify`].

pub mod annealing;
pub mod evolutionary;
pub mod harl;
pub mod random;

pub use crate::task::{Candidate, TaskState, Trial};
pub use annealing::Annealing;
pub use evolutionary::Evolutionary;
pub use random::RandomSearch;

use crate::cost_model::CostModel;
use crate::space::{CpuSpace, SearchSpace};
use harl_build::rng::Rng;
use std::collections::HashSet;

/// A search strategy: proposes the next batch of unmeasured candidates of a task in space `S`.
pub trait SearchStrategy<S: SearchSpace = CpuSpace> {
    /// Its name (`HARL_STRATEGY`).
    fn name(&self) -> &'static str;
    /// Up to `batch` distinct, unmeasured, valid candidates.
    fn propose(
        &mut self,
        state: &TaskState<S>,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate<S::Params>>;
    /// Hears how a batch of the task measured (MetaSchedule's `notify_runner_results`): `state`
    /// already holds the new trials. Strategies that learn from results do it here rather than
    /// by working out on their next `propose` what changed.
    fn notify(&mut self, _state: &TaskState<S>) {}
}

/// The names [`strategy_by_name`] accepts (besides their aliases and `harl-elite<P>`), for
/// error messages.
pub const STRATEGY_NAMES: &str = "harl, ansor, autotvm, random";

/// The strategy called `name`: `harl` (hierarchical RL), `ansor` (evolutionary), `autotvm`
/// (annealing) or `random`. `harl-elite<P>` is HARL with `P` percent of its tracks started
/// from the best measured schedules (an ablation; `harl` is `harl-elite25`). `seed` seeds what
/// a strategy initialises on its own (HARL's networks); every other random decision comes from
/// the tuner's generator. `harl-adaptive` is HARL whose elite share follows the measured gains
/// of each track start (an experiment, see [`crate::strategy::harl::track_start`]).
pub fn strategy_by_name<S: SearchSpace + 'static>(
    name: &str,
    seed: u64,
) -> Option<Box<dyn SearchStrategy<S>>> {
    let harl =
        |adjust: &dyn Fn(&mut crate::strategy::harl::HarlConfig)| -> Option<Box<dyn SearchStrategy<S>>> {
            let mut config = crate::strategy::harl::HarlConfig::default();
            config.ppo.seed = seed;
            adjust(&mut config);
            Some(Box::new(crate::strategy::harl::Harl::new(config)))
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
fn push_new<S: SearchSpace>(
    state: &TaskState<S>,
    out: &mut Vec<Candidate<S::Params>>,
    seen: &mut HashSet<S::Params>,
    c: Candidate<S::Params>,
) {
    if !state.is_measured(&c.params) && seen.insert(c.params.clone()) {
        out.push(c);
    }
}

/// Up to `n_best` of the best measured schedules, then random samples, `size` in all.
fn seeded_population<S: SearchSpace>(
    state: &TaskState<S>,
    n_best: usize,
    size: usize,
    rng: &mut Rng,
) -> Vec<Candidate<S::Params>> {
    let mut pop: Vec<Candidate<S::Params>> = state
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
fn scores<P>(model: &dyn CostModel, cands: &[Candidate<P>]) -> Vec<f64> {
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
pub(crate) fn epsilon_greedy<S: SearchSpace>(
    state: &TaskState<S>,
    pool: Vec<Candidate<S::Params>>,
    batch: usize,
    eps: f64,
    rng: &mut Rng,
) -> Vec<Candidate<S::Params>> {
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
