//! Task schedulers: which task of a network gets the next round of trials.
//!
//! [`GradientScheduler`] is Ansor's: it estimates how much one more round on each task would cut
//! the weighted end-to-end latency, from the task's recent improvement (backward) and an
//! optimistic forward guess, and picks the steepest. [`RoundRobin`] cycles.

use harl_build::rng::Rng;

/// What a scheduler sees of one task.
#[derive(Clone, Debug)]
pub struct TaskView {
    /// How many times the network runs it.
    pub weight: f64,
    /// Floating-point operations of one run.
    pub flops: f64,
    /// Best latency after each round on this task (latest last; `None` while nothing succeeded).
    pub history: Vec<Option<f64>>,
    /// Trials spent on it.
    pub trials: usize,
    /// A similarity class (e.g. the op kind): tasks of a class share a throughput estimate.
    pub class: String,
}

/// Chooses the next task.
pub trait TaskScheduler {
    /// Its name (`HARL_TASK_SCHEDULER`).
    fn name(&self) -> &'static str;
    /// Index of the task to tune next.
    fn next(&mut self, tasks: &[TaskView], rng: &mut Rng) -> usize;
}

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

/// The scheduler called `name`: `gradient` (Ansor), `harl` (sliding-window UCB) or
/// `round-robin`.
pub fn scheduler_by_name(name: &str) -> Option<Box<dyn TaskScheduler>> {
    match name {
        "gradient" => Some(Box::new(GradientScheduler::default())),
        "harl" => Some(Box::new(crate::bandit::SwUcbTaskScheduler::default())),
        "round-robin" | "roundrobin" => Some(Box::new(RoundRobin::default())),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn view(weight: f64, history: &[f64]) -> TaskView {
        TaskView {
            weight,
            flops: 1e9,
            history: history.iter().map(|&x| Some(x)).collect(),
            trials: history.len() * 8,
            class: "matmul".into(),
        }
    }

    #[test]
    fn untried_tasks_come_first_then_the_steepest() {
        let mut s = GradientScheduler {
            eps: 0.0,
            ..Default::default()
        };
        let mut rng = Rng::new(1);
        let mut tasks = vec![
            view(1.0, &[1e-3]),
            TaskView {
                history: vec![],
                ..view(1.0, &[])
            },
        ];
        assert_eq!(s.next(&tasks, &mut rng), 1);
        // Task 0 improves fast and weighs 10x: it is the one to tune.
        tasks[0] = view(10.0, &[4e-3, 3e-3, 2e-3, 1e-3]);
        tasks[1] = view(1.0, &[1e-3, 1e-3, 1e-3, 1e-3]);
        assert_eq!(s.next(&tasks, &mut rng), 0);
        // A heavy task that has stopped improving loses to a light one still improving.
        tasks[0] = view(1.0, &[1e-3, 1e-3, 1e-3, 1e-3]);
        tasks[1] = view(1.0, &[8e-3, 6e-3, 4e-3, 2e-3]);
        assert_eq!(s.next(&tasks, &mut rng), 1);
    }

    #[test]
    fn round_robin_cycles() {
        let mut s = RoundRobin::default();
        let mut rng = Rng::new(0);
        let tasks = vec![view(1.0, &[1.0]); 3];
        let picks: Vec<usize> = (0..6).map(|_| s.next(&tasks, &mut rng)).collect();
        assert_eq!(picks, [0, 1, 2, 0, 1, 2]);
    }
}
