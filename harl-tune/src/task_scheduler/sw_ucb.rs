//! HARL's task bandit: SW-UCB over the tasks, rewarded by Ansor's gradient estimate.

use crate::bandit::{Aggregate, SlidingWindowUcb, HARL_C, HARL_WINDOW};
use crate::task_scheduler::{GradientScheduler, TaskScheduler, TaskView};
use harl_build::rng::Rng;

/// HARL's task (subgraph) selection: a sliding-window UCB over the tasks whose reward is
/// Ansor's gradient estimate (HARL section 4.1, Equations 3 and 4).
///
/// The paper: "instead of using the absolute performance, HARL directly uses the gradient
/// estimation formula in (Zheng et al. 2020a) as the reward function for predicting the
/// performance improvement when selecting a subgraph". [`GradientScheduler::gradient`] is that
/// formula, `∂f/∂t_a`: the estimated change of the weighted end-to-end latency per round on
/// task `a` (negative = improvement). After each round the task just tuned earns the reward
///
/// ```text
/// r_a = clamp( −∂f/∂t_a / f̂, 0, 1 ),   f̂ = Σ_b w_b · g_b
/// ```
///
/// the estimated improvement of the end-to-end latency from one more round on `a`, as a
/// fraction of the current estimated end-to-end latency `f(S) ≈ Σ w_n g_n` (the paper's
/// section 2.2; the sum runs over the tasks with a measured latency). The fraction is
/// scale-free (it does not depend on the network's size or speed), lies in `[0, 1]` like the
/// sketch bandit's normalised performance, so `c` means the same in both bandits (the paper
/// uses the same settings for both, section 6.3), and depends on the other tasks only through
/// `f̂` and Ansor's similar-task term. A task that has no successful trial yet (gradient
/// `−∞`) earns 1. `Q_t(τ, a)` is the window mean of these rewards (Equation 4's display is
/// lost in our copy; the mean is SW-UCB's standard value).
///
/// (Normalising by the best gain over all tasks at that moment was tried and rejected: a
/// task's reward then depends on the state of the others when it was played, stale low values
/// linger, and identical tasks get very unequal, long runs.)
///
/// The reward of a round is computed when the tuner reports it ([`TaskScheduler::notify`]),
/// from the history the round extended. Every task gets its first round before the bandit
/// decides (as in Ansor, whose gradient needs one), and these rounds count as plays.
pub struct SwUcbTaskScheduler {
    /// The gradient estimate (its `alpha`, `beta` and `window`; its `eps` is not used: the
    /// bandit explores).
    pub gradient: GradientScheduler,
    window: usize,
    c: f64,
    bandit: Option<SlidingWindowUcb>,
}

impl Default for SwUcbTaskScheduler {
    /// The paper's settings: window 256, `c = 0.25`, Ansor's default gradient estimate.
    fn default() -> Self {
        Self::new(HARL_WINDOW, HARL_C)
    }
}

impl SwUcbTaskScheduler {
    /// A scheduler with SW-UCB window `window` and exploration constant `c`.
    pub fn new(window: usize, c: f64) -> Self {
        SwUcbTaskScheduler {
            gradient: GradientScheduler::default(),
            window,
            c,
            bandit: None,
        }
    }

    /// A bandit over `n` tasks; a new (or different) set of tasks starts afresh.
    fn bandit_for(&mut self, n: usize) -> &mut SlidingWindowUcb {
        if self.bandit.as_ref().map(SlidingWindowUcb::n_arms) != Some(n) {
            self.bandit = None;
        }
        let (window, c) = (self.window, self.c);
        self.bandit
            .get_or_insert_with(|| SlidingWindowUcb::new(n, window, c, Aggregate::Mean))
    }

    /// The bandit over the tasks (after the first call of `next`).
    pub fn bandit(&self) -> Option<&SlidingWindowUcb> {
        self.bandit.as_ref()
    }

    /// The reward of task `i` now: the estimated end-to-end improvement of one more round on
    /// it as a fraction of the estimated end-to-end latency, in `[0, 1]` (see the type's
    /// documentation).
    pub fn reward(&self, tasks: &[TaskView], i: usize) -> f64 {
        if i >= tasks.len() {
            return 0.0;
        }
        let gain = -self.gradient.gradient(tasks, i);
        if gain == f64::INFINITY {
            return 1.0;
        }
        let network: f64 = tasks
            .iter()
            .filter_map(|t| t.history.last().copied().flatten().map(|g| t.weight * g))
            .sum();
        if !(gain.is_finite() && network.is_finite() && network > 0.0) {
            return 0.0;
        }
        (gain / network).clamp(0.0, 1.0)
    }
}

impl TaskScheduler for SwUcbTaskScheduler {
    fn name(&self) -> &'static str {
        "harl"
    }

    fn next(&mut self, tasks: &[TaskView], rng: &mut Rng) -> usize {
        if tasks.is_empty() {
            return 0;
        }
        let bandit = self.bandit_for(tasks.len());
        match tasks.iter().position(|t| t.history.is_empty()) {
            Some(i) => i,
            None => bandit.select(rng),
        }
    }

    fn notify(&mut self, task: usize, tasks: &[TaskView]) {
        if task >= tasks.len() {
            return;
        }
        let r = self.reward(tasks, task);
        self.bandit_for(tasks.len()).update(task, r);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    fn view(weight: f64, history: &[f64]) -> TaskView {
        TaskView {
            weight,
            flops: 1e9,
            history: history.iter().map(|&x| Some(x)).collect(),
            trials: history.len() * 8,
            class: "matmul".into(),
        }
    }

    /// Runs the scheduler as the tuner does: each pick extends that task's history by one
    /// round, following `curve(task, rounds so far)`.
    fn simulate(seed: u64, rounds: usize, curve: impl Fn(usize, usize) -> f64) -> Vec<usize> {
        let mut s = SwUcbTaskScheduler::new(64, HARL_C);
        let mut rng = Rng::new(seed);
        let mut tasks = vec![view(4.0, &[]), view(1.0, &[]), view(1.0, &[])];
        let mut picks = Vec::new();
        for _ in 0..rounds {
            let i = s.next(&tasks, &mut rng);
            let k = tasks[i].history.len();
            tasks[i].history.push(Some(curve(i, k)));
            tasks[i].trials += 8;
            s.notify(i, &tasks);
            picks.push(i);
        }
        picks
    }

    #[test]
    fn task_scheduler_favours_high_reward_and_still_explores() {
        // Task 0 weighs 4x and keeps improving (3% a round); tasks 1 and 2 are flat at once.
        let curve = |task: usize, k: usize| match task {
            0 => 1e-2 * 0.97f64.powi(k as i32) + 1e-3,
            _ => 1e-3,
        };
        let picks = simulate(5, 120, curve);
        assert_eq!(&picks[..3], &[0, 1, 2], "every task gets a first round");
        let count = |a: usize| picks.iter().filter(|&&p| p == a).count();
        assert!(
            count(0) > 80,
            "the improving heavy task gets most rounds: {picks:?}"
        );
        assert!(
            count(1) >= 5 && count(2) >= 5,
            "the others are still explored: {picks:?}"
        );
        assert_eq!(simulate(5, 120, curve), picks, "deterministic");

        // Rewards by hand (α = 0.2, β = 2, window 3). Task 0 (weight 4): g = 1e-3, back =
        // (1e-3 − 4e-3) / 3 = −1e-3, forward = min(−g/4, 2·1e9/1e12 − g) = −2.5e-4, so
        // ∂f/∂t = 4·(0.2·−1e-3 + 0.8·−2.5e-4) = −1.6e-3. Task 1 (flat): 0.8·−2.5e-4 = −2e-4.
        // f̂ = 4·1e-3 + 1e-3 = 5e-3: rewards 0.32 and 0.04.
        let s = SwUcbTaskScheduler::default();
        let tasks = vec![
            view(4.0, &[4e-3, 3e-3, 2e-3, 1e-3]),
            view(1.0, &[1e-3, 1e-3, 1e-3, 1e-3]),
        ];
        assert!(close(s.reward(&tasks, 0), 0.32));
        assert!(close(s.reward(&tasks, 1), 0.04));
        assert_eq!(s.reward(&tasks, 2), 0.0);
        // A task with no success yet is worth trying.
        let failing = vec![
            view(1.0, &[1e-3]),
            TaskView {
                history: vec![None],
                ..view(1.0, &[])
            },
        ];
        assert_eq!(s.reward(&failing, 1), 1.0);
        assert_eq!(s.name(), "harl");
    }

    #[test]
    fn task_scheduler_restarts_on_a_new_task_set() {
        let mut s = SwUcbTaskScheduler::default();
        let mut rng = Rng::new(3);
        let tasks = vec![view(1.0, &[1e-3]), view(1.0, &[2e-3])];
        let first = s.next(&tasks, &mut rng);
        s.notify(first, &tasks);
        s.next(&tasks, &mut rng);
        assert_eq!(s.bandit().map(SlidingWindowUcb::steps), Some(1));
        let three = vec![view(1.0, &[1e-3]); 3];
        s.next(&three, &mut rng);
        assert_eq!(s.bandit().map(|b| (b.n_arms(), b.steps())), Some((3, 0)));
        assert_eq!(s.next(&[], &mut rng), 0);
    }
}
