//! AutoTVM's search.

use super::{epsilon_greedy, scores, seeded_population, SearchStrategy};
use crate::cost_model::CostModel;
use crate::space::SearchSpace;
use crate::task::{Candidate, TaskState};
use harl_build::rng::Rng;
use std::collections::HashSet;

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

impl<S: SearchSpace> SearchStrategy<S> for Annealing {
    fn name(&self) -> &'static str {
        "autotvm"
    }

    fn propose(
        &mut self,
        state: &TaskState<S>,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate<S::Params>> {
        let mut chains = seeded_population(state, self.chains / 2, self.chains, rng);
        let mut current = scores(model, &chains);
        let mut visited: Vec<(f64, Candidate<S::Params>)> = Vec::new();
        let mut seen = HashSet::new();
        for (s, c) in current.iter().zip(&chains) {
            if seen.insert(c.params.clone()) {
                visited.push((*s, c.clone()));
            }
        }
        for step in 0..self.steps {
            let t = self.temperature * (1.0 - step as f64 / self.steps as f64).max(0.05);
            let proposals: Vec<Candidate<S::Params>> = chains
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
