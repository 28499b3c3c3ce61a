//! Layouts: a reduction that vectorises a spatial axis other than its last, reading one graph
//! input through a copy (`cache_read`) with that axis's dimension last.
//!
//! A convolution's output row is a poor vector when the input is read with a stride along it
//! (a stride-2 convolution) or when it is short (7 or 14 pixels in a network's late stages).
//! Its filter axis is then the better vector: the filter, copied with that axis last, is read
//! contiguously, and every other operand is one value broadcast across the lanes. The default
//! schedule and the tuner's layout sketch both take their layout from [`layout_choice`], and
//! lay out the copy with [`copy_steps`].

use crate::default_schedule::{elem_bytes, largest_divisor_at_most, uses_axis};
use crate::limits::MAX_LOOPS_PER_STAGE;
use crate::loop_ir::{masked_rest, Program, Stmt};
use crate::register_tile::{choose, throughput, TileProblem};
use crate::schedule::{Schedule, Step};
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
    /// The copy in panels of this many elements along the vector axis (the register tile's
    /// width; `Step::CacheRead`'s `panel`): for a weight, whose copy is made once. A panel is
    /// read contiguously for the whole reduction; without panels, each step of the reduction
    /// reads the tile's columns from another row of the copy (2048 filters: 8 KB apart, every
    /// read in a new page, where hardware prefetch stops), and resnet_s4's 1x1 convolution ran
    /// at 120 GFLOP/s against 210 with panels (hand-edited kernel, 1 thread, prepared weights).
    pub panel: Option<usize>,
}

/// The width of a register tile along a layout's vector axis of `extent`: up to two vectors.
pub fn vector_tile(extent: usize, lanes: usize) -> usize {
    largest_divisor_at_most(extent, 2 * lanes)
}

/// A layout replaces a row tile that fills its vectors, for a row read through a window, when
/// the tile model rates its own tile this much faster. A 56-pixel row on AVX2 (7 vectors) takes
/// 8 filters x 1 vector: nine loads for eight multiply-adds, and with the three taps' vectors
/// live the compiler spilled accumulators to the stack; the filter axis takes 4 pixels x 2
/// vectors. ResNet's 3x3 convolution at 56x56 went from 44 to 83 GFLOP/s (AVX2, 1 thread,
/// `harl-bench probe --against`, both defaults in one sitting); 1x1 convolutions (no window)
/// gained nothing or lost up to 8% the same way, so they keep their row tiles.
const FASTER: f64 = 1.05;

/// What a layout's tile pays per output element for writing its block back across the
/// output's rows (scalar stores; a fused consumer then runs as a pass of its own), in cycles
/// of multiply-adds: a layout must fill its vectors enough better than the row tile to pay
/// for it. MobileNet-V2's 1x1 convolution 96 -> 576 at 14x14 (a 196-pixel row: 16 + a masked
/// 12 lanes, 7/8 of them used, against 32 filters) ran 105.5 us in the filter layout and 96.8
/// with the row tile and its epilogue in the write-back; 320 -> 1280 at 7x7 (49 pixels: 16 x 3
/// and a scalar) 177 against 416 (AVX-512, 1 thread, `harl-bench probe --against`,
/// 2026-12-07): about 0.75 cycles an element fits both.
const WRITE_BACK_CYCLES: f64 = 0.75;

/// Cycles of multiply-adds per output element of a tile over `reduction` steps whose vectors
/// use `lane_use` of their `lanes` (two multiply-adds a cycle).
fn cycles_per_output(reduction: usize, lanes: usize, lane_use: f64) -> f64 {
    if lane_use <= 0.0 {
        return f64::INFINITY;
    }
    reduction as f64 / (2.0 * lanes as f64 * lane_use)
}

/// Each copied element of an activation must feed at least this many multiply-adds: below it
/// the copy, made on every call, costs more than the better vector saves.
const MIN_REUSE: usize = 16;

/// The layout of stage `s`, if it wants one. The stage's last spatial axis must be a poor
/// vector: some operand is read along it with a stride other than 0 or 1 (a strided
/// convolution's input), or the default's register tile along it leaves vector lanes idle
/// ([`lane_use`] below 1: 7, 14, 28, 49 or 56 pixels of a convolution's row). The new vector axis
/// indexes a whole dimension of a graph input that does not depend on the last axis, and no
/// other operand depends on it (a convolution's filter axis: every other operand is then
/// broadcast along the vector); unless the row is strided, its own tile must use the lanes
/// better. The axis with the largest extent wins.
pub fn layout_choice(graph: &Graph, s: usize, target: &CpuTarget) -> Option<Layout> {
    let stage = graph.stages.get(s)?;
    let reduction: usize = stage.reduce.as_ref()?.extents.iter().product();
    let ns = stage.n_spatial();
    let last = ns.checked_sub(1)?;
    let extents = stage.axis_extents();
    let n_axes = extents.len();
    let elem = elem_bytes(stage.dtype);
    let step = |e: &Expr, a: usize| e.stride(a, n_axes);
    let loads = loads_of(stage);
    let strided = loads.iter().any(|(_, idx)| {
        idx.last()
            .is_some_and(|l| !matches!(step(l, last), Some(0 | 1)))
    });
    let windowed = windowed(stage);
    let lanes = (target.vector_bytes / elem).max(1);
    // How well the default's register tile along the last axis fills the vectors, and its
    // throughput by the tile model.
    let plain =
        crate::default_schedule::plan_tiles(graph, s, target).filter(|p| p.vec_axis == last);
    let row_use = plain.as_ref().map_or(0.0, |p| lane_use(p.vec[2], lanes));
    let row_speed = plain.as_ref().map_or(0.0, |p| {
        let problem = TileProblem {
            vec_extent: stage.shape[last],
            row_extent: p.row_axis.map_or(1, |a| stage.shape[a]),
            reduction: reduction / p.red[0].max(1),
            elem_bytes: elem,
        };
        throughput(&problem, target, p.row[2], p.vec[2])
    });
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
            // A strided row is a gather: any other vector is better. Otherwise the layout's
            // own tile must fill its vectors better than the row's does.
            let tile = vector_tile(extent, lanes);
            let problem = TileProblem {
                vec_extent: extent,
                row_extent: stage.shape[last],
                reduction,
                elem_bytes: elem,
            };
            let own = choose(&problem, target);
            let faster =
                windowed && throughput(&problem, target, own.rows, own.width) > row_speed * FASTER;
            let fuller = cycles_per_output(reduction, lanes, lane_use(tile, lanes))
                + WRITE_BACK_CYCLES
                < cycles_per_output(reduction, lanes, row_use);
            let better = extent >= 2 && (strided || fuller || faster);
            if best.as_ref().is_some_and(|(e, _)| *e >= extent) || !better {
                continue;
            }
            // The copy of an activation is made on every call: it must pay for itself. A
            // weight's is made once, by `prepare` (`harl_build::prepare`).
            let source = graph.inputs.get(input)?;
            let copied: usize = source.shape.iter().product();
            let work = work_of(stage)?;
            if !source.constant && copied.checked_mul(MIN_REUSE)? > work {
                continue;
            }
            let order = (0..idx.len()).filter(|&d| d != dim).chain([dim]).collect();
            best = Some((
                extent,
                Layout {
                    vec_axis: a,
                    input,
                    order,
                    panel: (source.constant && tile < extent).then_some(tile),
                },
            ));
        }
    }
    best.map(|(_, l)| l)
}

/// Whether `stage` reads some operand through a window along its last spatial axis (a 3x3
/// convolution's taps): a row tile's vector operand then moves with the reduction, and the
/// compiler keeps each tap's vector live beside the tile.
pub fn windowed(stage: &harl_te::Stage) -> bool {
    let Some(last) = stage.n_spatial().checked_sub(1) else {
        return false;
    };
    let extents = stage.axis_extents();
    loads_of(stage).iter().any(|(_, idx)| {
        idx.last().is_some_and(|l| {
            uses_axis(l, last)
                && (stage.n_spatial()..extents.len()).any(|a| extents[a] > 1 && uses_axis(l, a))
        })
    })
}

/// The weight (or well reused activation) that stage `s` reads along its last spatial axis (the
/// vector axis of a plain tile) and across its reduction: a GEMM's or GEMV's matrix `w[k, n]`,
/// a dense layer's weights.
/// A tile as wide as `width` along that axis then reads `width` elements of a new row at every
/// step of the reduction (a 4096-wide matrix: 16 KB apart); copied once into panels of `width`
/// (the packed B of a BLAS), the tile streams one contiguous panel instead.
pub fn panel_input(graph: &Graph, s: usize) -> Option<usize> {
    let stage = graph.stages.get(s)?;
    stage.reduce.as_ref()?;
    let work = work_of(stage);
    let ns = stage.n_spatial();
    let last = ns.checked_sub(1)?;
    let loads = loads_of(stage);
    loads.iter().find_map(|(t, idx)| {
        let TensorRef::Input(i) = *t else {
            return None;
        };
        let (row, rest) = idx.split_last()?;
        let source = graph.inputs.get(i)?;
        // A weight's panels are made once. An activation's are made on every call: worth it
        // when its rows are far apart (each reduction step would read another page) and each
        // copied element feeds enough multiply-adds.
        let copied: usize = source.shape.iter().product();
        let row_apart = source.shape.last().is_some_and(|&n| n >= MIN_PANEL_ROW);
        let weight = source.constant
            || (row_apart
                && copied
                    .checked_mul(MIN_REUSE)
                    .is_some_and(|c| Some(c) <= work));
        // One access of the input, contiguous along the vector axis, and along a reduction.
        let same = loads.iter().all(|(u, jdx)| u != t || jdx == idx);
        let along_reduction = rest
            .iter()
            .any(|e| (ns..stage.axis_extents().len()).any(|r| uses_axis(e, r)));
        let only_row = *row == Expr::Axis(last) && !rest.iter().any(|e| uses_axis(e, last));
        (weight && same && along_reduction && only_row && idx.len() < harl_te::limits::MAX_RANK)
            .then_some(i)
    })
}

/// Each element of a [`row_copy`] must feed at least this many multiply-adds (the output
/// channels, for a 1x1 convolution). The copy streams the whole input through memory on every
/// call; with 64 or 96 output channels it cost as much as it saved (ResNet's 56x56 256-to-64
/// and MobileNet's 112x112 16-to-96 pointwise convolutions went from 0.81x and 1.18x of
/// onnxruntime to 0.43x and 0.59x, one AVX2 thread, in a noisy sitting; then in one worker,
/// `harl-bench probe --against`, a threshold of 64 ran the four kernels it changes at
/// 0.89-0.97x of 256's), with 256 and more it pays (stage 4's 512-to-2048: 0.52x -> 0.77x).
const MIN_ROW_COPY_REUSE: usize = 256;

/// [`MIN_ROW_COPY_REUSE`] for a [`row_copy`] in panels of short rows: such an input is small
/// (49 or 196 pixels a channel), read from cache rather than memory, so fewer filters pay for
/// it. MobileNet-V2's 1x1 convolutions, panels against none (`harl-bench probe --against`, AVX2
/// Zen 3, 1 thread): 96 filters 60 -> 71-89 GFLOP/s, 160 filters 47-49 -> 57-81; with 64 filters
/// one ran 5% slower (94 -> 89), another faster, so 64 stays out.
const MIN_PANEL_COPY_REUSE: usize = 96;

/// An activation's rows must be at least this many elements long for its panel copy to pay:
/// shorter rows (a 64-wide attention head) sit within a few pages and stream well as they are.
const MIN_PANEL_ROW: usize = 256;

/// The panel copy of [`panel_input`]'s weight for a tile `width` wide along the vector axis:
/// the input's own axis order in panels of `width`, when that divides the axis and is smaller.
pub fn panel_layout(graph: &Graph, s: usize, width: usize) -> Option<Layout> {
    let input = panel_input(graph, s)?;
    let stage = &graph.stages[s];
    let vec_axis = stage.n_spatial() - 1;
    let extent = stage.shape[vec_axis];
    if width <= 1 || width >= extent || !extent.is_multiple_of(width) {
        return None;
    }
    Some(Layout {
        vec_axis,
        input,
        order: (0..graph.inputs[input].shape.len()).collect(),
        panel: Some(width),
    })
}

/// The copy of a tile's operand along the output's last axis (a convolution's input, other than
/// `other`'s copy) with its reduction axes moved next to that axis: `x[n, c, oh, ow]` read as
/// `[n, oh, c, ow]`. A tile reads a few pixels of one row at each step of the reduction (a
/// layout tile broadcasts them, a plain one loads them as a vector); in the input's own order
/// each step reads another channel's plane (a 7-pixel row: 28 bytes of a 196-byte plane, 512
/// planes for one tile; a 56-pixel row: every step in a new page), in the copy the whole
/// reduction of a tile is one contiguous stream. The operand must be one graph input read
/// once, contiguous along the row (stride 1 in its last index), with some index that uses
/// reduction axes only, and reused enough ([`MIN_ROW_COPY_REUSE`]) to pay for a copy made on
/// every call. Where the reduction is already next to the row (a 1x1 convolution over
/// flattened pixels reads `x[n, c, p]`) but the tile covers only `row_tile` of the row's
/// pixels, the copy is cut into panels of `row_tile` (`[p / row_tile, n, c, row_tile]`): in
/// the input's own order each step reads the tile's few pixels 196 bytes after the last (49
/// pixels), a new cache line a step from L2; in a panel one tile's reduction is 9 KB in a row.
pub fn row_copy(
    graph: &Graph,
    s: usize,
    other: Option<&Layout>,
    row_tile: usize,
) -> Option<Layout> {
    let stage = graph.stages.get(s)?;
    let ns = stage.n_spatial();
    let last = ns.checked_sub(1)?;
    let n_axes = stage.axis_extents().len();
    let loads = loads_of(stage);
    let (input, idx) = loads.iter().find_map(|(t, idx)| match *t {
        TensorRef::Input(i) if other.is_none_or(|l| l.input != i) => Some((i, idx)),
        _ => None,
    })?;
    let source = graph.inputs.get(input)?;
    let once = loads
        .iter()
        .all(|(u, jdx)| *u != TensorRef::Input(input) || jdx == idx);
    let (row, rest) = idx.split_last()?;
    let spatial = |e: &Expr| (0..ns).any(|a| uses_axis(e, a));
    // A strided row (a 1x1 convolution of stride 2) is contiguous in the sampled copy.
    let sample = sample_factors(stage, input, idx.len());
    let row_step = i64::try_from(*sample.last()?).ok();
    if !once || row.stride(last, n_axes) != row_step || rest.iter().any(|e| uses_axis(e, last)) {
        return None;
    }
    // Indices on spatial axes (or none) first, in their order; then the reduction's; the row.
    let outer: Vec<usize> = (0..rest.len())
        .filter(|&d| spatial(&rest[d]) || !uses_reduce(&rest[d], ns, n_axes))
        .collect();
    let inner: Vec<usize> = (0..rest.len()).filter(|d| !outer.contains(d)).collect();
    let order: Vec<usize> = outer
        .into_iter()
        .chain(inner.iter().copied())
        .chain([rest.len()])
        .collect();
    let sampled = sampled_shape(&source.shape, &sample);
    let row_extent = *sampled.last()?;
    let in_order = order.iter().enumerate().all(|(i, &o)| i == o);
    let panel = (in_order && row_tile > 1 && row_tile < row_extent)
        .then_some(row_tile)
        .filter(|&t| row_extent.is_multiple_of(t));
    if inner.is_empty() || (in_order && panel.is_none()) {
        return None;
    }
    let copied = sampled.iter().try_fold(1usize, |n, &e| n.checked_mul(e))?;
    let reuse = if panel.is_some() {
        MIN_PANEL_COPY_REUSE
    } else {
        MIN_ROW_COPY_REUSE
    };
    if copied.checked_mul(reuse)? > work_of(stage)? {
        return None;
    }
    Some(Layout {
        vec_axis: last,
        input,
        order,
        panel,
    })
}

/// How sparsely `stage` reads graph input `input` along each of the input's `rank` axes: the
/// largest factor dividing every index of every read along that axis (the coefficients of the
/// stage's axes that take more than one value, and the constant), 1 where an index is not
/// affine or nothing larger divides. A 1x1 convolution of stride 2 reads `x[n, c, 2oh, 2ow]`:
/// `[1, 1, 2, 2]`, and a copy of every second element along the last two axes (a quarter of
/// the input) holds all it reads. `Step::CacheRead` copies with these factors.
pub fn sample_factors(stage: &harl_te::Stage, input: usize, rank: usize) -> Vec<usize> {
    let extents = stage.axis_extents();
    let mut g = vec![0u64; rank];
    for (t, idx) in loads_of(stage) {
        if t != TensorRef::Input(input) {
            continue;
        }
        for (d, e) in idx.iter().enumerate().take(rank) {
            g[d] = match varying(e, &extents) {
                Some(a) => a
                    .terms
                    .values()
                    .chain([&a.constant])
                    .fold(g[d], |x, &c| gcd(x, c.unsigned_abs())),
                None => 1,
            };
        }
    }
    g.into_iter()
        .map(|f| usize::try_from(f).unwrap_or(1).max(1))
        .collect()
}

/// Index `e` of a read sampled by `factor` ([`sample_factors`]): `e / factor` as an affine
/// expression, or `None` when `factor` does not divide it. `extents` are the reading stage's
/// axis extents.
pub fn sampled_index(e: &Expr, factor: usize, extents: &[usize]) -> Option<Expr> {
    if factor == 1 {
        return Some(e.clone());
    }
    let f = i64::try_from(factor).ok()?;
    let mut a = varying(e, extents)?;
    for c in a.terms.values_mut().chain([&mut a.constant]) {
        if *c % f != 0 {
            return None;
        }
        *c /= f;
    }
    Some(a.to_expr())
}

/// The extents of a copy of an input of `shape` sampled by `sample` (missing factors are 1).
pub fn sampled_shape(shape: &[usize], sample: &[usize]) -> Vec<usize> {
    shape
        .iter()
        .enumerate()
        .map(|(d, &n)| n.div_ceil(sample.get(d).copied().unwrap_or(1).max(1)))
        .collect()
}

/// `e`'s affine form without the axes of extent 1 (always 0).
fn varying(e: &Expr, extents: &[usize]) -> Option<crate::affine::Affine> {
    let mut a = crate::affine::affine(e)?;
    a.terms
        .retain(|&v, _| extents.get(v).is_none_or(|&n| n > 1));
    Some(a)
}

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// The multiply-adds of a reduction stage: its size times its reduction's; `None` for a stage
/// without a reduction or on overflow.
fn work_of(stage: &harl_te::Stage) -> Option<usize> {
    let reduce = stage.reduce.as_ref()?;
    reduce
        .extents
        .iter()
        .try_fold(stage.size(), |n, &e| n.checked_mul(e))
}

fn uses_reduce(e: &Expr, ns: usize, n_axes: usize) -> bool {
    (ns..n_axes).any(|a| uses_axis(e, a))
}

/// Every load of `stage`'s body: the tensor and its index.
fn loads_of(stage: &harl_te::Stage) -> Vec<(TensorRef, Vec<Expr>)> {
    let mut loads = Vec::new();
    stage.body.visit(&mut |e| {
        if let Expr::Load(t, idx) = e {
            loads.push((*t, idx.clone()));
        }
    });
    loads
}

/// The steps of the `cache_read` copy that `layout` makes for stage `reader` of `graph`, at
/// stage `copy` of the scheduled graph (its axes are the input's, sampled as `reader` reads
/// them, with the moved one last): a blocked transpose. The last axis is split into blocks of a cache line
/// (16 f32), the block loop goes outermost and runs in parallel, the other axes in between keep
/// the input's order: each block then reads its rows of the input as a few contiguous streams
/// and writes whole lines, where the plain nest read the input with the stride of a whole row
/// for every element (a 256x256x3x3 filter copy took longer than its convolution).
pub fn copy_steps(copy: usize, graph: &Graph, reader: usize, layout: &Layout) -> Vec<Step> {
    let (Some(input), Some(stage)) = (graph.inputs.get(layout.input), graph.stages.get(reader))
    else {
        return Vec::new();
    };
    let rank = input.shape.len();
    let sampled = sampled_shape(&input.shape, &sample_factors(stage, layout.input, rank));
    let shape: Vec<usize> = layout.order.iter().map(|&o| sampled[o]).collect();
    if layout.panel.is_some() {
        // Made once, by `prepare`: the panels in parallel.
        return vec![Step::Parallel { stage: copy, at: 0 }];
    }
    let rank = shape.len();
    let (Some(&last), true) = (shape.last(), rank >= 2) else {
        return Vec::new();
    };
    let mut steps = Vec::new();
    let block = largest_divisor_at_most(last, 16);
    if block > 1 && block < last {
        steps.push(Step::Split {
            stage: copy,
            at: rank - 1,
            factors: vec![block],
        });
        // [a_0 .. a_{r-2}, outer, inner] -> [outer, a_0 .. a_{r-2}, inner]
        let order = std::iter::once(rank - 1)
            .chain(0..rank - 1)
            .chain([rank])
            .collect();
        steps.push(Step::Reorder { stage: copy, order });
    }
    if shape.iter().product::<usize>() >= 1 << 15 {
        steps.push(Step::Parallel { stage: copy, at: 0 });
    }
    steps
}

/// `schedule` with each panel copy of an input the kernel gets on every call (an activation,
/// not a weight, which `prepare` copies once) made inside its reader ([`Step::PackAt`]), one
/// panel at a time at the outermost loop that fixes the panel, where that copies each panel
/// at most [`MAX_PACK_REPEATS`] times. A whole-input copy before the reader went through memory: ResNet-50's 1x1
/// convolution at 56x56, 256 -> 64 channels (3.2 MB), ran 1.08x / 1.34x faster at 1 / 2
/// threads with each 32 KB panel copied just before its use, and 1.25x with cold caches (a
/// hand-edited kernel against the default's, AVX-512). `schedule` unchanged where it does not
/// lower or no copy qualifies.
pub fn pack_panels(graph: &Graph, schedule: Schedule) -> Schedule {
    let Ok(program) = crate::lower::lower(graph, &schedule) else {
        return schedule;
    };
    let g = &program.graph;
    let mut schedule = schedule;
    for c in 0..g.stages.len() {
        let Expr::Load(TensorRef::Input(input), _) = &g.stages[c].body else {
            continue;
        };
        // `cache_read` puts the copy right before its reader.
        let reader = c + 1;
        let per_call = g.inputs.get(*input).is_some_and(|i| !i.constant);
        if !per_call
            || reader >= g.stages.len()
            || !g.stages[reader].body.loads().contains(&TensorRef::Stage(c))
        {
            continue;
        }
        let steps: Vec<Step> = schedule
            .steps
            .iter()
            .filter(|s| **s != Step::Parallel { stage: c, at: 0 })
            .cloned()
            .collect();
        for at in 0..MAX_LOOPS_PER_STAGE {
            let mut trial = Schedule {
                steps: steps.clone(),
            };
            trial.steps.push(Step::PackAt {
                stage: c,
                target: reader,
                at,
            });
            let Ok(p) = crate::lower::lower(graph, &trial) else {
                continue;
            };
            if copy_repeats(&p, c) <= MAX_PACK_REPEATS {
                schedule = trial;
            }
            break;
        }
    }
    schedule
}

/// The most times a panel may be copied per call inside its reader (once per block of filters
/// outside the panel loop): ResNet-50's 1x1 convolution at 56x56, 256 -> 128 channels, ran
/// 1.07x / 1.41x faster at 1 / 2 threads copying each panel twice, where 64 -> 64 (8 copies)
/// ran 0.89x and 64 -> 256 (32 copies) 0.67x (`harl-bench probe --against`, AVX-512).
pub const MAX_PACK_REPEATS: u128 = 2;

/// How many times per call the program stores each element of stage `c` (rounded down): the
/// loops around a packed copy repeat its panels that often.
fn copy_repeats(p: &Program, c: usize) -> u128 {
    fn stores(stmts: &[Stmt], c: usize, trips: u128) -> u128 {
        stmts
            .iter()
            .map(|s| match s {
                Stmt::For { extent, body, .. } => stores(body, c, trips * *extent as u128),
                Stmt::Store { stage, .. } if *stage == c => trips,
                other => stores(other.body(), c, trips),
            })
            .sum()
    }
    let total: u128 = p.nests.iter().map(|n| stores(&n.body, c, 1)).sum();
    let size: u128 = p.graph.stages[c].shape.iter().map(|&n| n as u128).product();
    total / size.max(1)
}

/// The share of vector lanes doing work when `n` elements are computed as codegen emits them
/// for a vector of `lanes`: full vectors, then one each of the halves that fit (down to 4
/// lanes), then one scalar operation per element left, except where the remainder after the
/// 16- or 8-lane vectors is one masked vector ([`masked_rest`]). 28 elements on 16 lanes:
/// 16 + a masked 12, two operations for 28 of 32 lanes; 49: 16 x 3 and one scalar.
pub fn lane_use(n: usize, lanes: usize) -> f64 {
    if n == 0 || lanes == 0 {
        return 0.0;
    }
    let mut ops = n / lanes;
    let mut rest = n % lanes;
    let mut w = lanes;
    while w >= 4 && rest > 0 {
        if rest >= w {
            ops += 1;
            rest -= w;
        }
        if masked_rest(w, rest) {
            ops += 1;
            rest = 0;
        }
        w /= 2;
    }
    ops += rest;
    n as f64 / (ops * lanes) as f64
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ops::workloads as w;

    /// An AVX2 target with `threads` threads, as the tests below plan for.
    fn avx2(threads: usize) -> CpuTarget {
        CpuTarget {
            vector_bytes: 32,
            acc_registers: 12,
            vector_registers: 16,
            threads,
        }
    }

    /// Small integers for each of `g`'s inputs, so that sums in any order are exact.
    fn sample_inputs(g: &Graph) -> Vec<Vec<f64>> {
        g.inputs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                (0..p.shape.iter().product::<usize>())
                    .map(|j| ((j * 7 + i * 3) % 11) as f64 - 5.0)
                    .collect()
            })
            .collect()
    }

    /// A flattened 1x1 convolution `y[n, f, p] = sum_c w[f, c] x[n, c, p]`.
    fn pointwise(c: usize, f: usize, pixels: usize) -> Graph {
        let mut b = harl_te::GraphBuilder::new();
        let x = b.input("x", &[1, c, pixels], harl_te::DType::F32);
        let wt = b.weight("w", &[f, c], harl_te::DType::F32);
        let _ = b.reduce(
            "y",
            &[1, f, pixels],
            harl_te::DType::F32,
            harl_te::ReduceOp::Sum,
            &[c],
            Expr::Load(wt, vec![Expr::axis(1), Expr::axis(3)]).binary(
                harl_te::BinaryOp::Mul,
                Expr::Load(x, vec![Expr::axis(0), Expr::axis(3), Expr::axis(2)]),
            ),
        );
        b.finish().expect("graph")
    }

    /// A 1x1 convolution of stride 1 in four dimensions, as built: `finish` would merge its
    /// pixels (`harl_te::merge`), but a graph read from a record or a dataset keeps this form.
    fn pointwise_4d(c: usize, hw: usize, f: usize) -> Graph {
        let mut b = harl_te::GraphBuilder::new();
        let x = b.input("x", &[1, c, hw, hw], harl_te::DType::F32);
        let wt = b.input("w", &[f, c, 1, 1], harl_te::DType::F32);
        let p = harl_te::ops::Conv2dParams {
            stride: (1, 1),
            pad: (0, 0),
            dilation: (1, 1),
            groups: 1,
        };
        harl_te::ops::conv2d(&mut b, x, wt, p).expect("conv2d");
        b.graph().clone()
    }

    /// The activation's panels are copied inside the convolution's loop over them, once
    /// each, into one panel per thread; the weights' copy is `prepare`'s, never packed.
    #[test]
    fn activation_panels_are_packed_where_they_are_read() {
        let avx512 = CpuTarget {
            vector_bytes: 64,
            acc_registers: 16,
            vector_registers: 32,
            threads: 2,
        };
        for (c, f) in [(256, 64), (256, 128)] {
            let g = pointwise(c, f, 3136);
            let schedule = crate::default_schedule::default_schedule(&g, &avx512);
            let packed: Vec<&Step> = schedule
                .steps
                .iter()
                .filter(|s| matches!(s, Step::PackAt { .. }))
                .collect();
            assert_eq!(packed.len(), 1, "{c} -> {f}: {:?}", schedule.steps);
            let p = crate::lower::lower(&g, &schedule).expect("lowers");
            let Step::PackAt { stage, .. } = packed[0] else {
                unreachable!()
            };
            assert_eq!(p.fold[*stage], 1);
            assert!(copy_repeats(&p, *stage) <= MAX_PACK_REPEATS);
        }
        // A short reduction keeps its filters' blocks outside the panels: packing there would
        // copy each panel for every block, so the whole-input copy stays.
        let g = pointwise(64, 256, 3136);
        let schedule = crate::default_schedule::default_schedule(&g, &avx512);
        assert!(
            !schedule
                .steps
                .iter()
                .any(|s| matches!(s, Step::PackAt { .. })),
            "{:?}",
            schedule.steps
        );
    }

    /// A 1x1 convolution's input is copied with its channels next to its row when enough
    /// filters reuse it; not with few filters, not when the channels are already there.
    #[test]
    fn convolution_inputs_are_read_in_rows() {
        let g = pointwise_4d(256, 7, 256);
        let s = g.stages.len() - 1;
        let l = row_copy(&g, s, None, 1).expect("a row copy");
        assert_eq!((l.input, l.order, l.panel), (0, vec![0, 2, 1, 3], None));
        // The default schedule makes it, beside the filter's layout (a reduction long enough
        // to pay for the layout's write-back: with 4 channels the 7-pixel row tile stays).
        let avx2 = avx2(2);
        let steps = crate::default_schedule::default_schedule(&g, &avx2).steps;
        let copies: Vec<usize> = steps
            .iter()
            .filter_map(|st| match st {
                Step::CacheRead { input, .. } => Some(*input),
                _ => None,
            })
            .collect();
        assert_eq!(copies, vec![1, 0], "{steps:?}");
        let short = pointwise_4d(4, 7, 256);
        assert!(layout_choice(&short, short.stages.len() - 1, &avx2).is_none());
        let few = pointwise_4d(4, 7, 64);
        assert!(
            row_copy(&few, few.stages.len() - 1, None, 1).is_none(),
            "64 filters"
        );
        // A GEMM's B[k, n] already has its reduction next to its row.
        let gemm = w::matmul(64, 256, 512).expect("matmul");
        assert!(row_copy(&gemm, gemm.stages.len() - 1, None, 1).is_none());
    }

    /// A 1x1 convolution over flattened short rows (49 pixels) takes the filter layout and reads
    /// its input, whose channels already sit next to the row, in panels of the tile's pixels;
    /// the loop nest computes what the graph computes. With the whole row in one tile, or too
    /// few filters to reuse the copy, there is no panel copy.
    #[test]
    fn short_flattened_rows_are_read_in_panels_of_the_tile() {
        let avx2 = avx2(2);
        let mut g = pointwise(160, 256, 49);
        g.inputs[1].constant = true;
        let s = g.stages.len() - 1;
        let filter = layout_choice(&g, s, &avx2).expect("a filter layout");
        assert_eq!((filter.input, filter.vec_axis), (1, 1));
        let rows = |g: &Graph, t: usize| row_copy(g, g.stages.len() - 1, Some(&filter), t);
        assert_eq!(rows(&g, 7).map(|l| (l.input, l.panel)), Some((0, Some(7))));
        assert_eq!(rows(&g, 49), None, "one tile takes the whole row");
        assert_eq!(rows(&g, 5), None, "5 does not divide 49");
        assert_eq!(rows(&pointwise(160, 64, 49), 7), None, "64 filters");
        let schedule = crate::default_schedule::default_schedule(&g, &avx2);
        let panels: Vec<(usize, Option<usize>)> = schedule
            .steps
            .iter()
            .filter_map(|st| match st {
                Step::CacheRead { input, panel, .. } => Some((*input, *panel)),
                _ => None,
            })
            .collect();
        assert!(
            panels
                .iter()
                .any(|&(i, p)| i == 0 && p.is_some_and(|p| p < 49)),
            "{schedule:?}"
        );
        let program = crate::lower::lower(&g, &schedule).expect("lowers");
        let inputs = sample_inputs(&g);
        let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
        let want = harl_te::interp::run(&g, &refs).expect("graph");
        let got = crate::loop_ir::execute(&program, &refs).expect("loop nest");
        assert_eq!(got, want, "{schedule:?}");
    }

    /// On AVX2 a 56-pixel row fills its vectors, but a 3x3 window along it is read better
    /// through the filter axis (the tile model's 4 x 2 vectors against 8 x 1); a 1x1
    /// convolution of the same shape keeps its row tile.
    #[test]
    fn windowed_rows_take_the_filter_axis_when_the_model_says_so() {
        let avx2 = avx2(1);
        let mut g = w::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1).expect("conv2d");
        g.inputs[1].constant = true;
        let s = g.stages.len() - 1;
        let l = layout_choice(&g, s, &avx2).expect("a filter layout");
        assert_eq!((l.input, l.vec_axis), (1, 1));
        let mut p = pointwise_4d(64, 56, 64);
        p.inputs[1].constant = true;
        assert!(layout_choice(&p, p.stages.len() - 1, &avx2).is_none());
    }

    /// A 1x1 convolution of stride 2 reads every second pixel of every second row: its row copy
    /// holds only those (a quarter of the input), channels next to the row, and the program
    /// lowered from the default schedule computes what the graph computes.
    #[test]
    fn strided_rows_are_copied_sampled() {
        let g = w::conv2d(1, 16, 14, 14, 256, 1, 1, 2, 0, 1, 1).expect("conv2d");
        let s = g.stages.len() - 1;
        let stage = &g.stages[s];
        assert_eq!(sample_factors(stage, 0, 4), vec![1, 1, 2, 2]);
        assert_eq!(sample_factors(stage, 1, 4), vec![1, 1, 1, 1]);
        let filter = layout_choice(&g, s, &CpuTarget::host()).expect("a filter layout");
        let l = row_copy(&g, s, Some(&filter), 1).expect("a sampled row copy");
        assert_eq!((l.input, l.order), (0, vec![0, 2, 1, 3]));
        // A 3x3 window of stride 2 reads every pixel: no sampling, no row copy.
        let g3 = w::conv2d(1, 16, 14, 14, 256, 3, 3, 2, 1, 1, 1).expect("conv2d");
        let s3 = g3.stages.len() - 1;
        assert!(sample_factors(&g3.stages[s3], 0, 4).iter().all(|&f| f == 1));
        assert!(row_copy(&g3, s3, None, 1).is_none());
        // Indices: `2 * oh + kh` with kh of extent 1 is `oh` in the copy; an odd one is not.
        let ext = [1, 256, 7, 7, 16, 1, 1];
        let e = Expr::Axis(2) * Expr::int(2) + Expr::Axis(5);
        assert_eq!(sampled_index(&e, 2, &ext), Some(Expr::Axis(2)));
        assert_eq!(sampled_index(&(e + Expr::int(1)), 2, &ext), None);
        let avx2 = avx2(2);
        let schedule = crate::default_schedule::default_schedule(&g, &avx2);
        let program = crate::lower::lower(&g, &schedule).expect("lowers");
        let copy = program
            .graph
            .stages
            .iter()
            .find(|st| st.name.ends_with("_read0"))
            .expect("the input's copy");
        assert_eq!(copy.shape, vec![1, 7, 16, 7], "{schedule:?}");
        let inputs = sample_inputs(&g);
        let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
        let want = harl_te::interp::run(&g, &refs).expect("graph");
        let got = harl_te::interp::run(&program.graph, &refs).expect("scheduled graph");
        assert_eq!(got, want);
    }

    /// A weight read along the output's last axis and a reduction is packed in panels, and so
    /// is a well reused activation with long rows; a little reused one, a filter read along
    /// other axes, or a too-narrow panel is not.
    #[test]
    fn weights_along_the_vector_axis_go_in_panels() {
        let mut g = w::dense_bias_relu(8, 64, 256).expect("dense");
        let s = (0..g.stages.len())
            .find(|&s| g.stages[s].reduce.is_some())
            .expect("the matmul");
        assert_eq!(panel_input(&g, s), None, "an activation reused by 8 rows");
        // An activation with long rows reused by many rows is copied into panels on each call.
        let gemm = w::matmul(64, 256, 512).expect("matmul");
        assert_eq!(panel_input(&gemm, gemm.stages.len() - 1), Some(1));
        let narrow = w::matmul(64, 256, 64).expect("matmul");
        assert_eq!(
            panel_input(&narrow, narrow.stages.len() - 1),
            None,
            "short rows"
        );
        g.inputs[1].constant = true;
        g.inputs[2].constant = true;
        assert_eq!(panel_input(&g, s), Some(1));
        let l = panel_layout(&g, s, 32).expect("panels");
        assert_eq!((l.order, l.panel), (vec![0, 1], Some(32)));
        // Not narrower than the axis, and dividing it.
        assert!(panel_layout(&g, s, 256).is_none());
        assert!(panel_layout(&g, s, 48).is_none());
        assert!(panel_layout(&g, s, 1).is_none());
        // A convolution's filter is read along the output channels, not the row.
        let mut c = w::conv2d(1, 8, 14, 14, 32, 3, 3, 1, 1, 1, 1).expect("conv2d");
        c.inputs[1].constant = true;
        let s = c.stages.len() - 1;
        assert_eq!(panel_input(&c, s), None);
    }

    #[test]
    fn lane_use_counts_the_operations_codegen_emits() {
        assert_eq!(lane_use(32, 16), 1.0);
        // 16 + a masked 12: two operations.
        assert!((lane_use(28, 16) - 28.0 / 32.0).abs() < 1e-12);
        // One masked 8-lane vector.
        assert!((lane_use(7, 16) - 7.0 / 16.0).abs() < 1e-12);
        // 16 x 3, then one scalar; on 8 lanes 8 x 6 and one scalar.
        assert!((lane_use(49, 16) - 49.0 / 64.0).abs() < 1e-12);
        assert!((lane_use(49, 8) - 49.0 / 56.0).abs() < 1e-12);
        // 8 lanes: 8 + 4 (no mask), 8 + a masked 6.
        assert!((lane_use(12, 8) - 12.0 / 16.0).abs() < 1e-12);
        assert!((lane_use(14, 8) - 14.0 / 16.0).abs() < 1e-12);
        // 4 lanes (no explicit vectors): 4 + 3 scalars.
        assert!((lane_use(7, 4) - 7.0 / 16.0).abs() < 1e-12);
        assert_eq!(lane_use(0, 16), 0.0);
    }

    #[test]
    fn poor_rows_take_the_filter_axis_and_good_ones_keep_theirs() {
        let t = CpuTarget {
            vector_bytes: 64,
            acc_registers: 16,
            vector_registers: 32,
            threads: 1,
        };
        // Stride 2: always.
        let g = w::conv2d(1, 64, 28, 28, 64, 3, 3, 2, 1, 1, 1).expect("conv2d");
        let s = g.stages.len() - 1;
        let l = layout_choice(&g, s, &t).expect("a layout");
        assert_eq!((l.vec_axis, l.order.clone()), (1, vec![1, 2, 3, 0]));
        // 56 pixels a row (a 28-wide tile, 16 + a masked 12): the filter axis, 64 wide, is
        // better, over a reduction long enough to pay for its write-back.
        let g = w::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1).expect("conv2d");
        assert!(layout_choice(&g, g.stages.len() - 1, &t).is_some());
        // 64 pixels a row fill their vectors: no layout.
        let g = w::conv2d(1, 64, 64, 64, 64, 3, 3, 1, 1, 1, 1).expect("conv2d");
        assert!(layout_choice(&g, g.stages.len() - 1, &t).is_none());
        // A GEMM with a wide N keeps its row.
        let g = w::matmul(64, 64, 256).expect("matmul");
        assert!(layout_choice(&g, 0, &t).is_none());
        // A copy that would not pay for itself (one output row per filter element): none.
        let g = w::conv2d(1, 256, 1, 1, 256, 1, 1, 1, 0, 1, 1).expect("conv2d");
        assert!(layout_choice(&g, 0, &t).is_none());
    }

    /// A filter layout writes its tiles back across the output's rows: it must fill its
    /// vectors enough better than the row tile to pay for that ([`WRITE_BACK_CYCLES`]).
    #[test]
    fn a_layout_pays_for_its_write_back() {
        let t = crate::target::Variant::Avx512.cpu_target("x86_64", 1);
        // 196 pixels (7/8 of the lanes used, 16 + a masked 12) over 96 channels: the row tile.
        let g = pointwise(96, 576, 196);
        assert!(layout_choice(&g, g.stages.len() - 1, &t).is_none());
        // 49 pixels (16 x 3 and a scalar, 49/64) over 320 channels: the filter layout.
        let g = pointwise(320, 1280, 49);
        assert!(layout_choice(&g, g.stages.len() - 1, &t).is_some());
        assert!(
            cycles_per_output(96, 16, 1.0) + WRITE_BACK_CYCLES > cycles_per_output(96, 16, 0.875)
        );
        assert!(
            cycles_per_output(320, 16, 1.0) + WRITE_BACK_CYCLES
                < cycles_per_output(320, 16, 49.0 / 64.0)
        );
    }
}
