//! The GPU search space: one sketch per graph, its parameters sampled at random.
//!
//! The structure, per stage (a reduced form of Ansor's CUDA sketch "SSSRRSRS", without the
//! virtual-thread level and the shared-memory cache reads, which are not built yet):
//! - every elementwise producer is inlined (padding selects too: a branch is cheap on a GPU);
//! - a reduction is tiled `B.. T.. R0.. R1.. I..`: each spatial axis split into a block part
//!   `B`, a thread part `T` and a per-thread register tile `I`, each reduce axis into `R0 R1`;
//!   the `B` loops fused and bound to blocks, the `T` loops fused and bound to threads, the
//!   register tile accumulated in registers (`cache_write` at the thread loop) and unrolled;
//! - every other stage (elementwise, and the output of an elementwise chain) is a flat nest: all
//!   spatial loops fused, split by the threads per block, bound to blocks and threads.
//!
//! Each stage runs as its own kernel; an elementwise consumer of a reduction is not fused as an
//! epilogue yet. The constraints a GPU imposes (threads per block, registers) are checked by
//! construction and by lowering, before a candidate costs a trial.

use crate::lower::{lower, ScheduleError, MAX_ACC_ELEMS, MAX_GPU_THREADS};
use crate::rng::Rng;
use crate::schedule::{Schedule, Step};
use harl_te::Graph;
use serde::{Deserialize, Serialize};

/// Largest register tile per thread (accumulator elements).
pub const MAX_REGISTER_TILE: usize = 64;
/// Thread counts a flat (elementwise) nest may use.
pub const FLAT_THREADS: [usize; 4] = [64, 128, 256, 512];

/// The parameters of one graph's GPU schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuParams {
    /// Per tiled (reduction) stage, per spatial axis: `[threads, register tile]`; the block
    /// part is `ceil(extent / (threads * tile))`.
    pub spatial: Vec<Vec<[usize; 2]>>,
    /// Per tiled stage, per reduce axis: the inner part `R1`.
    pub reduce: Vec<Vec<usize>>,
    /// Index into [`FLAT_THREADS`] for the flat nests.
    pub flat_threads: usize,
    /// Unroll the `R1` loops (the register tile loops always are).
    pub unroll: bool,
}

/// What the sketch does with a stage.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum GpuPlan {
    Inline,
    Tiled,
    Flat,
}

/// The GPU sketch of a graph.
#[derive(Clone, Debug)]
pub struct GpuSketch {
    graph: Graph,
    plans: Vec<GpuPlan>,
}

impl GpuSketch {
    /// The sketch of `graph` (`None` for an invalid graph).
    pub fn new(graph: &Graph) -> Option<Self> {
        graph.validate().ok()?;
        let n = graph.stages.len();
        let plans = graph
            .stages
            .iter()
            .enumerate()
            .map(|(s, st)| match (s + 1 < n, st.reduce.is_some()) {
                (_, true) => GpuPlan::Tiled,
                (true, false) => GpuPlan::Inline,
                (false, false) => GpuPlan::Flat,
            })
            .collect();
        Some(GpuSketch {
            graph: graph.clone(),
            plans,
        })
    }

    /// The graph it schedules.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    fn tiled_stages(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.plans.len()).filter(|&s| self.plans[s] == GpuPlan::Tiled)
    }

    /// A random valid parameter set: register tiles and thread counts from the divisors of each
    /// axis (threads per block within [`MAX_GPU_THREADS`], register tiles within
    /// [`MAX_REGISTER_TILE`]), reduce splits from divisors up to 16.
    pub fn sample(&self, rng: &mut Rng) -> GpuParams {
        let mut spatial = Vec::new();
        let mut reduce = Vec::new();
        for s in self.tiled_stages() {
            let st = &self.graph.stages[s];
            let mut tile_left = MAX_REGISTER_TILE;
            let mut threads_left = MAX_GPU_THREADS;
            // Innermost axes first: they are contiguous, and get first pick of threads.
            let mut axes = vec![[1, 1]; st.shape.len()];
            for a in (0..st.shape.len()).rev() {
                let e = st.shape[a];
                let tile = pick_divisor(e, tile_left.min(8), rng);
                tile_left /= tile;
                let threads = pick_divisor(e / tile, threads_left, rng);
                threads_left /= threads;
                axes[a] = [threads, tile];
            }
            spatial.push(axes);
            let red = st.reduce.as_ref().map_or(&[][..], |r| &r.extents[..]);
            reduce.push(red.iter().map(|&e| pick_divisor(e, 16, rng)).collect());
        }
        GpuParams {
            spatial,
            reduce,
            flat_threads: rng.below(FLAT_THREADS.len()),
            unroll: rng.chance(0.5),
        }
    }

    /// The untuned GPU schedule: a register tile of up to 4 on the two innermost spatial axes,
    /// up to 32 threads along the innermost and 8 along the next (256 per block), reduce
    /// steps of up to 8 unrolled, 256 threads per flat nest.
    pub fn default_params(&self) -> GpuParams {
        let largest = |n: usize, cap: usize| {
            (1..=cap.min(n))
                .rev()
                .find(|d| n.is_multiple_of(*d))
                .unwrap_or(1)
        };
        let mut spatial = Vec::new();
        let mut reduce = Vec::new();
        for s in self.tiled_stages() {
            let st = &self.graph.stages[s];
            let ns = st.shape.len();
            let axes = (0..ns)
                .map(|a| {
                    let e = st.shape[a];
                    let (tile_cap, thread_cap) = match ns - 1 - a {
                        0 => (4, 32),
                        1 => (4, 8),
                        _ => (1, 1),
                    };
                    let tile = largest(e, tile_cap);
                    [largest(e / tile, thread_cap), tile]
                })
                .collect();
            spatial.push(axes);
            let red = st.reduce.as_ref().map_or(&[][..], |r| &r.extents[..]);
            reduce.push(red.iter().map(|&e| largest(e, 8)).collect());
        }
        GpuParams {
            spatial,
            reduce,
            flat_threads: 2,
            unroll: true,
        }
    }

    /// The schedule of `p`, checked by lowering.
    pub fn to_schedule(&self, p: &GpuParams) -> Result<Schedule, ScheduleError> {
        let schedule = Schedule {
            steps: self.build(p)?,
        };
        lower(&self.graph, &schedule)?;
        Ok(schedule)
    }

    fn build(&self, p: &GpuParams) -> Result<Vec<Step>, ScheduleError> {
        let bad = |why: String| ScheduleError::Step {
            index: 0,
            step: Step::BindThread { stage: 0, at: 1 },
            why: format!("parameters: {why}"),
        };
        let n_tiled = self.tiled_stages().count();
        if p.spatial.len() != n_tiled || p.reduce.len() != n_tiled {
            return Err(bad(format!("{n_tiled} tiled stages")));
        }
        let flat_threads = *FLAT_THREADS
            .get(p.flat_threads)
            .ok_or_else(|| bad("flat_threads out of range".into()))?;
        let mut steps = Vec::new();
        for (s, plan) in self.plans.iter().enumerate() {
            if *plan == GpuPlan::Inline {
                steps.push(Step::ComputeInline { stage: s });
            }
        }
        let mut k = 0;
        for (s, plan) in self.plans.iter().enumerate() {
            let st = &self.graph.stages[s];
            match plan {
                GpuPlan::Inline => {}
                GpuPlan::Flat => emit_flat(&mut steps, s, &st.shape, flat_threads),
                GpuPlan::Tiled => {
                    let (sp, red) = (&p.spatial[k], &p.reduce[k]);
                    k += 1;
                    let nr = st.reduce.as_ref().map_or(0, |r| r.extents.len());
                    if sp.len() != st.shape.len() || red.len() != nr {
                        return Err(bad(format!("stage {s}: wrong number of axes")));
                    }
                    let threads: usize = sp.iter().map(|a| a[0]).product();
                    let tile: usize = sp.iter().map(|a| a[1]).product();
                    if threads > MAX_GPU_THREADS || tile > MAX_ACC_ELEMS.min(MAX_REGISTER_TILE) {
                        return Err(bad(format!(
                            "stage {s}: {threads} threads or a register tile of {tile}"
                        )));
                    }
                    emit_tiled(&mut steps, s, sp, red, p.unroll);
                }
            }
        }
        Ok(steps)
    }
}

/// A divisor of `n` within `cap`, uniformly among them.
fn pick_divisor(n: usize, cap: usize, rng: &mut Rng) -> usize {
    let divs: Vec<usize> = (1..=cap.min(n).max(1))
        .filter(|d| n.is_multiple_of(*d))
        .collect();
    divs[rng.below(divs.len())]
}

/// The last spatial axis split by `threads` (at most its extent), the loops outside it fused;
/// blocks over the fused loop, threads over the split-off part.
fn emit_flat(steps: &mut Vec<Step>, s: usize, shape: &[usize], threads: usize) {
    let ns = shape.len();
    let Some(&last) = shape.last() else {
        return;
    };
    steps.push(Step::Split {
        stage: s,
        at: ns - 1,
        factors: vec![threads.min(last)],
    });
    for _ in 1..ns {
        steps.push(Step::Fuse { stage: s, at: 0 });
    }
    steps.push(Step::BindBlock { stage: s, at: 0 });
    steps.push(Step::BindThread { stage: s, at: 1 });
}

/// `B.. T.. R0.. R1.. I..`, blocks and threads bound, the register tile accumulated.
fn emit_tiled(steps: &mut Vec<Step>, s: usize, sp: &[[usize; 2]], red: &[usize], unroll: bool) {
    let ns = sp.len();
    let nr = red.len();
    // Loop list after the splits: axis a (spatial) -> [B, T, I] at 3a, reduce axis j -> [R0, R1]
    // at 3ns + 2j. Split from the last loop back so earlier positions stay put.
    for (j, &r1) in red.iter().enumerate().rev() {
        steps.push(Step::Split {
            stage: s,
            at: ns + j,
            factors: vec![r1],
        });
    }
    for (a, &[t, i]) in sp.iter().enumerate().rev() {
        steps.push(Step::Split {
            stage: s,
            at: a,
            factors: vec![t, i],
        });
    }
    let b = |a: usize| 3 * a;
    let t = |a: usize| 3 * a + 1;
    let i = |a: usize| 3 * a + 2;
    let r0 = |j: usize| 3 * ns + 2 * j;
    let r1 = |j: usize| 3 * ns + 2 * j + 1;
    let mut order: Vec<usize> = (0..ns).map(b).collect();
    order.extend((0..ns).map(t));
    order.extend((0..nr).map(r0));
    order.extend((0..nr).map(r1));
    order.extend((0..ns).map(i));
    steps.push(Step::Reorder { stage: s, order });
    // Fuse the block loops into loop 0, then the thread loops into loop 1.
    for _ in 1..ns {
        steps.push(Step::Fuse { stage: s, at: 0 });
    }
    for _ in 1..ns {
        steps.push(Step::Fuse { stage: s, at: 1 });
    }
    steps.push(Step::BindBlock { stage: s, at: 0 });
    steps.push(Step::BindThread { stage: s, at: 1 });
    steps.push(Step::CacheWrite { stage: s, at: 1 });
    // Loops after fusion: B, T, R0 x nr, R1 x nr, I x ns. The register tile is always
    // unrolled (a dynamically indexed accumulator would live in local memory); `R1` on request.
    let first_r1 = 2 + nr;
    let first = if unroll { first_r1 } else { first_r1 + nr };
    for at in first..first_r1 + nr + ns {
        steps.push(Step::Unroll { stage: s, at });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ops::workloads as w;

    #[test]
    fn samples_lower_and_bind() {
        let mut rng = Rng::new(3);
        for g in [
            w::matmul(64, 48, 80).expect("mm"),
            w::conv2d(1, 8, 14, 14, 16, 3, 3, 1, 1, 1, 1).expect("conv"),
            w::dense_bias_relu(16, 32, 24).expect("dense"),
        ] {
            let sk = GpuSketch::new(&g).expect("sketch");
            for _ in 0..20 {
                let p = sk.sample(&mut rng);
                let s = sk.to_schedule(&p).expect("valid by construction");
                assert!(s.steps.iter().any(|s| matches!(s, Step::BindThread { .. })));
            }
        }
    }

    #[test]
    fn default_params_are_valid() {
        for g in [
            w::matmul(1024, 1024, 1024).expect("mm"),
            w::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1).expect("conv"),
            w::softmax(7, 33).expect("softmax"),
        ] {
            let sk = GpuSketch::new(&g).expect("sketch");
            let p = sk.default_params();
            sk.to_schedule(&p).expect("the default GPU schedule lowers");
        }
        let sk = GpuSketch::new(&w::matmul(1024, 1024, 1024).expect("mm")).expect("sketch");
        assert_eq!(sk.default_params().spatial, vec![vec![[8, 4], [32, 4]]]);
    }

    #[test]
    fn too_many_threads_is_an_error() {
        let g = w::matmul(64, 64, 64).expect("mm");
        let sk = GpuSketch::new(&g).expect("sketch");
        let p = GpuParams {
            spatial: vec![vec![[64, 1], [32, 1]]],
            reduce: vec![vec![1]],
            flat_threads: 0,
            unroll: false,
        };
        assert!(sk.to_schedule(&p).is_err());
    }
}
