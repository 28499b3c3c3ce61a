//! The GPU search space: one sketch per graph, its parameters sampled at random.
//!
//! The structure, per stage (a reduced form of Ansor's CUDA sketch "SSSRRSRS"):
//! - every elementwise producer is inlined (padding selects too: a branch is cheap on a GPU);
//! - a reduction is tiled `B.. T.. R0.. R1.. V.. I..`: each spatial axis split into a block
//!   part `B`, a virtual-thread part `V`, a thread part `T` and a per-thread register tile `I`
//!   (split in that order, so an element's index is `b·VTI + v·TI + t·I + i`), each reduce
//!   axis into `R0 R1`; the `B` loops fused and bound to blocks, the `T` loops fused and bound
//!   to threads, the `V × I` tile accumulated in registers (`cache_write` at the thread loop)
//!   and unrolled. Virtual threads are Ansor's answer to coalescing with register tiles: with
//!   `I = 1`, neighbouring threads touch neighbouring elements at every `v`, yet each thread
//!   still accumulates `V` outputs. When [`GpuParams::shared`] asks for it, every graph input
//!   the stage reads is staged in shared memory at the innermost `R0` loop (Ansor's cache
//!   read): per `R0` step the block copies the box its threads' `R1 × V × I` loops read,
//!   coalesced, and each element fetched from global memory once per block is then read from
//!   shared memory by every thread that needs it (a GEMM tile's rows by all its columns);
//! - a reduction with little spatial parallelism and a long reduction (Ansor's cross-thread
//!   reduction, when [`GpuParams::cross_thread`] asks for it) instead binds its fused spatial
//!   loops to blocks and a share of each reduce axis to threads, `B T R..`: each thread
//!   accumulates a partial result in a register and the block combines the partials in shared
//!   memory (see [`crate::loop_ir::LoopKind::GpuThreadReduce`]);
//! - an elementwise output over the shape of the last tiled stage (a bias and activation after a
//!   GEMM or convolution) is that stage's epilogue: each thread computes it over its own
//!   register tile right after the write-back, in the same kernel;
//! - every other stage (elementwise, and the output of an elementwise chain) is a flat nest: all
//!   spatial loops fused, split by the threads per block, bound to blocks and threads.
//!
//! Each other stage runs as its own kernel. The constraints a GPU imposes (threads per block,
//! shared memory, register tile) are checked by construction and by lowering, before a
//! candidate costs a trial.

use crate::lower::{lower, ScheduleError, MAX_ACC_ELEMS, MAX_GPU_THREADS};
use crate::rng::Rng;
use crate::schedule::{Schedule, Step};
use harl_te::Graph;
use serde::{Deserialize, Serialize};

/// Largest register tile per thread (accumulator elements).
pub const MAX_REGISTER_TILE: usize = 64;
/// Shortest reduction (product of the reduce extents) offered a cross-thread reduction.
pub const CROSS_THREAD_MIN_REDUCE: usize = 32;
/// Thread counts a flat (elementwise) nest may use.
pub const FLAT_THREADS: [usize; 4] = [64, 128, 256, 512];

/// The parameters of one graph's GPU schedule.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct GpuParams {
    /// Per tiled (reduction) stage, per spatial axis: `[threads, register tile]`; the block
    /// part is `ceil(extent / (vthreads * threads * tile))`.
    pub spatial: Vec<Vec<[usize; 2]>>,
    /// Per tiled stage, per spatial axis: virtual threads (strided register-tile copies per
    /// thread). Empty (as in records written before they existed) means 1 everywhere.
    #[serde(default)]
    pub vthreads: Vec<Vec<usize>>,
    /// Per tiled stage, per reduce axis: the inner part `R1`.
    pub reduce: Vec<Vec<usize>>,
    /// Per tiled stage: empty for the tiled plan, or per reduce axis the threads that share it
    /// (a cross-thread reduction; `spatial`, `vthreads` and `reduce` of the stage are then
    /// unused). Missing (as in records written before it existed) means tiled everywhere.
    #[serde(default)]
    pub cross_thread: Vec<Vec<usize>>,
    /// Per tiled stage: stage the graph inputs it reads in shared memory at its innermost
    /// `R0` loop (the tiled plan only). Missing (as in records written before it existed)
    /// means no staging.
    #[serde(default)]
    pub shared: Vec<bool>,
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
    /// The output, elementwise over the tiled stage given: computed by each thread over its
    /// own register tile right after writing it back (one kernel instead of two), or a flat
    /// nest when that stage is a cross-thread reduction (only thread 0 holds its results).
    Epilogue(usize),
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
        let mut sketch = GpuSketch {
            graph: graph.clone(),
            plans,
        };
        sketch.fuse_epilogue();
        Some(sketch)
    }

    /// Makes the output an epilogue of the last tiled stage when it is elementwise over the
    /// same shape, and keeps it so only if the default schedule then lowers (the output must
    /// read that stage at its own index, which lowering checks).
    fn fuse_epilogue(&mut self) {
        let Some(last) = self.plans.len().checked_sub(1) else {
            return;
        };
        if self.plans[last] != GpuPlan::Flat {
            return;
        }
        let Some(t) = (0..last).rev().find(|&t| self.plans[t] == GpuPlan::Tiled) else {
            return;
        };
        if self.graph.stages[t].shape != self.graph.stages[last].shape {
            return;
        }
        self.plans[last] = GpuPlan::Epilogue(t);
        let mut p = self.default_params();
        p.shared.iter_mut().for_each(|b| *b = false);
        // The tiled plan, where the epilogue attaches (over a cross-thread one it is flat).
        p.cross_thread.iter_mut().for_each(Vec::clear);
        if self.to_schedule(&p).is_err() {
            self.plans[last] = GpuPlan::Flat;
        }
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
        let mut vthreads = Vec::new();
        let mut reduce = Vec::new();
        let mut cross_thread = Vec::new();
        let mut shared = Vec::new();
        for s in self.tiled_stages() {
            let st = &self.graph.stages[s];
            shared.push(rng.chance(0.75));
            let mut tile_left = MAX_REGISTER_TILE;
            let mut threads_left = MAX_GPU_THREADS;
            // Innermost axes first: they are contiguous, and get first pick of threads.
            let mut axes = vec![[1, 1]; st.shape.len()];
            let mut virt = vec![1; st.shape.len()];
            for a in (0..st.shape.len()).rev() {
                let e = st.shape[a];
                let tile = pick_divisor(e, tile_left.min(8), rng);
                tile_left /= tile;
                // Half the time no virtual threads, so plain tiles stay as likely as before.
                let v = if rng.chance(0.5) {
                    pick_divisor(e / tile, tile_left.min(8), rng)
                } else {
                    1
                };
                tile_left /= v;
                let threads = pick_divisor(e / (tile * v), threads_left, rng);
                threads_left /= threads;
                axes[a] = [threads, tile];
                virt[a] = v;
            }
            spatial.push(axes);
            vthreads.push(virt);
            let red = st.reduce.as_ref().map_or(&[][..], |r| &r.extents[..]);
            reduce.push(red.iter().map(|&e| pick_divisor(e, 16, rng)).collect());
            // Likelier where the output alone cannot fill the GPU.
            let chance = if st.size() < reduce_len(st) {
                0.75
            } else {
                0.25
            };
            cross_thread.push(if cross_thread_fits(st) && rng.chance(chance) {
                let mut threads_left = MAX_GPU_THREADS;
                let mut threads = vec![1; red.len()];
                for j in (0..red.len()).rev() {
                    threads[j] = pick_divisor(red[j], threads_left, rng);
                    threads_left /= threads[j];
                }
                threads
            } else {
                Vec::new()
            });
        }
        let p = GpuParams {
            spatial,
            vthreads,
            reduce,
            cross_thread,
            shared,
            flat_threads: rng.below(FLAT_THREADS.len()),
            unroll: rng.chance(0.5),
        };
        self.fit_shared(p)
    }

    /// `p` with one component taken from a fresh sample (the evolutionary search's mutation):
    /// one spatial axis's threads, tile and virtual threads, one stage's reduce splits, its
    /// cross-thread plan or its staging, the flat threads, or the unroll. Returns `p` itself
    /// when the mutant does not lower.
    pub fn mutate(&self, p: &GpuParams, rng: &mut Rng) -> GpuParams {
        let q = self.sample(rng);
        let mut m = p.clone();
        let n = q.spatial.len();
        let pick = rng.below(2 + 4 * n.max(1));
        if n == 0 || pick < 2 {
            if pick == 0 {
                m.flat_threads = q.flat_threads;
            } else {
                m.unroll = q.unroll;
            }
        } else {
            let k = (pick - 2) / 4;
            match (pick - 2) % 4 {
                0 => {
                    let axes = q.spatial[k].len();
                    if axes > 0 && m.spatial.get(k).is_some_and(|a| a.len() == axes) {
                        let a = rng.below(axes);
                        m.spatial[k][a] = q.spatial[k][a];
                        if m.vthreads.len() != n {
                            m.vthreads = q.spatial.iter().map(|s| vec![1; s.len()]).collect();
                        }
                        m.vthreads[k][a] = q
                            .vthreads
                            .get(k)
                            .and_then(|v| v.get(a))
                            .copied()
                            .unwrap_or(1);
                    }
                }
                1 => {
                    if let (Some(r), Some(new)) = (m.reduce.get_mut(k), q.reduce.get(k)) {
                        r.clone_from(new);
                    }
                }
                2 => {
                    if m.cross_thread.len() != n {
                        m.cross_thread = vec![Vec::new(); n];
                    }
                    m.cross_thread[k] = q.cross_thread.get(k).cloned().unwrap_or_default();
                }
                _ => {
                    if m.shared.len() != n {
                        m.shared = vec![false; n];
                    }
                    m.shared[k] = !m.shared[k];
                }
            }
        }
        if self.to_schedule(&m).is_ok() {
            m
        } else {
            p.clone()
        }
    }

    /// `p`, without shared staging if its boxes do not fit a block's shared memory (the one
    /// constraint construction does not ensure).
    fn fit_shared(&self, mut p: GpuParams) -> GpuParams {
        if p.shared.iter().any(|&b| b) && self.to_schedule(&p).is_err() {
            p.shared.iter_mut().for_each(|b| *b = false);
        }
        p
    }

    /// The graph inputs stage `s` reads once its elementwise producers are inlined, in order.
    fn inputs_read(&self, s: usize) -> Vec<usize> {
        fn walk(g: &Graph, plans: &[GpuPlan], s: usize, out: &mut Vec<usize>) {
            g.stages[s].body.visit(&mut |e| match e {
                // A scalar (0-d) input is read once per thread: nothing to stage.
                harl_te::Expr::Load(harl_te::TensorRef::Input(i), idx) if !idx.is_empty() => {
                    out.push(*i)
                }
                harl_te::Expr::Load(harl_te::TensorRef::Stage(t), _)
                    if plans.get(*t) == Some(&GpuPlan::Inline) =>
                {
                    walk(g, plans, *t, out)
                }
                _ => {}
            });
        }
        let mut out = Vec::new();
        walk(&self.graph, &self.plans, s, &mut out);
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The untuned GPU schedule: a register tile of up to 4 on the two innermost spatial axes,
    /// up to 32 threads along the innermost and 8 along the next (256 per block), reduce
    /// steps of up to 8 unrolled, 256 threads per flat nest; a reduction with fewer outputs
    /// than reduced elements is a cross-thread reduction over up to 256 threads.
    pub fn default_params(&self) -> GpuParams {
        let largest = |n: usize, cap: usize| {
            (1..=cap.min(n))
                .rev()
                .find(|d| n.is_multiple_of(*d))
                .unwrap_or(1)
        };
        let mut spatial = Vec::new();
        let mut reduce = Vec::new();
        let mut cross_thread = Vec::new();
        let mut shared = Vec::new();
        for s in self.tiled_stages() {
            let st = &self.graph.stages[s];
            shared.push(true);
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
            cross_thread.push(if cross_thread_fits(st) && st.size() < reduce_len(st) {
                let mut threads_left = 256;
                let mut threads = vec![1; red.len()];
                for j in (0..red.len()).rev() {
                    threads[j] = largest(red[j], threads_left);
                    threads_left /= threads[j];
                }
                threads
            } else {
                Vec::new()
            });
        }
        self.fit_shared(GpuParams {
            spatial,
            vthreads: Vec::new(),
            reduce,
            cross_thread,
            shared,
            flat_threads: 2,
            unroll: true,
        })
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
        if p.spatial.len() != n_tiled
            || p.reduce.len() != n_tiled
            || !(p.vthreads.is_empty() || p.vthreads.len() == n_tiled)
            || !(p.cross_thread.is_empty() || p.cross_thread.len() == n_tiled)
            || !(p.shared.is_empty() || p.shared.len() == n_tiled)
        {
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
                GpuPlan::Epilogue(t) => {
                    let k_t = self.tiled_stages().position(|x| x == *t).unwrap_or(0);
                    if p.cross_thread.get(k_t).is_some_and(|c| !c.is_empty()) {
                        emit_flat(&mut steps, s, &st.shape, flat_threads);
                    } else {
                        // The thread loop of the tiled plan, where its accumulators are.
                        steps.push(Step::ComputeAt {
                            stage: s,
                            target: *t,
                            at: 1,
                        });
                    }
                }
                GpuPlan::Tiled => {
                    let (sp, red) = (&p.spatial[k], &p.reduce[k]);
                    let ones = vec![1; sp.len()];
                    let virt = p.vthreads.get(k).unwrap_or(&ones);
                    let cross = p.cross_thread.get(k).map_or(&[][..], |c| &c[..]);
                    let staged = if p.shared.get(k).copied().unwrap_or(false) {
                        self.inputs_read(s)
                    } else {
                        Vec::new()
                    };
                    k += 1;
                    let nr = st.reduce.as_ref().map_or(0, |r| r.extents.len());
                    if !cross.is_empty() {
                        let threads: usize = cross.iter().product();
                        if !cross_thread_fits(st)
                            || cross.len() != nr
                            || cross.contains(&0)
                            || threads > MAX_GPU_THREADS
                        {
                            return Err(bad(format!("stage {s}: cross-thread {cross:?}")));
                        }
                        emit_cross_thread(&mut steps, s, st.shape.len(), cross);
                        continue;
                    }
                    if sp.len() != st.shape.len() || red.len() != nr || virt.len() != sp.len() {
                        return Err(bad(format!("stage {s}: wrong number of axes")));
                    }
                    if virt.contains(&0) {
                        return Err(bad(format!("stage {s}: zero virtual threads")));
                    }
                    let threads: usize = sp.iter().map(|a| a[0]).product();
                    let tile: usize = sp.iter().zip(virt).map(|(a, v)| a[1] * v).product();
                    if threads > MAX_GPU_THREADS || tile > MAX_ACC_ELEMS.min(MAX_REGISTER_TILE) {
                        return Err(bad(format!(
                            "stage {s}: {threads} threads or a register tile of {tile}"
                        )));
                    }
                    emit_tiled(&mut steps, s, sp, virt, red, p.unroll);
                    // At the innermost `R0` loop (loops: B, T, R0 x nr, ...).
                    for input in staged {
                        steps.push(Step::SharedRead {
                            stage: s,
                            input,
                            at: 1 + nr,
                        });
                    }
                }
            }
        }
        Ok(steps)
    }
}

fn reduce_len(st: &harl_te::Stage) -> usize {
    st.reduce.as_ref().map_or(1, |r| r.extents.iter().product())
}

/// Whether a cross-thread reduction can schedule `st`: a spatial loop to bind to blocks and a
/// reduction long enough to share.
fn cross_thread_fits(st: &harl_te::Stage) -> bool {
    !st.shape.is_empty() && st.reduce.is_some() && reduce_len(st) >= CROSS_THREAD_MIN_REDUCE
}

/// `B T R..`: the spatial loops fused and bound to blocks; each reduce axis split into
/// `[Ro, Rt]` with `Rt` of `threads[j]` (innermost, so neighbouring threads read neighbouring
/// elements), the `Rt` loops fused and bound to threads over a one-element accumulator.
fn emit_cross_thread(steps: &mut Vec<Step>, s: usize, ns: usize, threads: &[usize]) {
    let nr = threads.len();
    for (j, &t) in threads.iter().enumerate().rev() {
        steps.push(Step::Split {
            stage: s,
            at: ns + j,
            factors: vec![t],
        });
    }
    // Loops now: spatial a at a, reduce j -> [Ro, Rt] at ns + 2j.
    let mut order: Vec<usize> = (0..ns).collect();
    order.extend((0..nr).map(|j| ns + 2 * j + 1));
    order.extend((0..nr).map(|j| ns + 2 * j));
    steps.push(Step::Reorder { stage: s, order });
    fuse_and_bind(steps, s, ns, nr);
}

/// Fuses the first `n_block` loops into loop 0 and the next `n_thread` into loop 1, then
/// accumulates at loop 1 (`cache_write`) and binds loop 0 to blocks and loop 1 to threads.
fn fuse_and_bind(steps: &mut Vec<Step>, s: usize, n_block: usize, n_thread: usize) {
    for _ in 1..n_block {
        steps.push(Step::Fuse { stage: s, at: 0 });
    }
    for _ in 1..n_thread {
        steps.push(Step::Fuse { stage: s, at: 1 });
    }
    // Before the thread binding: a reduce loop binds to threads only over an accumulator.
    steps.push(Step::CacheWrite { stage: s, at: 1 });
    steps.push(Step::BindBlock { stage: s, at: 0 });
    steps.push(Step::BindThread { stage: s, at: 1 });
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

/// `B.. T.. R0.. R1.. V.. I..`, blocks and threads bound, the `V × I` tile accumulated.
fn emit_tiled(
    steps: &mut Vec<Step>,
    s: usize,
    sp: &[[usize; 2]],
    virt: &[usize],
    red: &[usize],
    unroll: bool,
) {
    let ns = sp.len();
    let nr = red.len();
    // Loop list after the splits: axis a (spatial) -> [B, V, T, I] at 4a, reduce axis j ->
    // [R0, R1] at 4ns + 2j. Split from the last loop back so earlier positions stay put.
    for (j, &r1) in red.iter().enumerate().rev() {
        steps.push(Step::Split {
            stage: s,
            at: ns + j,
            factors: vec![r1],
        });
    }
    for (a, (&[t, i], &v)) in sp.iter().zip(virt).enumerate().rev() {
        steps.push(Step::Split {
            stage: s,
            at: a,
            factors: vec![v, t, i],
        });
    }
    let b = |a: usize| 4 * a;
    let v = |a: usize| 4 * a + 1;
    let t = |a: usize| 4 * a + 2;
    let i = |a: usize| 4 * a + 3;
    let r0 = |j: usize| 4 * ns + 2 * j;
    let r1 = |j: usize| 4 * ns + 2 * j + 1;
    let mut order: Vec<usize> = (0..ns).map(b).collect();
    order.extend((0..ns).map(t));
    order.extend((0..nr).map(r0));
    order.extend((0..nr).map(r1));
    order.extend((0..ns).map(v));
    order.extend((0..ns).map(i));
    steps.push(Step::Reorder { stage: s, order });
    fuse_and_bind(steps, s, ns, ns);
    // Loops after fusion: B, T, R0 x nr, R1 x nr, V x ns, I x ns. The register tile is always
    // unrolled (a dynamically indexed accumulator would live in local memory); `R1` on request.
    let first_r1 = 2 + nr;
    let first = if unroll { first_r1 } else { first_r1 + nr };
    for at in first..first_r1 + nr + 2 * ns {
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
    fn virtual_threads_stride_a_threads_tile_and_compute_the_same() {
        let g = w::matmul(16, 8, 32).expect("mm");
        let sk = GpuSketch::new(&g).expect("sketch");
        // Columns: 2 virtual threads x 8 threads x 1 element: thread t owns columns t and t + 8
        // of each 16-wide block column.
        let p = GpuParams {
            spatial: vec![vec![[4, 2], [8, 1]]],
            vthreads: vec![vec![1, 2]],
            cross_thread: Vec::new(),
            reduce: vec![vec![4]],
            shared: Vec::new(),
            flat_threads: 0,
            unroll: true,
        };
        let s = sk.to_schedule(&p).expect("lowers");
        let split = s.steps.iter().find_map(|st| match st {
            Step::Split { at: 1, factors, .. } => Some(factors.clone()),
            _ => None,
        });
        assert_eq!(split, Some(vec![2, 8, 1]));
        let program = lower(&g, &s).expect("lowers");
        let a: Vec<f64> = (0..16 * 8).map(|i| (i % 7) as f64 - 3.0).collect();
        let b: Vec<f64> = (0..8 * 32).map(|i| (i % 5) as f64 * 0.5).collect();
        let want = harl_te::interp::run(&g, &[&a, &b]).expect("interpreter");
        let got = crate::loop_ir::execute(&program, &[&a, &b]).expect("execute");
        assert_eq!(got, want);
        // The register tile counts virtual threads: (2 x 8) x (8 x 1) = 128 accumulators is
        // too many.
        let big = GpuParams {
            spatial: vec![vec![[1, 8], [4, 1]]],
            vthreads: vec![vec![2, 8]],
            ..p.clone()
        };
        assert!(sk.to_schedule(&big).is_err());
        let zero = GpuParams {
            vthreads: vec![vec![1, 0]],
            ..p
        };
        assert!(sk.to_schedule(&zero).is_err());
    }

    #[test]
    fn cross_thread_reductions_share_the_reduce_axes_and_compute_the_same() {
        // 4 outputs of 8 x 12 = 96 products each: too little to tile, enough to share.
        let g = w::conv2d(1, 8, 3, 4, 4, 3, 4, 1, 0, 1, 1).expect("conv");
        let sk = GpuSketch::new(&g).expect("sketch");
        let dflt = sk.default_params();
        assert_eq!(dflt.cross_thread, vec![vec![8, 3, 4]]);
        // A thread count that is not a power of two (2 x 3 x 4 = 24) folds in the tree too.
        let p = GpuParams {
            cross_thread: vec![vec![2, 3, 4]],
            ..dflt
        };
        let program = lower(&g, &sk.to_schedule(&p).expect("lowers")).expect("lowers");
        // Small integers: every order of summation gives the same f64.
        let x: Vec<f64> = (0..8 * 3 * 4).map(|i| (i % 7) as f64 - 3.0).collect();
        let f: Vec<f64> = (0..4 * 8 * 12).map(|i| (i % 5) as f64 - 2.0).collect();
        let want = harl_te::interp::run(&g, &[&x, &f]).expect("interpreter");
        let got = crate::loop_ir::execute(&program, &[&x, &f]).expect("execute");
        assert_eq!(got, want);
        let m = crate::cuda::emit(&program).expect("emits");
        let nest = m.launches.last().expect("a nest");
        assert_eq!((nest.grid, nest.block), (4, 24));
        assert!(
            m.source.contains("__shared__ float red[24];"),
            "{}",
            m.source
        );
        assert!(m.source.contains("threadIdx.x + 16 < 24"), "{}", m.source);
        // Zero threads, a missing axis, more threads than an axis or a block holds.
        for bad in [vec![vec![0, 3, 4]], vec![vec![8, 3]], vec![vec![8, 12, 12]]] {
            let p = GpuParams {
                cross_thread: bad,
                ..sk.default_params()
            };
            assert!(sk.to_schedule(&p).is_err(), "{:?}", p.cross_thread);
        }
    }

    #[test]
    fn shared_staging_copies_the_blocks_boxes_and_computes_the_same() {
        use crate::loop_ir::Stmt;
        fn boxes(stmts: &[Stmt], out: &mut Vec<(usize, Vec<usize>)>) {
            for s in stmts {
                match s {
                    Stmt::For { body, .. } | Stmt::If { body, .. } => boxes(body, out),
                    Stmt::Shared { boxes: b, body } => {
                        out.extend(b.iter().map(|b| (b.input, b.extents.clone())));
                        boxes(body, out);
                    }
                    _ => {}
                }
            }
        }
        // GEMM: an 8 x 4 by 32 x 4 block tile, reduce steps of 8: A's box is 32 rows x 8,
        // B's 8 x 128 columns.
        let g = w::matmul(1024, 1024, 1024).expect("mm");
        let sk = GpuSketch::new(&g).expect("sketch");
        let p = sk.default_params();
        assert_eq!(p.shared, vec![true]);
        let program = lower(&g, &sk.to_schedule(&p).expect("lowers")).expect("lowers");
        let mut found = Vec::new();
        boxes(&program.nests[0].body, &mut found);
        assert_eq!(found, vec![(0, vec![32, 8]), (1, vec![8, 128])]);
        let m = crate::cuda::emit(&program).expect("emits");
        for want in ["__shared__ float sh0[256];", "__shared__ float sh1[1024];"] {
            assert!(m.source.contains(want), "{want}\n{}", m.source);
        }
        // A padded, strided convolution: the box reaches past the input's edges (zeros there),
        // and every read inside it is checked by the executor.
        let g = w::conv2d(1, 4, 9, 9, 8, 3, 3, 2, 1, 1, 1).expect("conv");
        let sk = GpuSketch::new(&g).expect("sketch");
        let p = GpuParams {
            spatial: vec![vec![[1, 1], [2, 2], [1, 1], [5, 1]]],
            vthreads: Vec::new(),
            reduce: vec![vec![2, 3, 3]],
            cross_thread: Vec::new(),
            shared: vec![true],
            flat_threads: 0,
            unroll: true,
        };
        let program = lower(&g, &sk.to_schedule(&p).expect("lowers")).expect("lowers");
        let mut found = Vec::new();
        boxes(&program.nests.last().expect("nest").body, &mut found);
        // Filters: 4 output channels x 2 input channels x 3 x 3; input: 1 x 2 channels x
        // (2 x 1 rows: 1 + 2 + ... = 3) x (5 columns at stride 2, 3 taps: 11).
        assert_eq!(found, vec![(0, vec![1, 2, 3, 11]), (1, vec![4, 2, 3, 3])]);
        let x: Vec<f64> = (0..4 * 81).map(|i| (i % 7) as f64 - 3.0).collect();
        let f: Vec<f64> = (0..8 * 4 * 9).map(|i| (i % 5) as f64 - 2.0).collect();
        let want = harl_te::interp::run(&g, &[&x, &f]).expect("interpreter");
        let got = crate::loop_ir::execute(&program, &[&x, &f]).expect("execute");
        assert_eq!(got, want);
        let m = crate::cuda::emit(&program).expect("emits");
        assert!(m.source.contains("g2 >= 0 && g2 < 9"), "{}", m.source);
        // Too large for a block's shared memory: rejected by lowering, turned off by sampling.
        // conv2d 56x56 64->64 with 8 x 56 threads and 32 input channels per step: the data
        // box is 32 x 10 x 58 floats, 74 KB.
        let g = w::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1).expect("conv");
        let sk = GpuSketch::new(&g).expect("sketch");
        let big = GpuParams {
            spatial: vec![vec![[1, 1], [1, 8], [8, 1], [56, 1]]],
            reduce: vec![vec![32, 3, 3]],
            ..p
        };
        let err = sk.to_schedule(&big).expect_err("too much shared memory");
        assert!(err.to_string().contains("exceed 49152"), "{err}");
        let small = GpuParams {
            shared: vec![false],
            ..big
        };
        sk.to_schedule(&small).expect("without staging it lowers");
        let mut rng = Rng::new(5);
        for _ in 0..20 {
            let p = sk.sample(&mut rng);
            sk.to_schedule(&p).expect("sampled parameters lower");
        }
    }

    #[test]
    fn an_elementwise_output_is_the_tiled_stages_epilogue() {
        let g = w::dense_bias_relu(16, 32, 24).expect("dense");
        let sk = GpuSketch::new(&g).expect("sketch");
        let p = sk.default_params();
        let s = sk.to_schedule(&p).expect("lowers");
        assert!(s
            .steps
            .iter()
            .any(|st| matches!(st, Step::ComputeAt { at: 1, .. })));
        let program = lower(&g, &s).expect("lowers");
        let m = crate::cuda::emit(&program).expect("emits");
        assert_eq!(m.launches.len(), 1, "{:?}", m.launches);
        let a: Vec<f64> = (0..16 * 32).map(|i| (i % 7) as f64 - 3.0).collect();
        let b: Vec<f64> = (0..32 * 24).map(|i| (i % 5) as f64 * 0.5 - 1.0).collect();
        let bias: Vec<f64> = (0..24).map(|i| i as f64 - 12.0).collect();
        let want = harl_te::interp::run(&g, &[&a, &b, &bias]).expect("interpreter");
        let got = crate::loop_ir::execute(&program, &[&a, &b, &bias]).expect("execute");
        assert_eq!(got, want);
        // Over a cross-thread reduction the output is a kernel of its own.
        let p = GpuParams {
            cross_thread: vec![vec![32]],
            ..p
        };
        let program = lower(&g, &sk.to_schedule(&p).expect("lowers")).expect("lowers");
        assert_eq!(
            crate::cuda::emit(&program).expect("emits").launches.len(),
            3
        );
        let got = crate::loop_ir::execute(&program, &[&a, &b, &bias]).expect("execute");
        assert_eq!(got, want);
    }

    #[test]
    fn too_many_threads_is_an_error() {
        let g = w::matmul(64, 64, 64).expect("mm");
        let sk = GpuSketch::new(&g).expect("sketch");
        let p = GpuParams {
            spatial: vec![vec![[64, 1], [32, 1]]],
            vthreads: Vec::new(),
            cross_thread: Vec::new(),
            reduce: vec![vec![1]],
            shared: Vec::new(),
            flat_threads: 0,
            unroll: false,
        };
        assert!(sk.to_schedule(&p).is_err());
    }
}
