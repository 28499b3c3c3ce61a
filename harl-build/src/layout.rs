//! Layouts: a reduction that vectorises a spatial axis other than its last, reading one graph
//! input through a copy (`cache_read`) with that axis's dimension last.
//!
//! A convolution's output row is a poor vector when the input is read with a stride along it
//! (a stride-2 convolution) or when it is short (7 or 14 pixels in a network's late stages).
//! Its filter axis is then the better vector: the filter, copied with that axis last, is read
//! contiguously, and every other operand is one value broadcast across the lanes. The default
//! schedule and the tuner's layout sketch both take their layout from [`layout_choice`], and
//! lay out the copy with [`copy_steps`].

use crate::schedule::Step;
use crate::target::CpuTarget;
use harl_te::{Expr, Graph, TensorRef};

/// A tiled stage that vectorises spatial axis `vec_axis` instead of the last one, reading graph
/// input `input` through a copy whose axes are permuted by `order` (a cache_read), so that the
/// vector loop walks that copy contiguously.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Layout {
    /// The spatial axis vectorised.
    pub vec_axis: usize,
    /// The graph input read through the copy.
    pub input: usize,
    /// The copy's axes: input axis `order[i]` is the copy's axis `i`.
    pub order: Vec<usize>,
}

/// Each copied element must feed at least this many multiply-adds: below it the copy, made on
/// every call, costs more than the better vector saves.
const MIN_REUSE: usize = 16;

/// The layout of stage `s`, if it wants one. The stage's last spatial axis must be a poor
/// vector: some operand is read along it with a stride other than 0 or 1 (a strided
/// convolution's input), or it is shorter than two vectors of `target`. The new vector axis
/// indexes a whole dimension of a graph input that does not depend on the last axis, and no
/// other operand depends on it (a convolution's filter axis: every other operand is then
/// broadcast along the vector); for a short row it must itself be at least two vectors long.
/// The axis with the largest extent wins.
pub fn layout_choice(graph: &Graph, s: usize, target: &CpuTarget) -> Option<Layout> {
    let stage = graph.stages.get(s)?;
    let reduce: usize = stage.reduce.as_ref()?.extents.iter().product();
    let ns = stage.n_spatial();
    let last = ns.checked_sub(1)?;
    let n_axes = stage.axis_extents().len();
    let step = |e: &Expr, a: usize| e.stride(a, n_axes);
    let mut loads = Vec::new();
    stage.body.visit(&mut |e| {
        if let Expr::Load(t, idx) = e {
            loads.push((*t, idx.clone()));
        }
    });
    let strided = loads.iter().any(|(_, idx)| {
        idx.last()
            .is_some_and(|l| !matches!(step(l, last), Some(0 | 1)))
    });
    let lanes = (target.vector_bytes / elem_bytes(stage.dtype)).max(1);
    let short = stage.shape[last] < 2 * lanes;
    if !strided && !short {
        return None;
    }
    let min_extent = if strided { 2 } else { 2 * lanes };
    let mut best: Option<(usize, Layout)> = None;
    for a in 0..last {
        let extent = stage.shape[a];
        for (t, idx) in &loads {
            let TensorRef::Input(input) = *t else {
                continue;
            };
            let Some(dim) = idx.iter().position(|i| *i == Expr::Axis(a)) else {
                continue;
            };
            // Every other read of this input is the same access; every other operand is
            // broadcast along axis `a`.
            let others_broadcast = loads.iter().all(|(u, jdx)| {
                if u == t {
                    jdx == idx
                } else {
                    !jdx.iter().any(|i| uses_axis(i, a))
                }
            });
            let independent_of_last = !idx.iter().any(|i| uses_axis(i, last));
            if dim + 1 == idx.len() || !others_broadcast || !independent_of_last {
                continue;
            }
            if best.as_ref().is_some_and(|(e, _)| *e >= extent) || extent < min_extent {
                continue;
            }
            // The copy is made on every call: it must pay for itself.
            let copied: usize = graph.inputs.get(input)?.shape.iter().product();
            let work = stage.size().checked_mul(reduce)?;
            if copied.checked_mul(MIN_REUSE)? > work {
                continue;
            }
            let order = (0..idx.len()).filter(|&d| d != dim).chain([dim]).collect();
            best = Some((
                extent,
                Layout {
                    vec_axis: a,
                    input,
                    order,
                },
            ));
        }
    }
    best.map(|(_, l)| l)
}

/// The steps of a `cache_read` copy at stage `copy` with axes `shape` (the input's axes with the
/// moved one last): a blocked transpose. The last axis is split into blocks of a cache line
/// (16 f32), the block loop goes outermost and runs in parallel, the other axes in between keep
/// the input's order: each block then reads its rows of the input as a few contiguous streams
/// and writes whole lines, where the plain nest read the input with the stride of a whole row
/// for every element (a 256x256x3x3 filter copy took longer than its convolution).
pub fn copy_steps(copy: usize, shape: &[usize]) -> Vec<Step> {
    let mut steps = Vec::new();
    let Some(&last) = shape.last() else {
        return steps;
    };
    let rank = shape.len();
    if rank < 2 {
        return steps;
    }
    let block = largest_divisor_at_most(last, 16);
    let mut loops = rank;
    if block > 1 && block < last {
        steps.push(Step::Split {
            stage: copy,
            at: rank - 1,
            factors: vec![block],
        });
        loops += 1;
        // [a_0 .. a_{r-2}, outer, inner] -> [outer, a_0 .. a_{r-2}, inner]
        let order = std::iter::once(rank - 1)
            .chain(0..rank - 1)
            .chain([rank])
            .collect();
        steps.push(Step::Reorder { stage: copy, order });
    }
    if shape.iter().product::<usize>() >= 1 << 15 && loops > 1 {
        steps.push(Step::Parallel { stage: copy, at: 0 });
    }
    steps
}

fn uses_axis(e: &Expr, a: usize) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= *x == Expr::Axis(a));
    found
}

fn elem_bytes(d: harl_te::DType) -> usize {
    match d {
        harl_te::DType::F64 => 8,
        _ => 4,
    }
}

fn largest_divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n).max(1))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}
