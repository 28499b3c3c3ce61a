//! Adaptive stopping of schedule tracks (HARL, ICPP'22, sections 3, 4.3 and 5).
//!
//! In one episode of HARL's parameter search, `I` initial schedules each start a *schedule
//! track*; "the newly generated schedules are passed to the critic network for evaluation using
//! the advantage function `A_πθ` as defined in Equation 6. The advantage values are passed to
//! the adaptive stopping module which determines whether to stop searching on a track-wise
//! granularity. This module controls the time-allocation `{T^n_i}` for each schedule track `i`
//! ... The episode goes on as long as there are no less than a minimal number of tracks left."
//! The settings are "the window size `λ = 20`, and the elimination ratio `ρ = 0.5`"
//! (section 6.2).
//!
//! Section 5 itself (the stopping rule) and Appendix A.4 are missing from our copy of the
//! paper, so the rule below is the one those sentences and parameters determine, stated
//! explicitly (successive elimination on the windowed advantage):
//!
//! * every step, the caller reports the advantage `A_πθ(s_{i,t}, a_{i,t})` of each live track
//!   ([`AdaptiveStopping::observe`]) and then calls [`AdaptiveStopping::eliminate`] once;
//! * a track's windowed advantage is the mean of its last `λ` advantages,
//!   `Ā_i = (1/λ) Σ_{k=t−λ+1..t} A_{i,k}`; a track with fewer than `λ` observations has no
//!   windowed advantage and is not judged (it is neither eliminated nor counted);
//! * every `λ` steps (steps `λ, 2λ, 3λ, ...` of the episode) the judged tracks are compared and
//!   the `⌈ρ · J⌉` of them (`J` judged) with the lowest `Ā_i` are stopped; the ceiling makes
//!   every round stop at least one track when `ρ > 0`, so an episode always ends; `ρ = 0`
//!   gives fixed-length tracks (the paper's "Hierarchical-RL" ablation);
//! * the episode is done when fewer than `min_tracks` tracks are alive.

use std::collections::VecDeque;

/// The paper's stopping window `λ` (section 6.2: "we set the window size λ = 20").
pub const HARL_STOP_WINDOW: usize = 20;

/// The paper's elimination ratio `ρ` (section 6.2: "the elimination ratio ρ = 0.5").
pub const HARL_STOP_RATIO: f64 = 0.5;

/// One schedule track's record.
#[derive(Clone, Debug, Default)]
struct Track {
    /// Its last `λ` advantages, oldest first.
    recent: VecDeque<f64>,
    /// Advantages observed in the episode.
    observed: usize,
    /// The step it was stopped at (its time allocation `T_i`), while alive `None`.
    stopped_at: Option<usize>,
}

/// Adaptive stopping of the schedule tracks of one episode (see the module documentation for
/// the rule).
#[derive(Clone, Debug)]
pub struct AdaptiveStopping {
    window: usize,
    ratio: f64,
    min_tracks: usize,
    tracks: Vec<Track>,
    step: usize,
}

impl AdaptiveStopping {
    /// Stopping with window `λ = window` (at least 1), elimination ratio `ρ = ratio` (clamped
    /// to `[0, 1]`, NaN taken as 0) and the episode ending below `min_tracks` live tracks; an
    /// episode of `n_tracks` live tracks starts at once (see [`start`](Self::start)).
    pub fn new(window: usize, ratio: f64, min_tracks: usize, n_tracks: usize) -> Self {
        AdaptiveStopping {
            window: window.max(1),
            ratio: if ratio.is_nan() {
                0.0
            } else {
                ratio.clamp(0.0, 1.0)
            },
            min_tracks,
            tracks: vec![Track::default(); n_tracks],
            step: 0,
        }
    }

    /// The paper's settings, `λ = 20` and `ρ = 0.5` (section 6.2), with `min_tracks` (the
    /// paper does not give its minimum) and an episode of `n_tracks` tracks.
    pub fn harl(min_tracks: usize, n_tracks: usize) -> Self {
        Self::new(HARL_STOP_WINDOW, HARL_STOP_RATIO, min_tracks, n_tracks)
    }

    /// Starts a new episode of `n_tracks` live tracks (numbered `0..n_tracks`), at step 0,
    /// forgetting the previous one.
    pub fn start(&mut self, n_tracks: usize) {
        self.tracks = vec![Track::default(); n_tracks];
        self.step = 0;
    }

    /// The window `λ`.
    pub fn window(&self) -> usize {
        self.window
    }

    /// The elimination ratio `ρ`.
    pub fn ratio(&self) -> f64 {
        self.ratio
    }

    /// The fewest live tracks an episode goes on with.
    pub fn min_tracks(&self) -> usize {
        self.min_tracks
    }

    /// Steps of the episode so far (calls of [`eliminate`](Self::eliminate) while it ran).
    pub fn step(&self) -> usize {
        self.step
    }

    /// Tracks in the episode, live or stopped.
    pub fn n_tracks(&self) -> usize {
        self.tracks.len()
    }

    /// Records the advantage `A_πθ` of `track`'s latest step. A stopped or unknown track, or a
    /// non-finite advantage, is refused (returns false, records nothing).
    pub fn observe(&mut self, track: usize, advantage: f64) -> bool {
        let window = self.window;
        match self.tracks.get_mut(track) {
            Some(t) if t.stopped_at.is_none() && advantage.is_finite() => {
                if t.recent.len() == window {
                    t.recent.pop_front();
                }
                t.recent.push_back(advantage);
                t.observed += 1;
                true
            }
            _ => false,
        }
    }

    /// Advantages observed for `track` in this episode.
    pub fn observations(&self, track: usize) -> usize {
        self.tracks.get(track).map_or(0, |t| t.observed)
    }

    /// `Ā_i`: the mean of `track`'s last `λ` advantages; `None` with fewer than `λ`
    /// observations (the track is not judged yet) or for an unknown track.
    pub fn windowed_advantage(&self, track: usize) -> Option<f64> {
        let t = self.tracks.get(track)?;
        (t.recent.len() == self.window).then(|| t.recent.iter().sum::<f64>() / self.window as f64)
    }

    /// Whether `track` is still searched.
    pub fn is_alive(&self, track: usize) -> bool {
        self.tracks
            .get(track)
            .is_some_and(|t| t.stopped_at.is_none())
    }

    /// The live tracks, in order.
    pub fn alive(&self) -> Vec<usize> {
        (0..self.tracks.len())
            .filter(|&i| self.is_alive(i))
            .collect()
    }

    /// The step `track` was stopped at (its time allocation `T_i`); `None` while alive.
    pub fn stopped_at(&self, track: usize) -> Option<usize> {
        self.tracks.get(track).and_then(|t| t.stopped_at)
    }

    /// Whether the episode is over: fewer than `min_tracks` tracks alive ("the episode goes on
    /// as long as there are no less than a minimal number of tracks left").
    pub fn episode_done(&self) -> bool {
        self.tracks
            .iter()
            .filter(|t| t.stopped_at.is_none())
            .count()
            < self.min_tracks
    }

    /// Ends a step (call once per step, after observing its advantages) and returns the tracks
    /// stopped now, in order: at steps `λ, 2λ, ...` the `⌈ρ · J⌉` judged tracks of lowest
    /// windowed advantage (ties: the lower-numbered first), otherwise none. Does nothing once
    /// the episode is done.
    pub fn eliminate(&mut self) -> Vec<usize> {
        if self.episode_done() {
            return Vec::new();
        }
        self.step += 1;
        if !self.step.is_multiple_of(self.window) {
            return Vec::new();
        }
        let mut judged: Vec<(f64, usize)> = (0..self.tracks.len())
            .filter(|&i| self.is_alive(i))
            .filter_map(|i| self.windowed_advantage(i).map(|a| (a, i)))
            .collect();
        judged.sort_by(|x, y| x.0.total_cmp(&y.0).then(x.1.cmp(&y.1)));
        // ⌈ρ·J⌉, robust to ρ·J landing a hair above an integer (0.3 · 10 = 3.0000000000000004).
        let n =
            ((self.ratio * judged.len() as f64 - 1e-9).ceil().max(0.0) as usize).min(judged.len());
        let mut stopped: Vec<usize> = judged[..n].iter().map(|&(_, i)| i).collect();
        for &i in &stopped {
            self.tracks[i].stopped_at = Some(self.step);
        }
        stopped.sort_unstable();
        stopped
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Runs up to `steps` more steps of an episode: every step each live track reports
    /// `adv(track, step)` (steps count from 1), unless `skip(track, step)`; returns the tracks
    /// stopped at each step that stopped any.
    fn run(
        s: &mut AdaptiveStopping,
        steps: usize,
        adv: impl Fn(usize, usize) -> f64,
        skip: impl Fn(usize, usize) -> bool,
    ) -> Vec<(usize, Vec<usize>)> {
        let mut log = Vec::new();
        for _ in 0..steps {
            if s.episode_done() {
                break;
            }
            let step = s.step() + 1;
            for i in s.alive() {
                if !skip(i, step) {
                    assert!(s.observe(i, adv(i, step)));
                }
            }
            let stopped = s.eliminate();
            assert_eq!(s.step(), step);
            if !stopped.is_empty() {
                log.push((step, stopped));
            }
        }
        log
    }

    #[test]
    fn halves_the_tracks_of_lowest_windowed_advantage_every_window() {
        let mut s = AdaptiveStopping::harl(2, 8);
        // Steps 1..=20: track i has advantage i. Steps 21..=40 reverse fortunes among the
        // survivors: track 7 (best so far) drops to 0.5, track 4 to 0; 5 and 6 do well. Over
        // the whole history 4 and 5 would be the worst (means 2.0, 3.5 vs 7's 3.75); over the
        // window it is 4 and 7.
        let adv = |i: usize, step: usize| {
            if step <= 20 {
                i as f64
            } else {
                match i {
                    4 => 0.0,
                    5 => 2.0,
                    6 => 3.0,
                    7 => 0.5,
                    _ => 9.0,
                }
            }
        };
        let log = run(&mut s, 1000, adv, |_, _| false);
        assert_eq!(
            log,
            vec![(20, vec![0, 1, 2, 3]), (40, vec![4, 7]), (60, vec![5])],
            "ρ = 0.5 of 8, of 4, then ⌈0.5 · 2⌉ = 1, at steps λ, 2λ, 3λ"
        );
        assert!(s.episode_done(), "1 live track < min 2");
        assert_eq!(s.alive(), vec![6]);
        assert_eq!(s.stopped_at(0), Some(20));
        assert_eq!(s.stopped_at(7), Some(40));
        assert_eq!(s.stopped_at(6), None);
        assert!(s.eliminate().is_empty());
        assert_eq!(s.step(), 60, "a finished episode takes no more steps");
        assert!(!s.observe(0, 1.0), "a stopped track is not observed");
    }

    #[test]
    fn a_track_with_too_few_observations_is_not_judged() {
        let mut s = AdaptiveStopping::new(5, 0.5, 1, 4);
        // Track 3 has the lowest advantage but reports only from step 3 on: at step 5 it has 3
        // observations < λ = 5, so only 0, 1, 2 are judged and ⌈1.5⌉ = 2 of them stop.
        let log = run(
            &mut s,
            5,
            |i, _| [3.0, 2.0, 1.0, -10.0][i],
            |i, step| i == 3 && step < 3,
        );
        assert_eq!(log, vec![(5, vec![1, 2])]);
        assert_eq!(s.windowed_advantage(3), None);
        assert_eq!(s.observations(3), 3);
        assert!(s.is_alive(3));
        // By step 10 it has a full window and is judged (and is the worst): ⌈0.5 · 2⌉ = 1.
        let log = run(&mut s, 5, |i, _| [3.0, 2.0, 1.0, -10.0][i], |_, _| false);
        assert_eq!(log, vec![(10, vec![3])]);
        assert_eq!(s.windowed_advantage(3), Some(-10.0));
        assert_eq!(s.alive(), vec![0]);
    }

    #[test]
    fn the_episode_ends_below_the_minimum() {
        let mut s = AdaptiveStopping::new(3, 0.5, 3, 4);
        assert!(!s.episode_done());
        let log = run(&mut s, 100, |i, _| i as f64, |_, _| false);
        assert_eq!(log, vec![(3, vec![0, 1])]);
        assert!(s.episode_done());
        assert_eq!(s.alive(), vec![2, 3]);
        // A new episode starts afresh.
        s.start(5);
        assert_eq!((s.step(), s.alive().len()), (0, 5));
        assert!(!s.episode_done());
    }

    #[test]
    fn ties_zero_ratio_and_bad_input() {
        // Equal advantages: the lower-numbered tracks go first; deterministic.
        let mut s = AdaptiveStopping::new(2, 0.5, 1, 4);
        assert_eq!(
            run(&mut s, 2, |_, _| 1.0, |_, _| false),
            vec![(2, vec![0, 1])]
        );
        // ρ = 0: fixed-length tracks, nobody is stopped.
        let mut s = AdaptiveStopping::new(2, 0.0, 1, 3);
        assert!(run(&mut s, 50, |i, _| i as f64, |_, _| false).is_empty());
        assert_eq!(s.alive().len(), 3);
        // ⌈ρ·J⌉ is not thrown off by rounding: 0.3 · 10 stops 3, not 4.
        let mut s = AdaptiveStopping::new(1, 0.3, 1, 10);
        assert_eq!(
            run(&mut s, 1, |i, _| i as f64, |_, _| false),
            vec![(1, vec![0, 1, 2])]
        );
        // Unknown tracks and non-finite advantages are refused.
        assert!(!s.observe(10, 1.0));
        assert!(!s.observe(5, f64::NAN));
        assert_eq!(s.windowed_advantage(99), None);
        // No tracks: done as soon as a minimum is asked for.
        assert!(AdaptiveStopping::harl(1, 0).episode_done());
        let s = AdaptiveStopping::new(0, f64::NAN, 1, 2);
        assert_eq!((s.window(), s.ratio(), s.n_tracks()), (1, 0.0, 2));
    }
}
