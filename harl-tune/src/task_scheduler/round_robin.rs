//! The control: every task in turn.

use super::{TaskScheduler, TaskView};
use harl_build::rng::Rng;

/// Cycles through the tasks.
#[derive(Default)]
pub struct RoundRobin {
    cursor: usize,
}

impl TaskScheduler for RoundRobin {
    fn name(&self) -> &'static str {
        "round-robin"
    }
    fn next(&mut self, tasks: &[TaskView], _: &mut Rng) -> usize {
        let i = self.cursor % tasks.len().max(1);
        self.cursor += 1;
        i
    }
}
