//! The GPU search space: one sketch ([`GpuSketch`], in harl-build because the build emits its
//! default schedule) whose parameters are each tiled stage's threads, virtual threads and
//! register tile per spatial axis, the reduce split, shared staging and unroll.
//!
//! HARL's moves on it ([`GpuMoves`]), one head each with a no-op: a tile move (the smallest
//! prime factor of one level of an axis moved to another: spatial axes have the levels block,
//! virtual thread, thread and register tile, reduce axes `R0` and `R1`), shared staging
//! off/on, unroll off/on. An illegal result (too many threads, too large a tile or box) leaves
//! the parameters as they were. The state is each level's log size over its axis's log
//! extent, the staging and cross-thread flags per stage, unroll, and the predicted score.

pub use harl_build::gpu_sketch::{GpuParams, GpuSketch};

use crate::space::{Moves, SearchSpace};
use harl_build::rng::Rng;
use harl_build::schedule::Schedule;
use harl_te::Graph;

/// A task's GPU search space: its one sketch.
pub struct GpuSpace {
    sketch: GpuSketch,
}

impl GpuSpace {
    /// The GPU space of `graph`, or `None` when it has no GPU schedule (no spatial loop).
    pub fn new(graph: &Graph) -> Option<Self> {
        GpuSketch::new(graph).map(|sketch| GpuSpace { sketch })
    }

    /// The sketch.
    pub fn sketch(&self) -> &GpuSketch {
        &self.sketch
    }
}

impl SearchSpace for GpuSpace {
    type Params = GpuParams;
    type Moves = GpuMoves;

    fn graph(&self) -> &Graph {
        self.sketch.graph()
    }
    fn sketch_count(&self) -> usize {
        1
    }
    fn sketch_of(&self, _: &GpuParams) -> usize {
        0
    }
    fn sample(&self, _: usize, rng: &mut Rng) -> GpuParams {
        self.sketch.sample(rng)
    }
    fn mutate(&self, params: &GpuParams, rng: &mut Rng) -> GpuParams {
        self.sketch.mutate(params, rng)
    }
    fn to_schedule(&self, params: &GpuParams) -> Option<Schedule> {
        self.sketch.to_schedule(params).ok()
    }
    fn defaults(&self) -> Vec<GpuParams> {
        vec![self.sketch.default_params()]
    }
    fn moves(&self, _: usize) -> GpuMoves {
        GpuMoves::new(&self.sketch)
    }
}

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

/// HARL's view of a GPU sketch: its axes, tile moves and state encoding.
pub struct GpuMoves {
    axes: Vec<Axis>,
    /// (axis, from level, to level) of tile-move action `i + 1`.
    moves: Vec<(usize, usize, usize)>,
    n_tiled: usize,
}

impl GpuMoves {
    /// The layout of `sketch`'s parameters.
    pub fn new(sketch: &GpuSketch) -> GpuMoves {
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
        GpuMoves {
            axes,
            moves,
            n_tiled: p.spatial.len(),
        }
    }
}

impl Moves<GpuSpace> for GpuMoves {
    fn heads(&self) -> Vec<usize> {
        vec![1 + self.moves.len(), 3, 3]
    }

    fn state_dim(&self) -> usize {
        self.axes.iter().map(|a| a.n_levels()).sum::<usize>() + self.n_tiled * 2 + 2
    }

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

    fn apply(&self, space: &GpuSpace, p: &GpuParams, action: &[usize]) -> GpuParams {
        let sketch = &space.sketch;
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

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ops::workloads as w;

    #[test]
    fn tile_moves_keep_the_extent_and_stay_legal() {
        let g = w::matmul(64, 48, 32).expect("mm");
        let sk = GpuSketch::new(&g).expect("sketch");
        let space = GpuSpace { sketch: sk.clone() };
        let layout = GpuMoves::new(&sk);
        // Two spatial axes (4 levels: 12 moves each) and one reduce axis (2 moves).
        assert_eq!(layout.moves.len(), 12 + 12 + 2);
        let p = sk.default_params();
        let mut rng = Rng::new(1);
        let mut changed = 0;
        for m in 0..layout.moves.len() {
            let q = layout.apply(&space, &p, &[m + 1, 0, 0]);
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
        let off = layout.apply(&space, &p, &[0, 1, 0]);
        assert_eq!(off.shared, vec![false]);
        assert_eq!(layout.apply(&space, &off, &[0, 2, 0]).shared, vec![true]);
    }
}
