//! Uniform samples of the space: the control.

use super::{epsilon_greedy, SearchStrategy};
use crate::cost_model::CostModel;
use crate::space::SearchSpace;
use crate::task::{Candidate, TaskState};
use harl_build::rng::Rng;

/// Uniform samples of the space, no model.
pub struct RandomSearch;

impl<S: SearchSpace> SearchStrategy<S> for RandomSearch {
    fn name(&self) -> &'static str {
        "random"
    }
    fn propose(
        &mut self,
        state: &TaskState<S>,
        _: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<Candidate<S::Params>> {
        epsilon_greedy(state, Vec::new(), batch, 1.0, rng)
    }
}
