//! Ansor's search.

use super::{epsilon_greedy, scores, seeded_population, SearchStrategy};
use crate::cost_model::CostModel;
use crate::space::SearchSpace;
use crate::task::{Candidate, TaskState};
use harl_build::rng::Rng;
use std::collections::HashSet;

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

impl<S: SearchSpace> SearchStrategy<S> for Evolutionary {
    fn name(&self) -> &'static str {
        "ansor"
    }

    fn propose(
        &mut self,
        state: &TaskState<S>,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate<S::Params>> {
        let n_elite = ((self.population as f64) * self.elite_fraction) as usize;
        let mut pop = seeded_population(state, n_elite, self.population, rng);
        // Every candidate seen, with its score; the best unmeasured ones are proposed.
        let mut visited: Vec<(f64, Candidate<S::Params>)> = Vec::new();
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
