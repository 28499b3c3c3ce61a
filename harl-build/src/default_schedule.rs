//! The default schedule: what a kernel gets with no tuning record.
//!
//! It is the hand-written schedule an engineer would start from: elementwise producers inlined
//! (except padding-like stages with selects, which are materialised so inner loops stay
//! branch-free), reductions with a contiguous output axis tiled SSRSSRSS-style with a register
//! accumulator (`cache_write`) of `mr x nr` elements, the `nr` axis vectorised and `mr` unrolled,
//! the reduction split for cache blocking, elementwise consumers fused as an epilogue, and the
//! outer spatial loops fused and run in parallel.

use crate::layout::{copy_steps, layout_choice, panel_layout, Layout};
use crate::loop_ir::ACC_ROW_LANES;
use crate::register_tile::TileProblem;
use crate::rows::row_chains;
use crate::schedule::{Schedule, Step};
use harl_te::{DType, Expr, Graph, TensorRef};

pub use crate::target::CpuTarget;

/// Builds the default schedule for `graph`.
pub fn default_schedule(graph: &Graph, target: &CpuTarget) -> Schedule {
    schedule_with(graph, target, &[]).schedule
}

/// The tiles the default schedule gives each stage it tiles, in stage order: the tuner's
/// "default" sketch searches these and keeps the rest of the default (its layouts and panels,
/// row chains, epilogues, inlining).
pub fn default_tiles(graph: &Graph, target: &CpuTarget) -> Vec<(usize, TilePlan)> {
    schedule_with(graph, target, &[]).tiles
}

/// The default schedule with the tiles of some stages replaced (`(stage, tiles)`, as
/// [`default_tiles`] gives them, other extents). `None` unless every replacement was used as
/// given: the stage is tiled on the same axes, each axis's levels multiply to its extent, and
/// the schedule lowers.
pub fn default_schedule_with(
    graph: &Graph,
    target: &CpuTarget,
    tiles: &[(usize, TilePlan)],
) -> Option<Schedule> {
    let planned = schedule_with(graph, target, tiles);
    let all_used = tiles.iter().all(|t| planned.tiles.contains(t));
    (all_used && planned.lowers).then_some(planned.schedule)
}

/// A default schedule and what it was made of.
struct Planned {
    schedule: Schedule,
    /// The tiles of each tiled stage.
    tiles: Vec<(usize, TilePlan)>,
    /// Whether the schedule lowers (the last fallback is returned even when it does not).
    lowers: bool,
}

/// The default schedule with `overrides`' tiles where they fit.
fn schedule_with(graph: &Graph, target: &CpuTarget, overrides: &[(usize, TilePlan)]) -> Planned {
    // An inline the lowering refuses (one past the limits on inlined bodies, say a chain of
    // stages that each read the previous one twice) keeps that stage materialised instead;
    // each round refuses a new stage, so this ends.
    let mut keep = vec![false; graph.stages.len()];
    let mut options = Options {
        lanes: true,
        layouts: true,
        rows: true,
    };
    loop {
        let (schedule, tiles) = plan(graph, target, &keep, options, overrides);
        let lowered = crate::lower::lower(graph, &schedule);
        match lowered {
            Err(crate::lower::ScheduleError::Step {
                step: Step::ComputeInline { stage },
                ..
            }) if keep.get(stage) == Some(&false) => keep[stage] = true,
            // Layouts and vector-lane reductions are optimisations: a graph where they do not
            // lower goes without them.
            Err(_) if options.rows => options.rows = false,
            Err(_) if options.layouts => options.layouts = false,
            Err(_) if options.lanes => options.lanes = false,
            _ => {
                let lowers = lowered.is_ok();
                let schedule = if lowers {
                    crate::slide::slide_windows(graph, crate::layout::pack_panels(graph, schedule))
                } else {
                    schedule
                };
                return Planned {
                    schedule,
                    tiles,
                    lowers,
                };
            }
        }
    }
}

/// What the default schedule may use.
#[derive(Clone, Copy)]
struct Options {
    /// Row reductions split into vector lanes (rfactor).
    lanes: bool,
    /// Reductions tiled in a layout (cache_read).
    layouts: bool,
    /// Row chains computed within one loop over their rows.
    rows: bool,
}

/// The default schedule with the stages in `keep` never inlined, a tiled stage's tiles taken
/// from `overrides` where they fit it; and the tiles of each tiled stage.
fn plan(
    graph: &Graph,
    target: &CpuTarget,
    keep: &[bool],
    options: Options,
    overrides: &[(usize, TilePlan)],
) -> (Schedule, Vec<(usize, TilePlan)>) {
    let mut steps = Vec::new();
    let mut used = Vec::new();
    let Some(last) = graph.stages.len().checked_sub(1) else {
        return (Schedule { steps }, used);
    };
    // Inline cheap elementwise producers, keep padding (selects) materialised.
    let mut inlined = vec![false; graph.stages.len()];
    for (s, stage) in graph.stages.iter().enumerate().take(last) {
        // A producer of exponentials (or the like) read more than once is computed once.
        // So is a division or root that a consumer would repeat for every element it
        // broadcasts the value over (softmax's 1 / sum, one per row).
        let costly_to_repeat = (transcendental(&stage.body) && reads_of(graph, s) > 1)
            || (stage.dtype.is_float() && divides(&stage.body) && broadcast_read(graph, s));
        if stage.reduce.is_none() && !has_select(&stage.body) && !keep[s] && !costly_to_repeat {
            steps.push(Step::ComputeInline { stage: s });
            inlined[s] = true;
        }
    }
    for p in 0..last {
        if !inlined[p] && !keep[p] && padding_read_in_place(graph, &inlined, p, target) {
            steps.push(Step::ComputeInline { stage: p });
            inlined[p] = true;
        }
    }
    let reads = |c: usize| -> Vec<usize> {
        // Stages `c` reads once its inlined producers are substituted.
        let mut out = Vec::new();
        let mut stack = vec![c];
        while let Some(x) = stack.pop() {
            for t in graph.stages[x].body.loads() {
                if let TensorRef::Stage(p) = t {
                    if inlined[p] {
                        stack.push(p);
                    } else if !out.contains(&p) {
                        out.push(p);
                    }
                }
            }
        }
        out
    };
    let mut attached = vec![false; graph.stages.len()];
    // Stages inserted before a stage: rfactor partials and cache_read copies.
    let mut inserts: Vec<(usize, Insert)> = Vec::new();
    // Row chains (softmax, layer norm): each member scheduled for its rows' loop, computed
    // within the first member's (`rows`), attached once the inserts' indices are known.
    let mut chains = if options.rows {
        row_chains(graph, &inlined)
    } else {
        Vec::new()
    };
    // A chain that ends in a plane reduction's elementwise epilogue (a depthwise
    // convolution's bias and ReLU6) computes it in the reduction's write-back instead of as a
    // pass of its own over each plane.
    let mut chain_epilogues = Vec::new();
    for chain in &mut chains {
        if let [.., r, m] = chain.members[..] {
            let rs = &graph.stages[r];
            if rs.reduce.is_some()
                && rs.n_spatial() > chain.k
                && graph.stages[m].reduce.is_none()
                && fusable_epilogue(graph, r, m, &reads(m), &inlined)
            {
                chain.members.pop();
                attached[m] = true;
                // A convolution that starts its chain has its rows fused into one loop.
                let (ns, k) = plane_loops(rs.n_spatial(), chain.k, chain.members == [r]);
                let at = plane_block_loop(ns, k);
                chain_epilogues.push(Step::ComputeAt {
                    stage: m,
                    target: r,
                    at,
                });
            }
        }
    }
    let mut row_of: Vec<Option<RowRole>> = vec![None; graph.stages.len()];
    for chain in &chains {
        for (i, &m) in chain.members.iter().enumerate() {
            row_of[m] = Some(RowRole {
                k: chain.k,
                first: i == 0,
            });
            attached[m] = true;
        }
    }
    for chain in &chains {
        for &m in &chain.members {
            // Up to four vectors of lanes: in one long row nest, a single vector's chain of
            // dependent adds is what a row waits on (layer norm's mean and variance over 768
            // columns: 48 dependent FMAs each), and the next row is too far ahead for the
            // core to overlap it.
            let lanes = row_reduction_lanes(graph, m, target)
                .filter(|_| options.lanes)
                .map(|l| widen_lanes(graph, m, l));
            emit_row_member(
                &mut steps,
                graph,
                m,
                chain.k,
                lanes,
                m == chain.members[0],
                target,
            );
            if let Some(factor) = lanes {
                inserts.push((m, Insert::Rfactor(factor)));
            }
        }
    }
    steps.extend(chain_epilogues);
    for s in 0..graph.stages.len() {
        if inlined[s] || attached[s] {
            continue;
        }
        let stage = &graph.stages[s];
        // A row reduction (its reduction walks memory, nothing walks the output's last axis
        // contiguously in its place) splits into vector lanes; other reductions are tiled,
        // along their last axis or, where that is a poor vector, in a layout.
        let lanes = row_reduction_lanes(graph, s, target).filter(|_| options.lanes);
        let mut layout = stage
            .reduce
            .as_ref()
            .filter(|_| lanes.is_none() && options.layouts)
            .and_then(|_| layout_choice(graph, s, target));
        let plan = match &layout {
            Some(l) => Some(layout_tiles(graph, s, target, l)),
            None => stage
                .reduce
                .as_ref()
                .filter(|_| lanes.is_none())
                .and_then(|_| plan_tiles(graph, s, target)),
        };
        let replaced = plan.as_ref().and_then(|p| {
            overrides
                .iter()
                .find(|(o, t)| *o == s && t.fits(graph, s, p))
                .map(|(_, t)| t.clone())
        });
        let plan = replaced.or(plan);
        if let Some(p) = &plan {
            used.push((s, p.clone()));
        }
        if let (Some(p), Some(l)) = (&plan, layout.as_mut()) {
            // A weight's layout copy is in panels as wide as the register tile.
            let extent = stage.shape[l.vec_axis];
            l.panel = l
                .panel
                .and(Some(p.vec[2]))
                .filter(|&w| w > 1 && w < extent && extent.is_multiple_of(w));
        }
        // A plain tile reads a weight in panels of its width (`layout::panel_layout`); a thin
        // tile in narrower panels, one stream each (`thin_streams`).
        let lanes_of = vector_lanes(target, stage.dtype);
        let streams = plan.as_ref().map_or(1, |p| thin_streams(p, lanes_of));
        let panels = plan
            .as_ref()
            .filter(|_| layout.is_none() && options.layouts)
            .and_then(|p| panel_layout(graph, s, p.vec[2] / streams));
        let streams = if panels.is_some() { streams } else { 1 };
        // A layout always has its tiles (`layout_tiles`).
        let in_layout = layout.is_some();
        // A tiled stage reads its operand along the last axis in rows (`layout::row_copy`).
        let copy = layout.or(panels);
        // In panels of the register tile's rows where the row is read in tiles of them.
        let rows = plan.as_ref().filter(|_| options.layouts).and_then(|p| {
            let last = stage.n_spatial().checked_sub(1);
            let row_tile = p
                .row_axis
                .filter(|&a| Some(a) == last)
                .map_or(1, |_| p.row[2]);
            crate::layout::row_copy(graph, s, copy.as_ref(), row_tile)
        });
        // A layout's tile of up to 8 pixels by whole 8-lane groups of filters is written back
        // through 8 x 8 transposes (`codegen::simd`), vectors along the output's rows: its
        // consumer can then be computed there too.
        let transposed = plan.as_ref().is_some_and(|p| {
            p.block.is_none()
                && p.row_axis.is_some_and(|a| a + 1 == stage.n_spatial())
                && (2..=ACC_ROW_LANES).contains(&p.row[2])
                && p.vec[2] % ACC_ROW_LANES == 0
        });
        let tiled = plan.map(|plan| emit_tiled(&mut steps, graph, s, &plan, streams));
        for l in copy.into_iter().chain(rows) {
            inserts.push((s, Insert::CacheRead(l)));
        }
        match tiled {
            // A tile in a layout whose write-back is not transposed keeps its consumers apart:
            // fused, they would walk the output across its rows (a filter-major tile), and ran
            // 1.5-2x slower than a pass of their own over the whole output (`harl-bench probe
            // --workload resnet_s1_1x1_64`); even computed in a write-back of scalar stores
            // they were 2-13% slower than their own pass (AVX-512, 2026-12-04). Through the
            // transposes they are computed on vectors along the rows: MobileNet-V2's stem 147
            // us with the transposes alone, 142 fused (AVX-512, 1 thread, 2026-12-07).
            Some(_) if in_layout && !transposed => {}
            Some(epilogue_at) => {
                // Fuse one elementwise consumer that reads this stage where it was written.
                let consumer =
                    (s + 1..graph.stages.len()).find(|&c| !inlined[c] && reads(c).contains(&s));
                if let Some(c) = consumer {
                    if fusable_epilogue(graph, s, c, &reads(c), &inlined) {
                        steps.push(Step::ComputeAt {
                            stage: c,
                            target: s,
                            at: epilogue_at,
                        });
                        attached[c] = true;
                    }
                }
            }
            None => match lanes {
                Some(factor) => {
                    inserts.push((s, Insert::Rfactor(factor)));
                    // The final reduction over the lanes: rows in parallel.
                    if stage.n_spatial() >= 1 && stage.size() >= 64 {
                        steps.push(Step::Parallel { stage: s, at: 0 });
                    }
                }
                None => emit_simple(&mut steps, graph, s, target),
            },
        }
    }
    // Inserts apply in stage order (each one's index counts the earlier ones).
    inserts.sort_by_key(|(r, _)| *r);
    // Each insert puts its stage before the stage: the inserting steps first (their own
    // indices counting the earlier ones), every other step with its stage indices moved past
    // them, then the inserted stages' steps.
    let inserted: Vec<usize> = inserts.iter().map(|(r, _)| *r).collect();
    let new_index = |s: usize| s + inserted.iter().filter(|&&r| r <= s).count();
    let mut out: Vec<Step> = inserts
        .iter()
        .enumerate()
        .map(|(k, (r, insert))| match insert {
            Insert::Rfactor(factor) => Step::Rfactor {
                stage: r + k,
                factor: *factor,
            },
            Insert::CacheRead(l) => Step::CacheRead {
                stage: r + k,
                input: l.input,
                order: l.order.clone(),
                panel: l.panel,
            },
        })
        .collect();
    out.extend(steps.into_iter().map(|step| renumber(step, &new_index)));
    for (k, (r, insert)) in inserts.iter().enumerate() {
        let p = r + k;
        match insert {
            Insert::Rfactor(_) => {
                // The partial stage's loops are [spatial..., reduce, lane]: the reduction goes
                // outside the lane, which is innermost and vectorised, each lane its own
                // accumulator.
                let ns = graph.stages[*r].n_spatial();
                let order: Vec<usize> = (0..ns).chain([ns + 1, ns]).collect();
                out.push(Step::Reorder { stage: p, order });
                let mut vector_at = ns + 1;
                match row_of[*r] {
                    // In a row chain the lanes accumulate in registers, one row at a time;
                    // the chain's first partial runs the rows' loop (fused, parallel).
                    Some(role) => {
                        if role.first {
                            fuse_rows(&mut out, p, role.k);
                            vector_at -= role.k - 1;
                            out.push(Step::CacheWrite { stage: p, at: 0 });
                            out.push(Step::Parallel { stage: p, at: 0 });
                        } else {
                            out.push(Step::CacheWrite {
                                stage: p,
                                at: role.k - 1,
                            });
                        }
                    }
                    None if ns >= 1 => out.push(Step::Parallel { stage: p, at: 0 }),
                    None => {}
                }
                out.push(Step::Vectorize {
                    stage: p,
                    at: vector_at,
                });
            }
            Insert::CacheRead(l) => out.extend(copy_steps(p, graph, *r, l)),
        }
    }
    // Each chain computed within its first stage's rows loop (the first rfactor partial,
    // where the first member has one).
    for chain in &chains {
        let mut stages = Vec::new();
        for &m in &chain.members {
            if inserted.contains(&m) {
                stages.push(new_index(m) - 1);
            }
            stages.push(new_index(m));
        }
        if let Some((first, rest)) = stages.split_first() {
            out.extend(rest.iter().map(|&stage| Step::ComputeWithin {
                stage,
                target: *first,
                at: 0,
            }));
        }
    }
    (Schedule { steps: out }, used)
}

/// `lanes` times the most vectors (4, 2 or 1) that divide stage `s`'s reduction and leave
/// each at least eight steps: a short chain is not worth a horizontal reduction per vector
/// (BERT's softmax, 128 columns: 68 us with one vector, 73-75 with four, one core).
fn widen_lanes(graph: &Graph, s: usize, lanes: usize) -> usize {
    let extent = graph.stages[s]
        .reduce
        .as_ref()
        .map_or(0, |r| r.extents.iter().product());
    [4, 2]
        .into_iter()
        .map(|m| m * lanes)
        .find(|&f| extent.is_multiple_of(f) && extent / f >= 8)
        .unwrap_or(lanes)
}

/// A reduction with spatial axes past the rows (a depthwise convolution within its padding,
/// per channel): the reduce loops inside the other spatial loops, the last spatial axis
/// innermost and vectorised, accumulated in a block of [`plane_rows`] output rows whose
/// loop, unrolled, sits inside the reduce loops: each tap's weight then feeds that many
/// independent accumulator chains instead of one.
///
/// With `fused`, its `k` row loops are already one (loop positions past them move down): a
/// convolution that reads its padding in place ([`padding_read_in_place`]), whose taps along
/// the row are then unrolled so that the padding's masks are constants.
fn emit_plane_reduction(
    steps: &mut Vec<Step>,
    graph: &Graph,
    s: usize,
    k: usize,
    fused: bool,
    target: &CpuTarget,
) {
    let stage = &graph.stages[s];
    let (ns, k) = plane_loops(stage.n_spatial(), k, fused);
    let gone = stage.n_spatial() - ns;
    let n_axes = stage.axis_extents().len() - gone;
    let order: Vec<usize> = (0..ns - 1).chain(ns..n_axes).chain([ns - 1]).collect();
    steps.push(Step::Reorder { stage: s, order });
    let block = plane_block_loop(ns, k);
    let lanes = vector_lanes(target, stage.dtype);
    let width = stage.shape[stage.n_spatial() - 1];
    let rows = plane_rows(stage.shape[block + gone], width, lanes);
    let mut last = n_axes - 1;
    if rows > 1 {
        // Loops `block` and `block + 1` are the block's rows; the rows go in front of the
        // vector loop, behind the reduce loops.
        steps.push(Step::Split {
            stage: s,
            at: block,
            factors: vec![rows],
        });
        last += 1;
        let order: Vec<usize> = (0..=block)
            .chain(block + 2..last)
            .chain([block + 1, last])
            .collect();
        steps.push(Step::Reorder { stage: s, order });
        steps.push(Step::Unroll {
            stage: s,
            at: last - 1,
        });
    }
    steps.push(Step::CacheWrite {
        stage: s,
        at: block,
    });
    if fused {
        // Unrolled taps along the row: each one's masks for the padding are constants.
        let taps = if rows > 1 { last - 2 } else { last - 1 };
        if taps > block {
            steps.push(Step::Unroll { stage: s, at: taps });
        }
    }
    if width >= 4 {
        steps.push(Step::Vectorize { stage: s, at: last });
    }
}

/// Independent accumulator vectors a plane reduction's block aims for: enough to cover a
/// fused multiply-add's latency on two pipes, few enough to leave registers for the loads.
const PLANE_ACCUMULATORS: usize = 8;

/// The output rows a plane reduction accumulates at once: the largest divisor of its `rows`
/// whose rows of `width` elements (whole and partial `lanes`-wide vectors) stay within
/// [`PLANE_ACCUMULATORS`]. One row of a 7x7 plane is one vector, whose 9 taps, as one chain
/// of dependent multiply-adds, left the pipes idle.
fn plane_rows(rows: usize, width: usize, lanes: usize) -> usize {
    let vectors = width.div_ceil(lanes).max(1);
    largest_divisor_at_most(rows, PLANE_ACCUMULATORS / vectors)
}

/// A plane reduction's spatial loops and row loops (`ns` spatial axes, rows of `k`), with its
/// rows `fused` into one loop or not.
fn plane_loops(ns: usize, k: usize, fused: bool) -> (usize, usize) {
    if fused {
        (ns + 1 - k, 1)
    } else {
        (ns, k)
    }
}

/// The loop of a plane reduction ([`emit_plane_reduction`]; `ns` spatial axes, rows of `k`)
/// that holds its accumulator block: the last spatial loop outside the vector axis.
fn plane_block_loop(ns: usize, k: usize) -> usize {
    (ns - 1).max(k) - 1
}

/// Where a stage sits in a row chain.
#[derive(Clone, Copy)]
struct RowRole {
    /// The rows' leading axes.
    k: usize,
    /// The chain's first member (its loops hold the others).
    first: bool,
}

/// Fuses the first `k` loops of `stage` (the rows) into one.
fn fuse_rows(steps: &mut Vec<Step>, stage: usize, k: usize) {
    for _ in 1..k {
        steps.push(Step::Fuse { stage, at: 0 });
    }
}

/// The steps of row-chain member `s` (graph index) over rows of `k` leading axes: a reduction
/// accumulates in a block at the rows' loop (or, split into `lanes`, leaves that to its
/// partial stage and reduces the lanes there); an elementwise stage vectorises the rest of
/// its row. The first member's rows loop is fused and parallel unless its partial holds it.
fn emit_row_member(
    steps: &mut Vec<Step>,
    graph: &Graph,
    s: usize,
    k: usize,
    lanes: Option<usize>,
    first: bool,
    target: &CpuTarget,
) {
    let stage = &graph.stages[s];
    let ns = stage.n_spatial();
    if stage.reduce.is_some() && ns > k {
        if first {
            // It reads its padding in place: its rows are its own parallel loop.
            fuse_rows(steps, s, k);
            emit_plane_reduction(steps, graph, s, k, true, target);
            steps.push(Step::Parallel { stage: s, at: 0 });
        } else {
            emit_plane_reduction(steps, graph, s, k, false, target);
        }
        return;
    }
    if stage.reduce.is_some() {
        if first && lanes.is_none() {
            fuse_rows(steps, s, k);
            steps.push(Step::CacheWrite { stage: s, at: 0 });
            steps.push(Step::Parallel { stage: s, at: 0 });
        } else {
            steps.push(Step::CacheWrite {
                stage: s,
                at: k - 1,
            });
        }
        if lanes.is_some() {
            // The reduction over the partials' lanes: one horizontal vector reduction per row
            // instead of a chain of scalar operations (1.4x on BERT's softmax, one core).
            steps.push(Step::Vectorize { stage: s, at: k });
        }
        return;
    }
    if first {
        fuse_rows(steps, s, k);
        steps.push(Step::Parallel { stage: s, at: 0 });
    }
    // A padding stage keeps plain loops: partitioning gives them a select-free interior.
    if ns == k || has_select(&stage.body) {
        return;
    }
    let lanes = vector_lanes(target, stage.dtype);
    let last = stage.shape[ns - 1];
    let Some(v) = last_axis_vector(last, lanes) else {
        return;
    };
    let mut loops = Loops::new(s, stage.axis_extents().len());
    if v < last {
        loops.split(steps, ns - 1, &[v]);
    }
    steps.push(Step::Vectorize {
        stage: s,
        at: loops.tags.len() - 1,
    });
}

/// The vector loop of a last axis of `last` elements with `lanes`-wide vectors: a divisor of
/// up to two vectors split off it, or the whole axis where it has none and is short; `None`
/// for a prime-ish extent too long to unroll whole (the compiler keeps that loop).
fn last_axis_vector(last: usize, lanes: usize) -> Option<usize> {
    let v = largest_divisor_at_most(last, 2 * lanes);
    if v > 1 && v < last {
        Some(v)
    } else if last > 4 * lanes {
        None
    } else {
        Some(last)
    }
}

/// A stage the default schedule inserts before stage `s`.
enum Insert {
    /// Rfactor partials, this many lanes.
    Rfactor(usize),
    /// A copy of a graph input in a layout.
    CacheRead(Layout),
}

/// The register tile of a stage in a layout ([`crate::register_tile::choose`]): the layout's
/// axis as the vector, the last axis as rows, the whole reduction inside, every outer loop
/// parallel.
pub fn layout_tiles(graph: &Graph, s: usize, target: &CpuTarget, l: &Layout) -> TilePlan {
    let stage = &graph.stages[s];
    let last = stage.n_spatial() - 1;
    let vext = stage.shape[l.vec_axis];
    // The layout's panels, if any, have the tile's width.
    let problem = TileProblem {
        vec_extent: vext,
        row_extent: stage.shape[last],
        reduction: stage
            .reduce
            .as_ref()
            .map_or(1, |r| r.extents.iter().product()),
        elem_bytes: elem_bytes(stage.dtype),
    };
    // Without a window (a 1x1 convolution) the filter tile may fill the register file. With
    // one, the tile may take pixels of the output row before the last too (`choose_block`).
    let other = last
        .checked_sub(1)
        .filter(|&a| a != l.vec_axis && stage.shape[a] > 1);
    let (tile, block) = if crate::layout::windowed(stage) {
        match other {
            Some(a) => {
                let (tile, rows2) =
                    crate::register_tile::choose_block(&problem, stage.shape[a], target);
                (tile, Some((a, rows2)).filter(|&(_, r)| r > 1))
            }
            None => (crate::register_tile::choose(&problem, target), None),
        }
    } else {
        (
            crate::register_tile::choose_panel_tile(&problem, target),
            None,
        )
    };
    let (nr, mr) = (tile.width, tile.rows);
    let red = stage.reduce.as_ref().map_or(1, |r| r.extents[0]);
    TilePlan {
        vec_axis: l.vec_axis,
        row_axis: Some(last),
        vec: [vext / nr, 1, nr],
        row: [stage.shape[last] / mr, 1, mr],
        red: [1, red],
        block,
    }
}

/// A row reduction that vectorises by splitting its reduction into vector lanes (rfactor):
/// one reduce axis, walked contiguously (unit stride in the last index of every load that
/// uses it) and long enough; returns the lane count. A float reduction along its own axis does
/// not vectorise otherwise (the compiler may not reorder float sums); softmax's and layer
/// norm's row sums are such reductions.
fn row_reduction_lanes(graph: &Graph, s: usize, target: &CpuTarget) -> Option<usize> {
    let stage = &graph.stages[s];
    let r = stage.reduce.as_ref()?;
    if r.extents.len() != 1 {
        return None;
    }
    let ns = stage.n_spatial();
    let n_axes = ns + 1;
    let lanes = vector_lanes(target, stage.dtype);
    let extent = r.extents[0];
    if extent < 4 * lanes || !extent.is_multiple_of(lanes) {
        return None;
    }

    let mut contiguous = true;
    let mut walked = false;
    stage.body.visit(&mut |e| {
        if let Expr::Load(_, idx) = e {
            let Some((last, rest)) = idx.split_last() else {
                return;
            };
            if rest.iter().any(|i| uses_axis(i, ns)) {
                contiguous = false;
            }
            if uses_axis(last, ns) {
                walked = true;
                contiguous &= last.stride(ns, n_axes) == Some(1);
            }
        }
    });
    (contiguous && walked).then_some(lanes)
}

/// `step` with its stage indices mapped by `f`.
fn renumber(step: Step, f: &dyn Fn(usize) -> usize) -> Step {
    let mut step = step;
    match &mut step {
        Step::Split { stage, .. }
        | Step::Reorder { stage, .. }
        | Step::Fuse { stage, .. }
        | Step::ComputeInline { stage }
        | Step::CacheWrite { stage, .. }
        | Step::Rfactor { stage, .. }
        | Step::CacheRead { stage, .. }
        | Step::Parallel { stage, .. }
        | Step::Vectorize { stage, .. }
        | Step::Unroll { stage, .. }
        | Step::SharedRead { stage, .. }
        | Step::BindBlock { stage, .. }
        | Step::BindThread { stage, .. }
        | Step::Slide { stage } => *stage = f(*stage),
        Step::ComputeAt { stage, target, .. }
        | Step::ComputeWithin { stage, target, .. }
        | Step::PackAt { stage, target, .. } => {
            *stage = f(*stage);
            *target = f(*target);
        }
    }
    step
}

/// Whether `e` calls exp, log, tanh or erf: too costly to compute again in every consumer.
fn transcendental(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |x| {
        found |= matches!(
            x,
            Expr::Unary(
                harl_te::UnaryOp::Exp
                    | harl_te::UnaryOp::Log
                    | harl_te::UnaryOp::Tanh
                    | harl_te::UnaryOp::Erf,
                _
            )
        )
    });
    found
}

/// Whether `e` divides or takes a square root outside its load indices (which are integer
/// arithmetic): a vector division costs an order of magnitude more than a multiply.
fn divides(e: &Expr) -> bool {
    match e {
        Expr::Binary(harl_te::BinaryOp::Div, ..) | Expr::Unary(harl_te::UnaryOp::Sqrt, _) => true,
        Expr::Const(..) | Expr::Axis(_) | Expr::Load(..) => false,
        Expr::Unary(_, a) | Expr::Cast(_, a) => divides(a),
        Expr::Binary(_, a, b) | Expr::Cmp(_, a, b) => divides(a) || divides(b),
        Expr::Select(c, a, b) => divides(c) || divides(a) || divides(b),
    }
}

/// Whether a stage reading stage `s` runs more iterations than `s` has elements: inlined
/// there, `s`'s body would be computed again for each.
fn broadcast_read(graph: &Graph, s: usize) -> bool {
    let size = graph.stages[s].size();
    graph.stages.iter().any(|c| {
        let iterations = c.size().saturating_mul(
            c.reduce
                .as_ref()
                .map_or(1, |r| r.extents.iter().product::<usize>()),
        );
        iterations > size && c.body.loads().contains(&TensorRef::Stage(s))
    })
}

/// How many loads of stage `s` the graph's stages make.
fn reads_of(graph: &Graph, s: usize) -> usize {
    let mut n = 0;
    for stage in &graph.stages {
        stage.body.visit(&mut |e| {
            n += usize::from(matches!(e, Expr::Load(TensorRef::Stage(p), _) if *p == s));
        });
    }
    n
}

/// Whether padding stage `p` is better read in place by its convolution (inlined: the taps
/// read the input with masked loads, `codegen::simd`) than made as a padded copy per plane:
/// on AVX-512 (mask registers), where the convolution is `p`'s one reader, reads it at unit
/// stride along its rows (a stride-2 depthwise convolution reads its padding in phases, at
/// unit stride), and its whole output plane is one accumulator block of one-vector rows.
/// There the copy cost more than the taps: a 7x7 depthwise convolution 23 -> 14 us, a
/// stride-2 one from 14x14 to 7x7 18.4 -> 13.3 (18.5 -> 13.7 in MobileNet-V2), while at 14x14
/// outputs and up the copy won (24 vs 30 us; AMD Zen 5, 1 thread, 2026-12-07). Read from
/// memory (`probe --cold`) the stride-2 one is 3x slower in place (84 against 27 us): its
/// input should come from the layer before, in cache.
fn padding_read_in_place(graph: &Graph, inlined: &[bool], p: usize, target: &CpuTarget) -> bool {
    let ps = &graph.stages[p];
    // AVX-512 is the one variant with 64-byte vectors.
    if target.vector_bytes < 64 || ps.reduce.is_some() || !has_select(&ps.body) {
        return false;
    }
    let Some(c) = (p + 1..graph.stages.len()).find(|&c| !inlined[c]) else {
        return false;
    };
    let cs = &graph.stages[c];
    let (ns, n_axes) = (cs.n_spatial(), cs.axis_extents().len());
    let Some(k) = crate::rows::padded_rows(graph, inlined, p, c) else {
        return false;
    };
    if reads_of(graph, p) != 1 || ns < k + 2 {
        return false;
    }
    let (height, width) = (cs.shape[ns - 2], cs.shape[ns - 1]);
    let lanes = vector_lanes(target, cs.dtype);
    let mut unit_stride = true;
    cs.body.visit(&mut |e| {
        if let Expr::Load(TensorRef::Stage(t), idx) = e {
            if *t == p {
                unit_stride &= idx.last().and_then(|l| l.stride(ns - 1, n_axes)) == Some(1);
            }
        }
    });
    unit_stride && width <= lanes && plane_rows(height, width, lanes) == height
}

pub(crate) fn has_select(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= matches!(x, Expr::Select(..)));
    found
}

/// Whether consumer `c` can run as an epilogue of `s`: elementwise, same shape, reads `s` only
/// at its own index (checked on the inlined body by lowering too), and nothing computed later.
fn fusable_epilogue(graph: &Graph, s: usize, c: usize, reads: &[usize], inlined: &[bool]) -> bool {
    let cs = &graph.stages[c];
    if cs.reduce.is_some() || cs.shape != graph.stages[s].shape || reads.iter().any(|&p| p > s) {
        return false;
    }
    // Inline producers between s and c would change the index at which s is read: only
    // accept the direct identity read through inlined stages of the same shape.
    let identity: Vec<Expr> = (0..cs.n_spatial()).map(Expr::Axis).collect();
    let mut ok = true;
    let mut stack = vec![c];
    while let Some(x) = stack.pop() {
        graph.stages[x].body.visit(&mut |e| {
            if let Expr::Load(TensorRef::Stage(p), idx) = e {
                if *p == s && *idx != identity {
                    ok = false;
                }
                if inlined[*p] {
                    if *idx != identity || graph.stages[*p].shape != cs.shape {
                        ok = false;
                    }
                    stack.push(*p);
                }
            }
        });
    }
    ok
}

/// The register/cache tiling of a reduction stage (the tuner seeds its search with it).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct TilePlan {
    /// The vectorised spatial axis (contiguous in memory).
    pub vec_axis: usize,
    /// The unrolled row axis of the register tile.
    pub row_axis: Option<usize>,
    /// [outer, mid, register] extents of the vector axis.
    pub vec: [usize; 3],
    /// [outer, mid, register] extents of the row axis.
    pub row: [usize; 3],
    /// [outer, inner] of the first reduce axis.
    pub red: [usize; 2],
    /// A second row axis of the register tile and its rows (`(axis, rows)`, rows dividing
    /// its extent), unrolled beside the row axis's: a convolution's tile of 2 x 2 pixels
    /// where no divisor of its 14-pixel row makes a good tile (`register_tile::choose_block`).
    /// The tuner keeps the default's.
    pub block: Option<(usize, usize)>,
}

impl TilePlan {
    /// Whether these tiles can replace `default` (stage `s`'s default tiles): the same axes,
    /// every axis's levels nonzero and multiplying to its extent.
    fn fits(&self, graph: &Graph, s: usize, default: &TilePlan) -> bool {
        let Some(stage) = graph.stages.get(s) else {
            return false;
        };
        let covers = |levels: &[usize], extent: usize| {
            levels
                .iter()
                .try_fold(1usize, |acc, &x| acc.checked_mul(x).filter(|_| x > 0))
                == Some(extent)
        };
        let red = stage.reduce.as_ref().and_then(|r| r.extents.first());
        self.vec_axis == default.vec_axis
            && self.row_axis == default.row_axis
            && self.block == default.block
            && stage
                .shape
                .get(self.vec_axis)
                .is_some_and(|&e| covers(&self.vec, e))
            && match self.row_axis {
                Some(a) => stage.shape.get(a).is_some_and(|&e| covers(&self.row, e)),
                None => self.row == [1, 1, 1],
            }
            && red.is_some_and(|&e| covers(&self.red, e))
    }
}

/// The default tiling of stage `s`, if it is a reduction the heuristic tiles.
pub fn plan_tiles(graph: &Graph, s: usize, target: &CpuTarget) -> Option<TilePlan> {
    let stage = &graph.stages[s];
    let ns = stage.n_spatial();
    let r = stage.reduce.as_ref()?;
    let vec_axis = ns.checked_sub(1)?;
    // Tile only when some operand is contiguous along the output's last axis.
    let mut contiguous = false;
    let mut vec_operand_axes = Vec::new();
    stage.body.visit(&mut |e| {
        if let Expr::Load(_, idx) = e {
            let uses_vec = idx.iter().any(|i| uses_axis(i, vec_axis));
            if idx.last().is_some_and(|l| uses_axis(l, vec_axis)) {
                contiguous = true;
            }
            if uses_vec {
                for i in idx {
                    for a in 0..ns {
                        if uses_axis(i, a) && !vec_operand_axes.contains(&a) {
                            vec_operand_axes.push(a);
                        }
                    }
                }
            }
        }
    });
    let ext = &stage.shape;
    if !contiguous || ext[vec_axis] < 4 {
        return None;
    }
    // Prefer a row axis the vector operand does not depend on: its vector is then reused.
    let row_axis = (0..ns)
        .filter(|&a| a != vec_axis && ext[a] > 1)
        .max_by_key(|&a| (!vec_operand_axes.contains(&a), ext[a]));
    let lanes = vector_lanes(target, stage.dtype);
    // Cache blocks: about 256 of the reduction, 128-256 of the vector axis, 48-96 rows.
    let kc = largest_divisor_at_most(r.extents[0], 256);
    let tile = row_axis.map(|a| {
        let problem = TileProblem {
            vec_extent: ext[vec_axis],
            row_extent: ext[a],
            reduction: r.extents[1..].iter().fold(kc, |n, &e| n.saturating_mul(e)),
            elem_bytes: elem_bytes(stage.dtype),
        };
        let tile = crate::register_tile::choose(&problem, target);
        // Without a window, a tile that needs more of the register file wins when the model
        // rates it strictly faster: a row of 784 pixels is one vector wide (no two-vector
        // width divides it), and 8 filters x 1 vector waits on its loads; 16 x 1 ran 4-25%
        // faster (ResNet-50's 1x1 convolutions at 28x28, AVX-512, 1 thread, `harl-bench
        // probe --against`, 2026-12-05). Ties keep `choose`'s tile (square GEMMs' 6 or 8 rows).
        if crate::layout::windowed(stage) {
            return tile;
        }
        let wide = crate::register_tile::choose_panel_tile(&problem, target);
        let speed = |t: crate::register_tile::RegisterTile| {
            crate::register_tile::throughput(&problem, target, t.rows, t.width)
        };
        if speed(wide) > speed(tile) + 1e-9 {
            wide
        } else {
            tile
        }
    });
    let nr = match tile {
        Some(t) => t.width,
        // A thin problem (one row: a GEMV, batch-1 decode) reuses nothing across rows, and
        // streams its matrix: the vector tile is as wide as the accumulator registers allow,
        // so each row of the matrix is read in long contiguous runs rather than one cache line
        // a row (0.3x onnxruntime on a 4096x4096 GEMV with the 2-vector tile).
        None => {
            let cap = target.acc_registers * lanes;
            (lanes..=cap)
                .rev()
                .find(|&d| ext[vec_axis].is_multiple_of(d) && d.is_multiple_of(lanes))
                .unwrap_or_else(|| largest_divisor_at_most(ext[vec_axis], cap))
        }
    };
    let mr = tile.map_or(1, |t| t.rows);
    let v_rest = ext[vec_axis] / nr;
    let v_mid = largest_divisor_at_most(v_rest, (256 / nr).max(1));
    let row = match row_axis {
        Some(a) => {
            let rest = ext[a] / mr;
            let mid = largest_divisor_at_most(rest, (96 / mr).max(1));
            [rest / mid, mid, mr]
        }
        None => [1, 1, 1],
    };
    Some(TilePlan {
        vec_axis,
        row_axis,
        vec: [v_rest / v_mid, v_mid, nr],
        row,
        red: [r.extents[0] / kc, kc],
        block: None,
    })
}

/// Tracks loop positions while steps are appended, mirroring lowering's rules.
struct Loops {
    stage: usize,
    /// (axis, level) of each loop; a fused loop keeps its first tag.
    tags: Vec<(usize, usize)>,
}

impl Loops {
    fn new(stage: usize, n_axes: usize) -> Self {
        Loops {
            stage,
            tags: (0..n_axes).map(|a| (a, 0)).collect(),
        }
    }
    fn pos(&self, tag: (usize, usize)) -> usize {
        self.tags.iter().position(|&t| t == tag).unwrap_or(0)
    }
    fn split(&mut self, steps: &mut Vec<Step>, axis: usize, factors: &[usize]) {
        let at = self.pos((axis, 0));
        steps.push(Step::Split {
            stage: self.stage,
            at,
            factors: factors.to_vec(),
        });
        let new: Vec<_> = (0..=factors.len()).map(|l| (axis, l)).collect();
        self.tags.splice(at..=at, new);
    }
    fn reorder(&mut self, steps: &mut Vec<Step>, order: &[(usize, usize)]) {
        let order: Vec<usize> = order.iter().map(|&t| self.pos(t)).collect();
        steps.push(Step::Reorder {
            stage: self.stage,
            order: order.clone(),
        });
        self.tags = order.iter().map(|&i| self.tags[i]).collect();
    }
    /// Fuses the first `n` loops into one.
    fn fuse_prefix(&mut self, steps: &mut Vec<Step>, n: usize) {
        for _ in 1..n {
            steps.push(Step::Fuse {
                stage: self.stage,
                at: 0,
            });
            self.tags.remove(1);
        }
    }
}

/// The shortest reduction block (steps) over which a tile runs its vector operand's panels
/// outside its rows ([`emit_tiled`]).
const PANEL_OUTSIDE_REDUCTION: usize = 256;

/// Streams a thin tile (no row axis: a GEMV, batch-1 decode) reads its weight in: its width cut
/// into this many panels, read side by side. One panel is one sequential stream through
/// memory, and one stream a core does not reach the memory bandwidth: a 4096x4096 GEMV ran at
/// 9.4-10.4 GFLOP/s with one 64-wide panel, 14.3-15.8 with four of 16 and 14.4 with eight of 8
/// (`harl-bench probe --against`, AVX2, 1 thread; numpy's BLAS 16.6 in the `models` sitting).
const THIN_STREAMS: usize = 4;

/// The streams of plan `p` ([`THIN_STREAMS`]): only for a thin tile, each stream at least a
/// vector of `lanes` wide; 1 otherwise.
fn thin_streams(p: &TilePlan, lanes: usize) -> usize {
    if p.row_axis.is_some() {
        return 1;
    }
    [THIN_STREAMS, 2]
        .into_iter()
        .find(|&n| p.vec[2].is_multiple_of(n * lanes))
        .unwrap_or(1)
}

/// Emits the tiling steps (the register width cut into `streams` unrolled panels, innermost
/// but for the vector); returns the loop position where an epilogue can attach.
fn emit_tiled(
    steps: &mut Vec<Step>,
    graph: &Graph,
    s: usize,
    p: &TilePlan,
    streams: usize,
) -> usize {
    let stage = &graph.stages[s];
    let ns = stage.n_spatial();
    let n_axes = stage.axis_extents().len();
    let mut loops = Loops::new(s, n_axes);
    // The vector axis's levels: outer, mid, [streams,] register.
    let vec_inner = if streams > 1 {
        loops.split(steps, p.vec_axis, &[p.vec[1], streams, p.vec[2] / streams]);
        3
    } else {
        loops.split(steps, p.vec_axis, &p.vec[1..]);
        2
    };
    if let Some(r) = p.row_axis {
        loops.split(steps, r, &p.row[1..]);
    }
    // The second row axis: its outer part among the outer blocks, its rows in the tile.
    let pixel_block = p
        .block
        .filter(|&(a, rows)| rows > 1 && a < ns && Some(a) != p.row_axis && a != p.vec_axis);
    if let Some((a, rows)) = pixel_block {
        loops.split(steps, a, &[rows]);
    }
    let split_red = p.red[0] > 1;
    if split_red {
        loops.split(steps, ns, &p.red[1..]);
    }
    // Outer blocks in axis order: for a convolution (`n, f, oh, ow`) the filter block stays
    // outside the rows, so its weights stay in cache while the rows stream past (about 1.3x
    // on a 56x56 conv2d against rows-outside-filters).
    let mut order: Vec<(usize, usize)> = (0..ns).map(|a| (a, 0)).collect();
    let outer = order.len();
    if split_red {
        order.push((ns, 0));
    }
    // Within a block, over a long reduction, the panels of the vector operand outside its
    // rows: a panel (the reduction block times the register width) stays in L1 while the
    // rows' broadcast values stream past, a quarter of the bytes of streaming the panels past
    // the rows (BERT's FFN layer and a ResNet-50 1x1 convolution over flattened pixels:
    // 1.05-1.10x, one core). Over a short one the panels are small and the rows outside keep
    // the output's write-back (and a residual's reads) walking along its rows instead of
    // down them (a 64-channel 1x1 convolution with a residual add: 0.96x in isolation and
    // 0.75x in ResNet-50 the other way; BERT's attention QK^T, 64 long: 0.97x).
    let red_block =
        p.red[1].saturating_mul(stage.axis_extents()[ns + 1..].iter().product::<usize>());
    let panels_outside = red_block >= PANEL_OUTSIDE_REDUCTION;
    if panels_outside {
        order.push((p.vec_axis, 1));
    }
    if let Some(r) = p.row_axis {
        order.push((r, 1));
    }
    if !panels_outside {
        order.push((p.vec_axis, 1));
    }
    order.push((ns, usize::from(split_red)));
    order.extend((ns + 1..n_axes).map(|a| (a, 0)));
    if let Some((a, _)) = pixel_block {
        order.push((a, 1));
    }
    if let Some(r) = p.row_axis {
        order.push((r, 2));
    }
    order.extend((2..=vec_inner).map(|l| (p.vec_axis, l)));
    loops.reorder(steps, &order);
    loops.fuse_prefix(steps, outer);
    // The accumulator block: everything inside the innermost of the two block loops.
    let block = match p.row_axis {
        Some(r) if panels_outside => (r, 1),
        _ => (p.vec_axis, 1),
    };
    steps.push(Step::CacheWrite {
        stage: s,
        at: loops.pos(block),
    });
    steps.push(Step::Parallel { stage: s, at: 0 });
    if let Some((a, _)) = pixel_block {
        steps.push(Step::Unroll {
            stage: s,
            at: loops.pos((a, 1)),
        });
    }
    if let Some(r) = p.row_axis {
        steps.push(Step::Unroll {
            stage: s,
            at: loops.pos((r, 2)),
        });
    }
    if streams > 1 {
        steps.push(Step::Unroll {
            stage: s,
            at: loops.pos((p.vec_axis, 2)),
        });
    }
    steps.push(Step::Vectorize {
        stage: s,
        at: loops.tags.len() - 1,
    });
    // Where the block holds whole reductions, an epilogue attaches at the block's own loop:
    // lowering then computes it in the write-back, from the registers (`loop_ir::Epilogue`).
    if split_red {
        0
    } else {
        loops.pos(block)
    }
}

/// Elementwise stages and reductions along a strided axis: vectorise the contiguous axis when it
/// is innermost, fuse the outer spatial loops and run them in parallel when there is enough work.
fn emit_simple(steps: &mut Vec<Step>, graph: &Graph, s: usize, target: &CpuTarget) {
    let stage = &graph.stages[s];
    let ns = stage.n_spatial();
    let mut loops = Loops::new(s, stage.axis_extents().len());
    let mut spatial_loops = ns;
    let lanes = vector_lanes(target, stage.dtype);
    let guarded = guarded_axes(stage);
    let free_prefix = guarded.iter().position(|&g| g).unwrap_or(ns);
    let mut vectorise =
        stage.reduce.is_none() && ns > 0 && stage.shape[ns - 1] >= 4 && !guarded[ns - 1];
    if vectorise {
        let last = stage.shape[ns - 1];
        match last_axis_vector(last, lanes) {
            Some(v) if v < last => {
                loops.split(steps, ns - 1, &[v]);
                spatial_loops += 1;
            }
            Some(_) => {}
            None => vectorise = false,
        }
    }
    let work = stage.size()
        * stage
            .reduce
            .as_ref()
            .map_or(1, |r| r.extents.iter().product());
    let outer = if vectorise {
        spatial_loops - 1
    } else {
        spatial_loops
    }
    .min(free_prefix);
    if outer >= 1 && work >= 1 << 15 {
        loops.fuse_prefix(steps, outer);
        steps.push(Step::Parallel { stage: s, at: 0 });
    }
    if vectorise && spatial_loops >= 1 {
        steps.push(Step::Vectorize {
            stage: s,
            at: loops.tags.len() - 1,
        });
    }
    if let Some(n_reduce) = contiguous_reduction(graph, s, lanes) {
        // One reduce loop over the contiguous run, vectorised into the accumulator (a
        // horizontal reduction per vector): a global average pool's 7x7 was two scalar loops
        // of 7 dependent multiply-adds.
        let first = loops.tags.len() - n_reduce;
        for _ in 1..n_reduce {
            steps.push(Step::Fuse {
                stage: s,
                at: first,
            });
        }
        if first >= 1 {
            steps.push(Step::CacheWrite {
                stage: s,
                at: first - 1,
            });
        }
        steps.push(Step::Vectorize {
            stage: s,
            at: first,
        });
    }
}

/// The number of reduce axes of stage `s` when they are one contiguous run of what it reads:
/// every load that uses them ends with exactly them, in order, over whole dimensions of
/// their extents (a global pool over an image's rows and columns), two or more of them, at
/// least a vector long together; none otherwise.
fn contiguous_reduction(graph: &Graph, s: usize, lanes: usize) -> Option<usize> {
    let stage = &graph.stages[s];
    let r = stage.reduce.as_ref()?;
    let (ns, nr) = (stage.n_spatial(), r.extents.len());
    if ns == 0 || nr < 2 || r.extents.iter().product::<usize>() < lanes || stage.dtype != DType::F32
    {
        return None;
    }
    let mut ok = true;
    let mut walked = false;
    stage.body.visit(&mut |e| {
        let Expr::Load(t, idx) = e else {
            return;
        };
        if !idx.iter().any(|i| (ns..ns + nr).any(|a| uses_axis(i, a))) {
            return;
        }
        walked = true;
        let shape = graph.shape(*t);
        let Some(lead) = idx.len().checked_sub(nr) else {
            ok = false;
            return;
        };
        ok &= idx[..lead]
            .iter()
            .all(|i| !(ns..ns + nr).any(|a| uses_axis(i, a)))
            && (0..nr)
                .all(|j| idx[lead + j] == Expr::Axis(ns + j) && shape[lead + j] == r.extents[j]);
    });
    (ok && walked).then_some(nr)
}

/// Which spatial axes of `stage` a select's condition tests (a padding stage's image axes).
/// Simple nests keep these as plain loops, neither fused into the parallel loop nor split for
/// the vector loop, so that loop partitioning ([`crate::partition`]) can give them an interior
/// without the select, where the copy vectorises by itself.
pub fn guarded_axes(stage: &harl_te::Stage) -> Vec<bool> {
    let mut guarded = vec![false; stage.n_spatial()];
    stage.body.visit(&mut |e| {
        if let Expr::Select(c, _, _) = e {
            for (a, g) in guarded.iter_mut().enumerate() {
                *g |= uses_axis(c, a);
            }
        }
    });
    guarded
}

pub(crate) fn uses_axis(e: &Expr, a: usize) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= *x == Expr::Axis(a));
    found
}

pub(crate) fn elem_bytes(d: harl_te::DType) -> usize {
    match d {
        harl_te::DType::F64 => 8,
        _ => 4,
    }
}

/// The lanes of one of `target`'s vectors of `dtype` elements (at least 1).
fn vector_lanes(target: &CpuTarget, dtype: DType) -> usize {
    (target.vector_bytes / elem_bytes(dtype)).max(1)
}

pub(crate) fn largest_divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n).max(1))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ops::workloads as w;

    /// A GEMV's weight is read in four panels side by side (four memory streams), the four
    /// unrolled inside the register tile; a GEMM's tile is not cut into streams.
    #[test]
    fn thin_tiles_read_their_weight_in_streams() {
        let avx2 = CpuTarget {
            vector_bytes: 32,
            acc_registers: 12,
            vector_registers: 16,
            threads: 1,
        };
        let plan_of = |m: usize| {
            let mut g = w::matmul(m, 256, 512).expect("matmul");
            g.inputs[1].constant = true;
            let steps = default_schedule(&g, &avx2).steps;
            let panel = steps.iter().find_map(|st| match st {
                Step::CacheRead { panel, .. } => *panel,
                _ => None,
            });
            let streams = steps
                .iter()
                .any(|st| matches!(st, Step::Split { factors, .. } if factors.ends_with(&[4, 16])));
            let lowers = crate::lower::lower(&g, &Schedule { steps }).is_ok();
            (panel, streams, lowers)
        };
        // 64 wide (8 vectors), in four panels of 16.
        assert_eq!(plan_of(1), (Some(16), true, true));
        assert!(matches!(plan_of(64), (_, false, true)));
    }

    #[test]
    fn plane_reductions_accumulate_enough_rows_to_fill_the_pipes() {
        // 7x7 outputs, one vector a row: all 7 rows; rows of 14 (two vectors): 2 of 14
        // rows; rows of 56 (seven vectors) and a prime row count past the cap: one row.
        assert_eq!(plane_rows(7, 7, 8), 7);
        assert_eq!(plane_rows(14, 14, 8), 2);
        assert_eq!(plane_rows(56, 56, 8), 1);
        assert_eq!(plane_rows(13, 5, 8), 1);
        assert_eq!(plane_rows(28, 28, 16), 4);
        // In the schedule: a depthwise convolution with a 7x7 output unrolls its 7 rows
        // inside the taps, one accumulator block of 7 padded rows.
        let g = w::depthwise_conv2d(1, 16, 14, 14, 3, 3, 2, 1, 1).expect("depthwise");
        let avx2 = CpuTarget {
            vector_bytes: 32,
            acc_registers: 12,
            vector_registers: 16,
            threads: 1,
        };
        let steps = default_schedule(&g, &avx2).steps;
        assert!(
            steps
                .iter()
                .any(|st| matches!(st, Step::Split { factors, .. } if factors == &[7]))
                && steps.iter().any(|st| matches!(st, Step::Unroll { .. })),
            "{steps:?}"
        );
        let program = crate::lower::lower(&g, &Schedule { steps }).expect("lowers");
        let src = format!("{:?}", program.nests);
        assert!(src.contains("AccDecl { size: 56"), "{src}");
    }

    /// The extents of the loops on the way down to the first innermost statement of the
    /// last nest.
    fn first_path(graph: &Graph, target: &CpuTarget) -> Vec<usize> {
        let program = crate::lower::lower(graph, &default_schedule(graph, target)).expect("lowers");
        let mut out = Vec::new();
        let mut body = &program.nests.last().expect("a nest").body;
        while let Some(crate::loop_ir::Stmt::For {
            extent, body: b, ..
        }) = body
            .iter()
            .find(|s| matches!(s, crate::loop_ir::Stmt::For { .. }))
        {
            out.push(*extent);
            body = b;
        }
        out
    }

    /// Over a long reduction the vector operand's panels loop outside the rows (the panel
    /// stays in L1); over a short one the rows loop outside.
    #[test]
    fn block_loops_put_panels_outside_rows_over_long_reductions() {
        let target = CpuTarget {
            vector_bytes: 64,
            acc_registers: 16,
            vector_registers: 32,
            threads: 1,
        };
        for (k, panels_first) in [(1024, true), (64, false)] {
            let mut g = w::matmul(48, k, 96).expect("matmul");
            g.inputs[1].constant = true;
            let tiles = default_tiles(&g, &target);
            let (_, p) = tiles.last().expect("a tiled stage");
            let (vec_mid, row_mid) = (p.vec[1], p.row[1]);
            assert_ne!(vec_mid, row_mid, "{p:?}: the test needs them apart");
            let path = first_path(&g, &target);
            let at = |e: usize| path.iter().position(|&x| x == e).expect("the loop");
            assert_eq!(
                at(vec_mid) < at(row_mid),
                panels_first,
                "k = {k}: {path:?} {p:?}"
            );
        }
    }
}
