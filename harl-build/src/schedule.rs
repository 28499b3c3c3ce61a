//! Schedules as data: a list of transform steps replayed on a lowered te graph.
//!
//! A schedule never holds code. Each step names a stage by index and a loop by its position in
//! that stage's current loop list (the list changes as steps apply, as in TVM's transform steps).
//! [`crate::lower`] replays the steps and validates each one; a bad step is an error, never a
//! wrong kernel.

use serde::{Deserialize, Serialize};

/// One transform step.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "step", rename_all = "snake_case")]
pub enum Step {
    /// Splits loop `at` into `factors.len() + 1` loops: an outer loop of extent
    /// `ceil(extent / prod(factors))` followed by loops of the given extents (outer to inner).
    /// A remainder is guarded.
    Split {
        /// Stage index.
        stage: usize,
        /// Loop position.
        at: usize,
        /// Inner extents, outer to inner.
        factors: Vec<usize>,
    },
    /// Permutes the loops: new loop `i` is old loop `order[i]`.
    Reorder {
        /// Stage index.
        stage: usize,
        /// A permutation of the loop positions.
        order: Vec<usize>,
    },
    /// Fuses loops `at` and `at + 1` into one.
    Fuse {
        /// Stage index.
        stage: usize,
        /// Position of the outer of the two loops.
        at: usize,
    },
    /// Computes an elementwise consumer `stage` inside loop `at` of its producer `target`, over
    /// the tile the producer has just finished there (epilogue fusion).
    ComputeAt {
        /// The consumer stage.
        stage: usize,
        /// The producer it attaches to.
        target: usize,
        /// Loop position in the producer; every reduce loop of the producer must be inside it.
        at: usize,
    },
    /// Computes `stage` inside loop `at` of `target`, one slice of its leading axes at a time
    /// (row fusion: softmax's or layer norm's stages all inside one loop over the rows, each
    /// row's intermediates still in cache when the next stage reads them).
    ///
    /// Loops `0..=at` of `target` must be whole leading spatial axes `0..k` of it (unsplit;
    /// fused is fine). `stage`'s first `k` axes have the same extents and are its loops
    /// `0..k`, unsplit and plain; they take the target's values, and its remaining loops (its
    /// own, as its own steps left them) run in full inside, after the target's loops there.
    /// Every read of `target` or of a stage computed within the same loop is at those axes'
    /// own index, and a reduction accumulates in a block (`cache_write`) at loop `k - 1` or
    /// inside all of its reduce loops, so it needs no pre-filled buffer.
    ComputeWithin {
        /// The stage computed within.
        stage: usize,
        /// The root stage whose loop it runs in.
        target: usize,
        /// Loop position in the target: the last of its leading-axis loops.
        at: usize,
    },
    /// Computes the panel copy `stage` (a [`Step::CacheRead`] with panels, of an input the
    /// kernel gets on every call) one panel at a time inside loop `at` of its reader `target`,
    /// into a buffer of one panel per thread: the copy is read from L1 right after it is made,
    /// where a copy of the whole input before the reader's nest went through memory and back
    /// (a 3.2 MB activation for a 1x1 convolution at 56x56).
    ///
    /// The reader must read the copy only at its own axis `a` (`[a / panel, .., a % panel]`,
    /// as `cache_read` writes it); loops `0..=at` of `target` must fix the panel, that is, the
    /// parts of axis `a` bound there step in whole panels and the parts inside `at` span less
    /// than one, with no remainder guard on `a`; `at` is at or outside the target's
    /// accumulator block. The copy's loop 0 is its panel axis, unsplit and serial, and none
    /// of its loops is parallel.
    PackAt {
        /// The panel copy.
        stage: usize,
        /// Its reader, a root stage.
        target: usize,
        /// Loop position in the reader.
        at: usize,
    },
    /// Slides the rows of the stage that `stage` is computed within ([`Step::ComputeWithin`]):
    /// instead of its whole slice before `stage` runs, each iteration of `stage`'s first own
    /// loop computes just the producer's rows (its next axis) that this iteration reads for the
    /// first time, as Halide's sliding window does. A stride-2 depthwise convolution at 112x112
    /// then reads each padded row from L1 right after making it, where the whole 52 KB padded
    /// plane went out to L2 first (1.17x, a hand edit of the generated kernel on Zen 3).
    ///
    /// `stage` must be the first stage computed within the producer's loop; the producer is
    /// no reduction, and its loop right inside that one is its next axis, unsplit and serial,
    /// with nothing attached inside. Every read of the producer in `stage`'s first own loop
    /// (a serial spatial loop, `v`) is at row `a*v + e`, the same `a >= 1` for every read, and
    /// `e` ranges over loops inside it; rows before the first iteration's are made ahead of
    /// the loop, rows past the last iteration's after it.
    Slide {
        /// The stage computed within its producer's loop.
        stage: usize,
    },
    /// Inlines an elementwise stage into its consumers (it gets no buffer or loop of its own).
    ComputeInline {
        /// Stage index.
        stage: usize,
    },
    /// Accumulates the tile of the spatial loops inside loop `at` in a local block (registers),
    /// written back once the loops inside `at` finish.
    CacheWrite {
        /// Stage index.
        stage: usize,
        /// Loop position whose body holds the accumulator.
        at: usize,
    },
    /// Factors the first reduce axis of a reduction: a new stage, inserted before `stage`,
    /// computes `factor` partial results along a new innermost spatial axis (so they can be
    /// vectorised or parallelised), and `stage` then reduces those partials. Stages from `stage`
    /// on move up one index for the steps that follow. Must come before any other step on
    /// `stage` or a later stage.
    Rfactor {
        /// The reduction stage.
        stage: usize,
        /// Number of partial results; must divide the first reduce extent.
        factor: usize,
    },
    /// Copies graph input `input`, as `stage` reads it, into a new root stage inserted before
    /// `stage`, with its axes permuted: the copy's axis `i` is the input's axis `order[i]`. Then
    /// `stage` reads the copy, so a layout that makes the stage's vector loop walk contiguous
    /// memory costs one pass over the (small) input. Along an axis where every read's index is
    /// a multiple of some `f` (a 1x1 convolution of stride 2), the copy holds only every
    /// `f`-th element (`layout::sample_factors`, derived from the graph, never from the step).
    /// Stages from `stage` on move up one index
    /// for the steps that follow; like [`Step::Rfactor`], it must come before any other step on
    /// `stage` or a later stage.
    CacheRead {
        /// The stage whose reads are redirected.
        stage: usize,
        /// Index of the graph input it reads.
        input: usize,
        /// A permutation of the input's axes.
        order: Vec<usize>,
        /// Panels: the copy's last axis (input axis `order[last]`, of extent `n`) is cut into
        /// `n / panel` panels of `panel` elements, and the panel index becomes the copy's first
        /// axis, so the copy is `[n / panel, order[0].., panel]` and one panel (a register
        /// tile's columns, say) lies contiguous for the whole reduction. Must divide `n`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        panel: Option<usize>,
    },
    /// Runs loop `at` on the thread pool; it must be the outermost loop of a root stage.
    Parallel {
        /// Stage index.
        stage: usize,
        /// Loop position.
        at: usize,
    },
    /// Marks loop `at` as the vector loop: innermost, constant extent, no remainder guard.
    Vectorize {
        /// Stage index.
        stage: usize,
        /// Loop position.
        at: usize,
    },
    /// Emits loop `at` with a constant trip count and asks for full unrolling.
    Unroll {
        /// Stage index.
        stage: usize,
        /// Loop position.
        at: usize,
    },
    /// GPU: stages what the block reads of graph input `input` (as `stage` reads it, after
    /// inlining) in shared memory at the top of every iteration of loop `at`, a loop inside the
    /// thread loop: the threads copy the box the block's loops inside `at` touch, cooperatively
    /// and coalesced, then read it from shared memory (Ansor's cache read for GPUs). The box is
    /// inferred from the (affine) indices and checked against the shared memory of a block.
    SharedRead {
        /// Stage index.
        stage: usize,
        /// Index of the graph input staged.
        input: usize,
        /// Loop position (2 or more, inside the thread loop).
        at: usize,
    },
    /// GPU: binds loop `at` (the outermost of a root stage, spatial) to the thread blocks.
    BindBlock {
        /// Stage index.
        stage: usize,
        /// Loop position (0).
        at: usize,
    },
    /// GPU: binds loop `at` (the second, spatial, inside a block-bound loop, at most
    /// [`crate::lower::MAX_GPU_THREADS`] iterations) to the threads of a block.
    BindThread {
        /// Stage index.
        stage: usize,
        /// Loop position (1).
        at: usize,
    },
}

/// A complete schedule: the steps, in order.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Schedule {
    /// The steps, applied in order.
    pub steps: Vec<Step>,
}

impl Schedule {
    /// The empty schedule: every stage a plain loop nest at the root.
    pub fn naive() -> Self {
        Schedule::default()
    }
}
