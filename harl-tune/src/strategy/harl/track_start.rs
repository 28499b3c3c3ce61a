//! Where HARL's schedule tracks start: from the sketch's best measured schedules (elite) or
//! from random fillings, and, when adaptive, in what share.
//!
//! Not in the paper (its tracks all start from random fillings). With a fixed share the
//! 1,000-trial comparison found no share that wins everywhere: half the tracks from the elite
//! gained 3% on a batched GEMM and 8% on a 3x3 conv but lost 14% on a 512^3 GEMM, whose better
//! region the random tracks find. So the adaptive start credits each measured schedule to the
//! start its track had, with its gain over the task's best before it (`ln(best / latency)`,
//! 0 when slower), and sets the elite share to the elite starts' part of the mean gains over a
//! sliding window: probability matching between the two starts, a bandit level below the
//! sketch bandit.

use std::collections::VecDeque;

/// Where a schedule track started.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Origin {
    /// From one of the sketch's best measured schedules.
    Elite,
    /// From a random filling of the sketch.
    Random,
}

/// The gains of the last `window` measured schedules whose track start is known.
#[derive(Clone, Debug)]
pub struct TrackStartCredit {
    window: usize,
    /// Fewest credited schedules of each start before the share moves off the fixed one.
    min_each: usize,
    /// The share's bounds: neither start is ever dropped.
    bounds: (f64, f64),
    gains: VecDeque<(Origin, f64)>,
}

impl TrackStartCredit {
    /// A credit window of `window` schedules (at least 1); the share leaves the fixed one once
    /// both starts have `min_each` schedules in the window, and stays within `bounds`.
    pub fn new(window: usize, min_each: usize, bounds: (f64, f64)) -> Self {
        TrackStartCredit {
            window: window.max(1),
            min_each,
            bounds,
            gains: VecDeque::new(),
        }
    }

    /// Credits one measured schedule: `gain` is `ln(best before / its latency)` floored at 0
    /// (a non-finite gain is taken as 0).
    pub fn observe(&mut self, origin: Origin, gain: f64) {
        if self.gains.len() == self.window {
            self.gains.pop_front();
        }
        let gain = if gain.is_finite() { gain.max(0.0) } else { 0.0 };
        self.gains.push_back((origin, gain));
    }

    /// The mean gain and count of `origin`'s schedules in the window.
    fn mean(&self, origin: Origin) -> (f64, usize) {
        let (sum, n) = self
            .gains
            .iter()
            .filter(|(o, _)| *o == origin)
            .fold((0.0, 0usize), |(s, n), (_, g)| (s + g, n + 1));
        (if n > 0 { sum / n as f64 } else { 0.0 }, n)
    }

    /// The share of tracks to start from the elite: `fixed` until both starts have enough
    /// schedules in the window or while neither gained, else the elite's part of the two mean
    /// gains, within the bounds.
    pub fn elite_share(&self, fixed: f64) -> f64 {
        let (elite, n_elite) = self.mean(Origin::Elite);
        let (random, n_random) = self.mean(Origin::Random);
        if n_elite < self.min_each || n_random < self.min_each || elite + random <= 0.0 {
            return fixed;
        }
        (elite / (elite + random)).clamp(self.bounds.0, self.bounds.1)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_share_stays_fixed_until_both_starts_have_evidence() {
        let mut c = TrackStartCredit::new(8, 2, (0.125, 0.75));
        assert_eq!(c.elite_share(0.25), 0.25);
        c.observe(Origin::Elite, 0.3);
        c.observe(Origin::Elite, 0.1);
        c.observe(Origin::Random, 0.1);
        assert_eq!(
            c.elite_share(0.25),
            0.25,
            "one random schedule is not enough"
        );
        c.observe(Origin::Random, 0.0);
        // Elite mean 0.2, random 0.05: 0.2 / 0.25 = 0.8, capped at 0.75.
        assert!((c.elite_share(0.25) - 0.75).abs() < 1e-12);
    }

    #[test]
    fn the_share_follows_the_gains_and_forgets_outside_the_window() {
        let mut c = TrackStartCredit::new(4, 1, (0.125, 0.75));
        c.observe(Origin::Elite, 0.1);
        c.observe(Origin::Random, 0.3);
        // 0.1 / 0.4.
        assert!((c.elite_share(0.5) - 0.25).abs() < 1e-12);
        // Slower schedules gain nothing, not a negative amount.
        c.observe(Origin::Random, -5.0);
        c.observe(Origin::Elite, f64::NAN);
        // Elite (0.1 + 0) / 2 = 0.05, random (0.3 + 0) / 2 = 0.15: 0.25.
        assert!((c.elite_share(0.5) - 0.25).abs() < 1e-12);
        // Four more zero gains push every gain out of the window: back to the fixed share.
        for o in [Origin::Elite, Origin::Random, Origin::Elite, Origin::Random] {
            c.observe(o, 0.0);
        }
        assert_eq!(c.elite_share(0.5), 0.5);
        c.observe(Origin::Random, 0.01);
        // Only the random start gains: the elite keeps its floor.
        assert!((c.elite_share(0.5) - 0.125).abs() < 1e-12);
    }
}
