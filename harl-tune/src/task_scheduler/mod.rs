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
    /// Hears that a round on `task` ended (MetaSchedule's `notify_runner_results`): `tasks`
    /// already holds its extended history. Schedulers that learn from results do it here.
    fn notify(&mut self, _task: usize, _tasks: &[TaskView]) {}
}

mod gradient;
mod round_robin;
mod sw_ucb;

pub use gradient::GradientScheduler;
pub use round_robin::RoundRobin;
pub use sw_ucb::SwUcbTaskScheduler;

/// The task schedulers' names, for messages.
pub const SCHEDULER_NAMES: &str = "harl, gradient, round-robin";

/// The task scheduler a tuning job uses unless told otherwise: HARL's bandit.
pub const DEFAULT_SCHEDULER: &str = "harl";

/// The scheduler called `name`: `gradient` (Ansor), `harl` (sliding-window UCB) or
/// `round-robin`.
pub fn scheduler_by_name(name: &str) -> Option<Box<dyn TaskScheduler>> {
    match name {
        "gradient" => Some(Box::new(GradientScheduler::default())),
        "harl" => Some(Box::new(SwUcbTaskScheduler::default())),
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
