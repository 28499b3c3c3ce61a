//! HARL's parameter level on the GPU sketch: the PPO actor-critic moves tile factors between a
//! GPU schedule's levels along schedule tracks, adaptive stopping ends the unpromising tracks,
//! and the top of the visited schedules by predicted score are measured (the paper's
//! Algorithm 1 with the CPU sketch's knobs replaced by the GPU sketch's).
//!
//! Actions, one per head, each with a no-op: a tile move (the smallest prime factor of one
//! level of an axis moved to another: spatial axes have the levels block, virtual thread,
//! thread and register tile, reduce axes `R0` and `R1`), shared staging off/on, unroll off/on.
//! The GPU sketch has one structure, so there is no sketch bandit; a single kernel is one task,
//! so no task bandit either (the CPU search's [`crate::task_scheduler`] does that level).
//! The agent keeps its weights across rounds of one search.

use crate::cost_model::CostModel;
use crate::features;
use crate::strategy::harl::ppo::{ActionSpace, Agent, PpoConfig, Transition};
use crate::strategy::harl::stopping::AdaptiveStopping;
use crate::strategy::harl::{
    record_step, relative_reward, spread, trajectories, HarlConfig, HasTransitions,
};
use harl_build::gpu_sketch::{GpuParams, GpuSketch};
use harl_build::lower::lower;
use harl_build::rng::Rng;
use std::collections::HashSet;

/// One tunable axis: (tiled stage, axis), spatial or reduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Axis {
    Spatial { k: usize, a: usize, extent: usize },
    Reduce { k: usize, j: usize, extent: usize },
}

impl Axis {
    fn n_levels(self) -> usize {
        match self {
            Axis::Spatial { .. } => 4,
            Axis::Reduce { .. } => 2,
        }
    }

    fn extent(self) -> usize {
        match self {
            Axis::Spatial { extent, .. } | Axis::Reduce { extent, .. } => extent,
        }
    }

    /// The level sizes: spatial `[B, V, T, I]`, reduce `[R0, R1]`.
    fn levels(self, p: &GpuParams) -> Option<Vec<usize>> {
        match self {
            Axis::Spatial { k, a, extent } => {
                let [t, i] = *p.spatial.get(k)?.get(a)?;
                let v = p
                    .vthreads
                    .get(k)
                    .and_then(|v| v.get(a))
                    .copied()
                    .unwrap_or(1);
                let inner = (v * t * i).max(1);
                Some(vec![extent.div_ceil(inner), v, t, i])
            }
            Axis::Reduce { k, j, extent } => {
                let r1 = *p.reduce.get(k)?.get(j)?;
                Some(vec![extent.div_ceil(r1.max(1)), r1])
            }
        }
    }

    fn set_levels(self, p: &mut GpuParams, l: &[usize]) {
        match self {
            Axis::Spatial { k, a, .. } => {
                p.spatial[k][a] = [l[2], l[3]];
                if p.vthreads.len() != p.spatial.len() {
                    p.vthreads = p.spatial.iter().map(|s| vec![1; s.len()]).collect();
                }
                p.vthreads[k][a] = l[1];
            }
            Axis::Reduce { k, j, .. } => p.reduce[k][j] = l[1],
        }
    }
}

fn smallest_prime_factor(n: usize) -> Option<usize> {
    (2..=n).find(|d| n.is_multiple_of(*d))
}

/// The agent's view of one GPU sketch: its axes, moves and state encoding.
struct Layout {
    axes: Vec<Axis>,
    /// (axis, from level, to level) of tile-move action `i + 1`.
    moves: Vec<(usize, usize, usize)>,
    n_tiled: usize,
}

impl Layout {
    fn new(sketch: &GpuSketch) -> Layout {
        let p = sketch.default_params();
        let mut axes = Vec::new();
        let graph = sketch.graph();
        let tiled: Vec<usize> = (0..graph.stages.len())
            .filter(|&s| graph.stages[s].reduce.is_some())
            .collect();
        for (k, &s) in tiled.iter().enumerate().take(p.spatial.len()) {
            let st = &graph.stages[s];
            for (a, &extent) in st.shape.iter().enumerate() {
                axes.push(Axis::Spatial { k, a, extent });
            }
            for (j, &extent) in st.reduce.iter().flat_map(|r| &r.extents).enumerate() {
                axes.push(Axis::Reduce { k, j, extent });
            }
        }
        let mut moves = Vec::new();
        for (x, axis) in axes.iter().enumerate() {
            for from in 0..axis.n_levels() {
                for to in 0..axis.n_levels() {
                    if from != to {
                        moves.push((x, from, to));
                    }
                }
            }
        }
        Layout {
            axes,
            moves,
            n_tiled: p.spatial.len(),
        }
    }

    fn space(&self) -> ActionSpace {
        ActionSpace {
            heads: vec![1 + self.moves.len(), 3, 3],
        }
    }

    fn state_dim(&self) -> usize {
        self.axes.iter().map(|a| a.n_levels()).sum::<usize>() + self.n_tiled * 2 + 2
    }

    /// Each level's log size over its axis's log extent, the staging and cross-thread flags
    /// per stage, unroll, and the predicted score.
    fn encode(&self, p: &GpuParams, score: f64) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.state_dim());
        for axis in &self.axes {
            let denom = (axis.extent() as f32).log2().max(1.0);
            let levels = axis.levels(p).unwrap_or_else(|| vec![1; axis.n_levels()]);
            v.extend(levels.iter().map(|&l| (l.max(1) as f32).log2() / denom));
        }
        for k in 0..self.n_tiled {
            v.push(f32::from(u8::from(
                p.shared.get(k).copied().unwrap_or(false),
            )));
            v.push(f32::from(u8::from(
                p.cross_thread.get(k).is_some_and(|c| !c.is_empty()),
            )));
        }
        v.push(f32::from(u8::from(p.unroll)));
        v.push(score.tanh() as f32);
        v
    }

    /// Applies one action per head; an illegal result (too many threads, too large a tile or
    /// box) leaves the parameters as they were.
    fn apply(&self, sketch: &GpuSketch, p: &GpuParams, action: &[usize]) -> GpuParams {
        let mut q = p.clone();
        if let Some(&(x, from, to)) = action
            .first()
            .and_then(|&a| a.checked_sub(1))
            .and_then(|i| self.moves.get(i))
        {
            let axis = self.axes[x];
            if let Some(mut l) = axis.levels(&q) {
                if let Some(f) = smallest_prime_factor(l[from]) {
                    l[from] /= f;
                    l[to] *= f;
                    // The outer level is implied: the inner ones must keep dividing the extent.
                    let inner: usize = l[1..].iter().product();
                    if axis.extent().is_multiple_of(inner) {
                        let mut r = q.clone();
                        axis.set_levels(&mut r, &l);
                        if sketch.to_schedule(&r).is_ok() {
                            q = r;
                        }
                    }
                }
            }
        }
        let toggle = |a: Option<&usize>| match a {
            Some(1) => Some(false),
            Some(2) => Some(true),
            _ => None,
        };
        if let Some(on) = toggle(action.get(1)) {
            let mut r = q.clone();
            r.shared = vec![on; self.n_tiled];
            if sketch.to_schedule(&r).is_ok() {
                q = r;
            }
        }
        if let Some(on) = toggle(action.get(2)) {
            let r = GpuParams {
                unroll: on,
                ..q.clone()
            };
            // Unrolling a long `R1` may exceed the unroll limit.
            if sketch.to_schedule(&r).is_ok() {
                q = r;
            }
        }
        q
    }
}

/// HARL's parameter search over one GPU sketch.
pub struct GpuHarl {
    config: HarlConfig,
    layout: Layout,
    agent: Agent,
}

struct Track {
    params: GpuParams,
    score: f64,
    transitions: Vec<Transition>,
}

impl HasTransitions for Track {
    fn transitions(&mut self) -> &mut Vec<Transition> {
        &mut self.transitions
    }
}

impl GpuHarl {
    /// A search over `sketch` with HARL's parameters (tracks, steps, stopping, PPO).
    pub fn new(sketch: &GpuSketch, config: HarlConfig, seed: u64) -> Self {
        let layout = Layout::new(sketch);
        let agent = Agent::new(
            layout.state_dim(),
            layout.space(),
            PpoConfig {
                seed,
                ..config.ppo.clone()
            },
        );
        GpuHarl {
            config,
            layout,
            agent,
        }
    }

    /// One round: an episode of tracks (a quarter from `elite`, the best measured, the rest
    /// random samples), the agent trained on its transitions, and up to `batch` visited
    /// schedules not in `seen`, best predicted first.
    pub fn propose(
        &mut self,
        sketch: &GpuSketch,
        elite: &[GpuParams],
        seen: &HashSet<GpuParams>,
        model: &dyn CostModel,
        batch: usize,
        rng: &mut Rng,
    ) -> Vec<GpuParams> {
        let cfg = self.config.clone();
        let score = |ps: &[GpuParams]| -> Vec<f64> {
            let feats: Vec<Vec<f32>> = ps
                .iter()
                .map(|p| {
                    sketch
                        .to_schedule(p)
                        .ok()
                        .and_then(|s| lower(sketch.graph(), &s).ok())
                        .map_or_else(
                            || vec![0.0; features::FEATURE_LEN],
                            |pr| features::extract(&pr),
                        )
                })
                .collect();
            match model.predict(&feats) {
                Ok(s) if s.len() == ps.len() => s
                    .into_iter()
                    .map(|x| if x.is_finite() { x } else { 0.0 })
                    .collect(),
                _ => vec![0.0; ps.len()],
            }
        };
        let mut starts: Vec<GpuParams> = elite.iter().take(cfg.tracks / 4).cloned().collect();
        while starts.len() < cfg.tracks {
            starts.push(sketch.sample(rng));
        }
        let initial = score(&starts);
        let scale = spread(&initial).max(1e-6);
        let mut tracks: Vec<Track> = starts
            .into_iter()
            .zip(&initial)
            .map(|(params, &score)| Track {
                params,
                score,
                transitions: Vec::new(),
            })
            .collect();
        let mut visited: Vec<(f64, GpuParams)> = Vec::new();
        let mut in_visited: HashSet<GpuParams> = HashSet::new();
        for t in &tracks {
            if in_visited.insert(t.params.clone()) {
                visited.push((t.score, t.params.clone()));
            }
        }
        let mut stopping = AdaptiveStopping::new(
            cfg.stop_window,
            cfg.stop_ratio,
            cfg.min_tracks.min(tracks.len()),
            tracks.len(),
        );
        let layout = &self.layout;
        let encode = |t: &Track| layout.encode(&t.params, t.score / scale);
        let mut alive: Vec<usize> = (0..tracks.len()).collect();
        let states: Vec<Vec<f32>> = alive.iter().map(|&i| encode(&tracks[i])).collect();
        let mut pending = self.agent.act_batch(&states, rng);
        for _ in 0..cfg.max_steps {
            if alive.is_empty() || stopping.episode_done() {
                break;
            }
            let before: Vec<Vec<f32>> = alive.iter().map(|&i| encode(&tracks[i])).collect();
            let next: Vec<GpuParams> = alive
                .iter()
                .zip(&pending)
                .map(|(&i, (action, _, _))| layout.apply(sketch, &tracks[i].params, action))
                .collect();
            let scores = score(&next);
            let mut rewards = Vec::with_capacity(alive.len());
            for ((&i, p), &s) in alive.iter().zip(next).zip(&scores) {
                rewards.push(relative_reward(tracks[i].score, s, scale));
                if in_visited.insert(p.clone()) {
                    visited.push((s, p.clone()));
                }
                tracks[i].params = p;
                tracks[i].score = s;
            }
            let after: Vec<Vec<f32>> = alive.iter().map(|&i| encode(&tracks[i])).collect();
            let following = self.agent.act_batch(&after, rng);
            (alive, pending) = record_step(
                &mut tracks,
                &alive,
                &pending,
                &following,
                &before,
                &rewards,
                cfg.ppo.gamma as f32,
                &mut stopping,
            );
        }
        let trajectories = trajectories(&alive, tracks);
        if !trajectories.is_empty() {
            self.agent.train(&trajectories);
        }
        visited.sort_by(|a, b| b.0.total_cmp(&a.0));
        visited
            .into_iter()
            .map(|(_, p)| p)
            .filter(|p| !seen.contains(p))
            .take(batch)
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ops::workloads as w;

    #[test]
    fn tile_moves_keep_the_extent_and_stay_legal() {
        let g = w::matmul(64, 48, 32).expect("mm");
        let sk = GpuSketch::new(&g).expect("sketch");
        let layout = Layout::new(&sk);
        // Two spatial axes (4 levels: 12 moves each) and one reduce axis (2 moves).
        assert_eq!(layout.moves.len(), 12 + 12 + 2);
        let p = sk.default_params();
        let mut rng = Rng::new(1);
        let mut changed = 0;
        for m in 0..layout.moves.len() {
            let q = layout.apply(&sk, &p, &[m + 1, 0, 0]);
            sk.to_schedule(&q).expect("moves stay legal");
            for axis in &layout.axes {
                let l = axis.levels(&q).expect("levels");
                let inner: usize = l[1..].iter().product();
                assert_eq!(l[0] * inner, axis.extent(), "{axis:?} {l:?}");
            }
            changed += usize::from(q != p);
        }
        assert!(
            changed > layout.moves.len() / 2,
            "{changed} moves changed anything"
        );
        // The state has the advertised length, finite.
        let s = layout.encode(&sk.sample(&mut rng), 0.3);
        assert_eq!(s.len(), layout.state_dim());
        assert!(s.iter().all(|x| x.is_finite()));
        // Staging toggles.
        let off = layout.apply(&sk, &p, &[0, 1, 0]);
        assert_eq!(off.shared, vec![false]);
        assert_eq!(layout.apply(&sk, &off, &[0, 2, 0]).shared, vec![true]);
    }
}
