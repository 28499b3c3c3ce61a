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
//! gradient estimate (Equations 3 and 4), see [`crate::task_scheduler::SwUcbTaskScheduler`].
//!
//! The paper's settings (section 6.2, also used end to end, section 6.3): `c = 0.25`, window
//! 256 ([`HARL_C`], [`HARL_WINDOW`]).

use harl_build::rng::Rng;

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
}
