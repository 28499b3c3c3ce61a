//! Ansor's gradient task scheduler.

use super::{TaskScheduler, TaskView};
use harl_build::rng::Rng;

/// Ansor's gradient-based task scheduler (Zheng et al., OSDI'20, section 6).
pub struct GradientScheduler {
    /// Weight of the backward (observed) gradient against the forward estimate.
    pub alpha: f64,
    /// How optimistic the forward estimate is about similar tasks' throughput.
    pub beta: f64,
    /// Rounds the backward gradient looks back over.
    pub window: usize,
    /// Probability of a random task (exploration).
    pub eps: f64,
}

impl Default for GradientScheduler {
    fn default() -> Self {
        GradientScheduler {
            alpha: 0.2,
            beta: 2.0,
            window: 3,
            eps: 0.05,
        }
    }
}

impl GradientScheduler {
    /// The estimated change of the weighted end-to-end latency per round spent on task `i`
    /// (negative = improvement; the scheduler picks the smallest).
    pub fn gradient(&self, tasks: &[TaskView], i: usize) -> f64 {
        let t = &tasks[i];
        let Some(g) = t.history.last().copied().flatten() else {
            return f64::NEG_INFINITY;
        };
        let rounds = t.history.len() as f64;
        let back = if t.history.len() > self.window {
            match t.history[t.history.len() - 1 - self.window] {
                Some(old) => (g - old) / self.window as f64,
                None => 0.0,
            }
        } else {
            0.0
        };
        // Forward: either keep the average improvement so far, or reach the throughput of the
        // best similar task (scaled by beta), whichever is less optimistic.
        let best_similar = tasks
            .iter()
            .filter(|o| o.class == t.class)
            .filter_map(|o| o.history.last().copied().flatten().map(|l| o.flops / l))
            .fold(0.0f64, f64::max);
        let by_rate = -g / rounds;
        let by_similar = if best_similar > 0.0 {
            self.beta * t.flops / best_similar - g
        } else {
            by_rate
        };
        let forward = by_rate.min(by_similar);
        t.weight * (self.alpha * back + (1.0 - self.alpha) * forward)
    }
}

impl TaskScheduler for GradientScheduler {
    fn name(&self) -> &'static str {
        "gradient"
    }

    fn next(&mut self, tasks: &[TaskView], rng: &mut Rng) -> usize {
        // Every task gets a first round before gradients mean anything.
        if let Some(i) = tasks.iter().position(|t| t.history.is_empty()) {
            return i;
        }
        if rng.chance(self.eps) {
            return rng.below(tasks.len());
        }
        (0..tasks.len())
            .min_by(|&a, &b| {
                self.gradient(tasks, a)
                    .partial_cmp(&self.gradient(tasks, b))
                    .unwrap_or(std::cmp::Ordering::Equal)
            })
            .unwrap_or(0)
    }
}
