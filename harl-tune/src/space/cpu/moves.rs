//! HARL's moves on a CPU sketch: one head of tile moves (a factor moved between two levels of
//! a tiled axis) and four of ±1 steps (compute-at, parallel, unroll, vector), each with a
//! no-op; the state is every level's log size over its axis's log extent, the scalar knobs
//! as fractions of their ranges, and the predicted score.

use super::{CpuSpace, Params, Sketch};
use crate::space::Moves;

/// How a CPU sketch's actions map to the agent's heads, and its state encoding.
pub struct CpuMoves {
    /// (axis, from level, to level) of each tile-move action (action `i + 1`).
    tile_moves: Vec<(usize, usize, usize)>,
    /// Per tiled axis: its extent and levels.
    axes: Vec<(usize, usize)>,
    compute_at: usize,
    parallel: usize,
    unroll: usize,
    vector: usize,
}

impl CpuMoves {
    /// The layout of `sketch`'s knobs.
    pub fn new(sketch: &Sketch) -> CpuMoves {
        let k = sketch.knobs();
        let mut tile_moves = Vec::new();
        for (a, &(_, levels)) in k.tiled_axes.iter().enumerate() {
            for from in 0..levels {
                for to in 0..levels {
                    if from != to {
                        tile_moves.push((a, from, to));
                    }
                }
            }
        }
        CpuMoves {
            tile_moves,
            axes: k.tiled_axes,
            compute_at: k.compute_at_choices,
            parallel: k.parallel_max,
            unroll: k.unroll_choices,
            vector: k.vector_choices,
        }
    }
}

impl Moves<CpuSpace> for CpuMoves {
    fn heads(&self) -> Vec<usize> {
        vec![1 + self.tile_moves.len(), 3, 3, 3, 3]
    }

    fn state_dim(&self) -> usize {
        self.axes.iter().map(|&(_, l)| l).sum::<usize>() + 5
    }

    fn encode(&self, p: &Params, score: f64) -> Vec<f32> {
        let mut v = Vec::with_capacity(self.state_dim());
        for (a, &(extent, levels)) in self.axes.iter().enumerate() {
            let inner = p.tiles.get(a).cloned().unwrap_or_default();
            let prod: usize = inner.iter().product::<usize>().max(1);
            let outer = extent.div_ceil(prod);
            let denom = (extent as f32).log2().max(1.0);
            v.push((outer as f32).log2() / denom);
            for l in 0..levels.saturating_sub(1) {
                v.push((inner.get(l).copied().unwrap_or(1) as f32).log2() / denom);
            }
        }
        let frac = |x: usize, n: usize| {
            if n > 1 {
                x as f32 / (n - 1) as f32
            } else {
                0.0
            }
        };
        v.push(frac(p.compute_at, self.compute_at));
        v.push(if self.parallel > 0 {
            p.parallel as f32 / self.parallel as f32
        } else {
            0.0
        });
        v.push(frac(p.unroll, self.unroll));
        v.push(frac(p.vector, self.vector));
        v.push(score.tanh() as f32);
        v
    }

    fn apply(&self, space: &CpuSpace, p: &Params, action: &[usize]) -> Params {
        let Some(sketch) = space.sketches.get(p.sketch) else {
            return p.clone();
        };
        let delta = |a: usize| match a {
            1 => -1,
            2 => 1,
            _ => 0,
        };
        let mut q = p.clone();
        if let Some(&(axis, from, to)) = action
            .first()
            .and_then(|&a| a.checked_sub(1))
            .and_then(|i| self.tile_moves.get(i))
        {
            if let Some(n) = sketch.tile_move(&q, axis, from, to) {
                q = n;
            }
        }
        type Step = fn(&Sketch, &Params, i32) -> Option<Params>;
        let steps: [Step; 4] = [
            Sketch::step_compute_at,
            Sketch::step_parallel,
            Sketch::step_unroll,
            Sketch::step_vector,
        ];
        for (h, step) in steps.iter().enumerate() {
            let d = delta(action.get(h + 1).copied().unwrap_or(0));
            if d != 0 {
                if let Some(n) = step(sketch, &q, d) {
                    q = n;
                }
            }
        }
        q
    }
}
