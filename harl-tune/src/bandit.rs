//! Sliding-window UCB (SW-UCB): HARL's non-stationary multi-armed bandit for task (subgraph)
//! and sketch selection (HARL, ICPP'22, section 4.1; Garivier and Moulines, 2008).
//!
//! HARL models both high-level choices as non-stationary bandits: "the two MAB problems are
//! non-stationary as the performance of different subgraphs and sketches continues to improve
//! over the course of optimization ... we use Sliding-Window Upper-Confidence Bound (SW-UCB)".
//! The selection rule (the paper's Equation 1; its display is lost in our copy of the text, so
//! this is the published SW-UCB form with the paper's symbols) is
//!
//! ```text
//! a_t = argmax_a  Q_t(τ, a) + c · sqrt( ln(min(t, τ)) / N_t(τ, a) )
//! ```
//!
//! where `τ` is the window size, `c` "determines the importance of exploration", `t` the
//! current step and `N_t(τ, a)` "the number of allocated trials/steps on the subgraph/sketch
//! `a`, from step `t−τ+1` to step `t`". `Q_t(τ, a)` aggregates the rewards `a` received inside
//! the window: for sketches the paper's Equation 2 is "the average performance in the window
//! with size τ" of `X_t`, "the normalized maximal performance until each step"
//! ([`Aggregate::Mean`]); [`Aggregate::Max`] (best reward in the window) is offered for the
//! reading "best normalised performance in the window". For subgraphs the reward is Ansor's
//! gradient estimate (Equations 3 and 4), see [`SwUcbTaskScheduler`].
//!
//! The paper's settings (section 6.2, also used end to end, section 6.3): `c = 0.25`, window
//! 256 ([`HARL_C`], [`HARL_WINDOW`]).

use harl_build::rng::Rng;
use crate::task_scheduler::{GradientScheduler, TaskScheduler, TaskView};
use std::collections::VecDeque;

/// The paper's SW-UCB window size `τ` (section 6.2: "the window size is 256").
pub const HARL_WINDOW: usize = 256;

/// The paper's SW-UCB exploration constant `c` (section 6.2: "the constant c used in SW-UCB
/// defined in Equation 1 is set to 0.25").
pub const HARL_C: f64 = 0.25;

/// How the rewards an arm received inside the window become its value `Q_t(τ, a)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aggregate {
    /// The mean reward in the window (the paper's Equation 2 for sketches: "the average
    /// performance in the window with size τ"; the SW-UCB of Garivier and Moulines).
    Mean,
    /// The best reward in the window.
    Max,
}

/// A sliding-window UCB bandit over `n_arms` arms (the paper's Equation 1).
///
/// The window holds the last `τ` plays (step, arm, reward); a play that left it no longer
/// counts, so an arm that was good long ago but poor lately loses to one good lately.
#[derive(Clone, Debug)]
pub struct SlidingWindowUcb {
    n_arms: usize,
    window: usize,
    c: f64,
    aggregate: Aggregate,
    /// The last `window` plays, oldest first.
    plays: VecDeque<(usize, f64)>,
    /// `N_t(τ, a)` for every arm.
    counts: Vec<usize>,
    /// `t`: plays recorded since creation.
    steps: usize,
}

impl SlidingWindowUcb {
    /// A bandit over `n_arms` arms with window `τ = window` (at least 1), exploration constant
    /// `c` (negative or NaN is taken as 0) and value `aggregate`.
    pub fn new(n_arms: usize, window: usize, c: f64, aggregate: Aggregate) -> Self {
        SlidingWindowUcb {
            n_arms,
            window: window.max(1),
            c: if c.is_finite() && c > 0.0 { c } else { 0.0 },
            aggregate,
            plays: VecDeque::with_capacity(window.max(1)),
            counts: vec![0; n_arms],
            steps: 0,
        }
    }

    /// The paper's sketch bandit: window 256, `c = 0.25`, `Q` the window mean of `X_t`
    /// (section 4.1, Equation 2; section 6.2).
    pub fn harl_sketch(n_arms: usize) -> Self {
        Self::new(n_arms, HARL_WINDOW, HARL_C, Aggregate::Mean)
    }

    /// The number of arms.
    pub fn n_arms(&self) -> usize {
        self.n_arms
    }

    /// The window size `τ`.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The exploration constant `c`.
    pub fn c(&self) -> f64 {
        self.c
    }

    /// How rewards in the window become `Q_t(τ, a)`.
    pub fn aggregate(&self) -> Aggregate {
        self.aggregate
    }

    /// `t`: the number of plays recorded so far (including those that left the window).
    pub fn steps(&self) -> usize {
        self.steps
    }

    /// `N_t(τ, a)` of every arm: its plays among the last `τ`.
    pub fn counts_in_window(&self) -> &[usize] {
        &self.counts
    }

    /// Records that `arm` was played and earned `reward`; the oldest play leaves the window when
    /// it is full. An arm out of range or a non-finite reward is refused (returns false, records
    /// nothing).
    pub fn update(&mut self, arm: usize, reward: f64) -> bool {
        if arm >= self.n_arms || !reward.is_finite() {
            return false;
        }
        if self.plays.len() == self.window {
            if let Some((old, _)) = self.plays.pop_front() {
                self.counts[old] -= 1;
            }
        }
        self.plays.push_back((arm, reward));
        self.counts[arm] += 1;
        self.steps += 1;
        true
    }

    /// `Q_t(τ, a)`: the mean (or max, per [`Aggregate`]) of the rewards `arm` earned inside the
    /// window; `None` when it was not played there.
    pub fn value(&self, arm: usize) -> Option<f64> {
        let mut rewards = self
            .plays
            .iter()
            .filter(|&&(a, _)| a == arm)
            .map(|&(_, r)| r);
        let first = rewards.next()?;
        Some(match self.aggregate {
            Aggregate::Mean => {
                let (sum, n) = rewards.fold((first, 1usize), |(s, n), r| (s + r, n + 1));
                sum / n as f64
            }
            Aggregate::Max => rewards.fold(first, f64::max),
        })
    }

    /// The exploration bonus `c · sqrt(ln(min(t, τ)) / N_t(τ, a))` of Equation 1; infinite for
    /// an arm not played inside the window (or out of range).
    pub fn bonus(&self, arm: usize) -> f64 {
        match self.counts.get(arm) {
            Some(&n) if n > 0 => {
                let horizon = self.steps.min(self.window) as f64;
                self.c * (horizon.ln() / n as f64).sqrt()
            }
            _ => f64::INFINITY,
        }
    }

    /// The upper confidence bound `Q_t(τ, a) + bonus` of Equation 1 (infinite for an arm not
    /// played inside the window).
    pub fn ucb(&self, arm: usize) -> f64 {
        match self.value(arm) {
            Some(q) => q + self.bonus(arm),
            None => f64::INFINITY,
        }
    }

    /// The arm to play next (Equation 1): the lowest-numbered arm not played inside the window,
    /// else the arm of the highest upper confidence bound, ties going to the lowest number.
    ///
    /// The choice is a function of the window alone, so the same plays give the same arm; it
    /// draws nothing from `rng` (which is taken so that every search decision goes through the
    /// seeded generator, should a randomised tie-break be wanted later). Returns 0 when there
    /// are no arms.
    pub fn select(&self, _rng: &mut Rng) -> usize {
        if let Some(a) = self.counts.iter().position(|&n| n == 0) {
            return a;
        }
        // One pass over the window for every arm's value.
        let mut acc: Vec<Option<(f64, usize)>> = vec![None; self.n_arms];
        for &(a, r) in &self.plays {
            acc[a] = Some(match (acc[a], self.aggregate) {
                (None, _) => (r, 1),
                (Some((s, n)), Aggregate::Mean) => (s + r, n + 1),
                (Some((m, n)), Aggregate::Max) => (m.max(r), n + 1),
            });
        }
        let mut best = 0;
        let mut best_ucb = f64::NEG_INFINITY;
        for (a, v) in acc.iter().enumerate() {
            let q = match (v, self.aggregate) {
                (Some((s, n)), Aggregate::Mean) => s / *n as f64,
                (Some((m, _)), Aggregate::Max) => *m,
                (None, _) => return a,
            };
            let u = q + self.bonus(a);
            if u > best_ucb {
                best = a;
                best_ucb = u;
            }
        }
        best
    }
}

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
/// The tuner gives no feedback call, so the reward of the task picked at one call is computed
/// at the next, from the history the tuner extended in between. Every task gets its first
/// round before the bandit decides (as in Ansor, whose gradient needs one), and these rounds
/// count as plays.
pub struct SwUcbTaskScheduler {
    /// The gradient estimate (its `alpha`, `beta` and `window`; its `eps` is not used: the
    /// bandit explores).
    pub gradient: GradientScheduler,
    window: usize,
    c: f64,
    bandit: Option<SlidingWindowUcb>,
    last: Option<usize>,
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
            last: None,
        }
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
        if self.bandit.as_ref().map(SlidingWindowUcb::n_arms) != Some(tasks.len()) {
            // A new (or different) set of tasks: start afresh.
            self.bandit = Some(SlidingWindowUcb::new(
                tasks.len(),
                self.window,
                self.c,
                Aggregate::Mean,
            ));
            self.last = None;
        }
        if let Some(p) = self.last.take() {
            let r = self.reward(tasks, p);
            if let Some(b) = self.bandit.as_mut() {
                b.update(p, r);
            }
        }
        let pick = match tasks.iter().position(|t| t.history.is_empty()) {
            Some(i) => i,
            None => self.bandit.as_ref().map_or(0, |b| b.select(rng)),
        };
        self.last = Some(pick);
        pick
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-6
    }

    #[test]
    fn unplayed_arms_first_in_order() {
        let mut b = SlidingWindowUcb::new(3, 8, 0.25, Aggregate::Mean);
        let mut rng = Rng::new(0);
        assert_eq!(b.select(&mut rng), 0);
        assert!(b.update(0, 0.9));
        assert_eq!(b.select(&mut rng), 1);
        assert!(b.update(1, 0.1));
        assert_eq!(b.select(&mut rng), 2);
        assert_eq!(b.value(2), None);
        assert_eq!(b.bonus(2), f64::INFINITY);
        assert!(!b.update(3, 1.0), "out-of-range arm refused");
        assert!(!b.update(2, f64::NAN), "NaN reward refused");
        assert_eq!(b.steps(), 2);
        assert_eq!(
            SlidingWindowUcb::new(0, 4, 1.0, Aggregate::Mean).select(&mut rng),
            0
        );
    }

    #[test]
    fn picks_what_the_formula_says() {
        // τ = 4, c = 0.5; plays (0, 1.0), (1, 0.2), (0, 0.6): t = 3, min(t, τ) = 3.
        let mut b = SlidingWindowUcb::new(2, 4, 0.5, Aggregate::Mean);
        let mut rng = Rng::new(0);
        b.update(0, 1.0);
        b.update(1, 0.2);
        b.update(0, 0.6);
        assert_eq!(b.counts_in_window(), &[2, 1]);
        // Q0 = (1.0 + 0.6) / 2 = 0.8; bonus0 = 0.5·sqrt(ln 3 / 2) = 0.5·sqrt(0.549306) = 0.370576.
        // Q1 = 0.2;                   bonus1 = 0.5·sqrt(ln 3 / 1) = 0.5·1.048147       = 0.524074.
        assert!(close(b.value(0).unwrap_or(f64::NAN), 0.8));
        assert!(close(b.bonus(0), 0.370_576));
        assert!(close(b.value(1).unwrap_or(f64::NAN), 0.2));
        assert!(close(b.bonus(1), 0.524_074));
        // UCB0 = 1.170576 > UCB1 = 0.724074.
        assert!(close(b.ucb(0), 1.170_576));
        assert_eq!(b.select(&mut rng), 0);

        // Two more poor plays of arm 0: (0, 0.1), (0, 0.1). t = 5, the window (τ = 4) now holds
        // (1, 0.2), (0, 0.6), (0, 0.1), (0, 0.1); min(t, τ) = 4, ln 4 = 1.386294.
        b.update(0, 0.1);
        b.update(0, 0.1);
        assert_eq!(b.counts_in_window(), &[3, 1]);
        // Q0 = 0.8 / 3 = 0.266667; bonus0 = 0.5·sqrt(1.386294 / 3) = 0.339889; UCB0 = 0.606556.
        // Q1 = 0.2;                bonus1 = 0.5·sqrt(1.386294)     = 0.588705; UCB1 = 0.788705.
        assert!(close(b.value(0).unwrap_or(f64::NAN), 0.266_667));
        assert!(close(b.ucb(0), 0.606_556));
        assert!(close(b.ucb(1), 0.788_705));
        assert_eq!(b.select(&mut rng), 1);

        // With c = 0 the bandit is greedy on the window mean; an exact tie goes to arm 0.
        let mut g = SlidingWindowUcb::new(2, 4, 0.0, Aggregate::Mean);
        g.update(0, 0.5);
        g.update(1, 0.5);
        assert_eq!(g.select(&mut rng), 0);
        g.update(1, 0.6);
        assert_eq!(g.select(&mut rng), 1);
    }

    #[test]
    fn max_aggregate_takes_the_best_in_window() {
        // τ = 3, c = 0.1: plays (0, 0.9), (0, 0.1), (1, 0.5), (1, 0.5); (0, 0.9) has left.
        let mut b = SlidingWindowUcb::new(2, 3, 0.1, Aggregate::Max);
        let mut rng = Rng::new(0);
        b.update(0, 0.9);
        b.update(0, 0.1);
        b.update(1, 0.5);
        assert!(close(b.value(0).unwrap_or(f64::NAN), 0.9));
        // t = 3: Q0 = 0.9 + 0.1·sqrt(ln 3 / 2) = 0.974115; Q1 = 0.5 + 0.1·sqrt(ln 3) = 0.604815.
        assert!(close(b.ucb(0), 0.974_115));
        assert!(close(b.ucb(1), 0.604_815));
        assert_eq!(b.select(&mut rng), 0);
        b.update(1, 0.5);
        // Window (0, 0.1), (1, 0.5), (1, 0.5): the 0.9 is forgotten.
        assert!(close(b.value(0).unwrap_or(f64::NAN), 0.1));
        assert_eq!(b.select(&mut rng), 1);
    }

    #[test]
    fn forgets_rewards_that_left_the_window() {
        // Arm 0 was excellent long ago and poor lately; arm 1 is steadily mediocre.
        let mut sw = SlidingWindowUcb::new(2, 4, 0.25, Aggregate::Mean);
        // A window as long as the history: plain UCB.
        let mut plain = SlidingWindowUcb::new(2, 1000, 0.25, Aggregate::Mean);
        let mut rng = Rng::new(0);
        for (a, r) in [(0, 1.0), (0, 1.0), (0, 1.0), (1, 0.5), (0, 0.0), (0, 0.0)] {
            sw.update(a, r);
            plain.update(a, r);
        }
        sw.update(1, 0.5);
        plain.update(1, 0.5);
        sw.update(1, 0.5);
        plain.update(1, 0.5);
        // Window: (0, 0), (0, 0), (1, .5), (1, .5): same counts, so same bonus; Q0 = 0 < Q1 = .5.
        assert_eq!(sw.counts_in_window(), &[2, 2]);
        assert!(close(sw.value(0).unwrap_or(f64::NAN), 0.0));
        assert_eq!(sw.select(&mut rng), 1);
        // Over the whole history (t = 8, ln 8 = 2.079442) arm 0's mean is 3/5 = 0.6:
        // UCB0 = 0.6 + 0.25·sqrt(2.079442 / 5) = 0.761224 > UCB1 = 0.5 + 0.25·sqrt(2.079442 / 3)
        // = 0.708139, so plain UCB would still pick the stale arm 0.
        assert!(close(plain.ucb(0), 0.761_224));
        assert!(close(plain.ucb(1), 0.708_139));
        assert_eq!(plain.select(&mut rng), 0);

        // An arm whose every play left the window is unplayed again, and comes first.
        for _ in 0..4 {
            sw.update(1, 0.5);
        }
        assert_eq!(sw.counts_in_window(), &[0, 4]);
        assert_eq!(sw.value(0), None);
        assert_eq!(sw.select(&mut rng), 0);
    }

    #[test]
    fn deterministic_under_a_seed() {
        let run = |seed: u64| {
            let mut rng = Rng::new(seed);
            let mut b = SlidingWindowUcb::harl_sketch(3);
            let means = [0.2, 0.5, 0.4];
            let mut picks = Vec::new();
            for _ in 0..200 {
                let a = b.select(&mut rng);
                let r = (means[a] + 0.3 * (rng.unit() - 0.5)).clamp(0.0, 1.0);
                b.update(a, r);
                picks.push(a);
            }
            picks
        };
        assert_eq!(run(11), run(11));
        let picks = run(11);
        let count = |a: usize| picks.iter().filter(|&&p| p == a).count();
        assert!(count(1) > count(0) && count(1) > count(2), "{picks:?}");
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
        s.next(&tasks, &mut rng);
        s.next(&tasks, &mut rng);
        assert_eq!(s.bandit().map(SlidingWindowUcb::steps), Some(1));
        let three = vec![view(1.0, &[1e-3]); 3];
        s.next(&three, &mut rng);
        assert_eq!(s.bandit().map(|b| (b.n_arms(), b.steps())), Some((3, 0)));
        assert_eq!(s.next(&[], &mut rng), 0);
    }
}
