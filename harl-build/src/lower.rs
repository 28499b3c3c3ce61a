//! Lowering: a te graph plus a schedule becomes a loop program ([`crate::loop_ir`]).
//!
//! Every stage starts as one loop per axis (spatial, then reduce) at the root. The schedule's steps
//! are replayed in order on that state, each one validated; then the state is emitted as loop
//! nests. Splits keep a tree of the parts of each axis so that a split whose factors do not
//! divide the extent gets a guard on exactly the part it overran.

use crate::limits::{
    MAX_ADDED_STAGES, MAX_BODY_DEPTH, MAX_BODY_NODES, MAX_LOOPS_PER_STAGE, MAX_NEST_ITERATIONS,
    MAX_SCRATCH_FACTOR, MAX_SPLIT_FACTORS, MAX_STEPS, MIN_SCRATCH_ELEMS,
};
use crate::loop_ir::{LoopKind, Nest, Program, SharedBox, Stmt};
use crate::schedule::{Schedule, Step};
use crate::shared_read::{bound_vars, footprint, MAX_SHARED_BYTES};
use harl_te::{BinaryOp, CmpOp, Expr, Graph, ReduceOp, TensorRef};
use std::collections::{HashMap, HashSet};

/// Largest accumulator block (elements) a cache-write step may ask for; keeps it on the stack.
pub const MAX_ACC_ELEMS: usize = 4096;
/// Largest loop a step may mark unrolled or vectorised.
pub const MAX_UNROLL: usize = 512;
/// Most threads a GPU block may have (every CUDA device since compute capability 2.0).
pub const MAX_GPU_THREADS: usize = 1024;

/// Why a schedule cannot be applied to a graph.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ScheduleError {
    /// The graph itself is invalid.
    #[error("invalid graph: {0}")]
    Graph(#[from] harl_te::GraphError),
    /// The schedule's intermediate buffers exceed [`MAX_SCRATCH_FACTOR`] times the kernel's
    /// largest tensor.
    #[error("the schedule allocates {scratch} elements of intermediate buffers per call, over the limit of {allowed} for this kernel")]
    Scratch {
        /// Elements the schedule's intermediate buffers hold.
        scratch: usize,
        /// The limit for this kernel.
        allowed: usize,
    },
    /// The schedule has more steps than [`MAX_STEPS`].
    #[error("schedule of {0} steps exceeds the limit of {MAX_STEPS}")]
    TooManySteps(usize),
    /// A step is invalid at the point it is applied.
    #[error("step {index} ({step:?}) is invalid: {why}")]
    Step {
        /// Position of the step in the schedule.
        index: usize,
        /// The step.
        step: Step,
        /// What is wrong.
        why: String,
    },
}

type NodeId = usize;

/// Builds the innermost statement of tile loops from the bound variables and the tile's
/// (variable, extent) pairs.
type TileLeaf<'a> = dyn FnMut(&Lowering, &HashMap<NodeId, usize>, &[(usize, usize)]) -> Stmt + 'a;

/// One part of an axis in the split tree: it contributes `var * stride` to the axis value.
#[derive(Clone, Debug)]
struct Node {
    axis: usize,
    extent: usize,
    stride: usize,
    children: Vec<NodeId>,
    /// Its children cover more than `extent`: iterations past it are skipped by a guard.
    overrun: bool,
}

#[derive(Clone, Debug)]
struct LoopState {
    /// Leaf nodes, outer to inner (several after a fuse).
    parts: Vec<NodeId>,
    kind: LoopKind,
    reduce: bool,
}

#[derive(Clone, Debug, PartialEq)]
enum Attach {
    Root,
    Inline,
    At {
        target: usize,
        at: usize,
        step: usize,
    },
    /// Computed slice by slice of its leading axes inside loop `at` of `target`
    /// ([`Step::ComputeWithin`]); it keeps its own loops past those axes.
    Within {
        target: usize,
        at: usize,
        step: usize,
    },
    /// A panel copy computed one panel at a time at the top of loop `at` of its reader
    /// `target` ([`Step::PackAt`]); it keeps its own loops past its panel axis.
    Packed {
        target: usize,
        at: usize,
        step: usize,
    },
}

#[derive(Clone, Debug)]
struct StageState {
    nodes: Vec<Node>,
    loops: Vec<LoopState>,
    cache_write: Option<usize>,
    attach: Attach,
    /// Inputs staged in shared memory: (input, loop position, step index).
    shared: Vec<(usize, usize, usize)>,
    /// The step that slides its producer's rows into its first own loop ([`Step::Slide`]).
    slide: Option<usize>,
}

impl StageState {
    fn new(extents: &[usize], n_spatial: usize) -> Self {
        let nodes = extents
            .iter()
            .enumerate()
            .map(|(axis, &extent)| Node {
                axis,
                extent,
                stride: 1,
                children: vec![],
                overrun: false,
            })
            .collect();
        let loops = (0..extents.len())
            .map(|a| LoopState {
                parts: vec![a],
                kind: LoopKind::Serial,
                reduce: a >= n_spatial,
            })
            .collect();
        StageState {
            nodes,
            loops,
            cache_write: None,
            attach: Attach::Root,
            shared: Vec::new(),
            slide: None,
        }
    }

    /// Whether a reduce loop encloses the accumulator at `pos`: then the write-back of each
    /// block combines with the partial sums stored by the earlier ones (the first block
    /// stores, `Lowering::first_store`; else the output is pre-filled with the
    /// reduction's identity).
    fn reduces_outside(&self, pos: usize) -> bool {
        self.loops[..=pos].iter().any(|l| l.reduce)
    }

    /// Never overflows: [`Lowering::check_nest`] bounds the product of all leaf extents.
    fn loop_extent(&self, l: &LoopState) -> usize {
        l.parts
            .iter()
            .map(|&p| self.nodes[p].extent)
            .fold(1usize, usize::saturating_mul)
    }

    /// Iterations of the whole nest, or `None` past `usize`.
    fn nest_iterations(&self) -> Option<usize> {
        self.loops
            .iter()
            .flat_map(|l| &l.parts)
            .try_fold(1usize, |acc, &p| acc.checked_mul(self.nodes[p].extent))
    }

    fn leaves(&self, n: NodeId, out: &mut Vec<NodeId>) {
        if self.nodes[n].children.is_empty() {
            out.push(n);
        } else {
            for &c in &self.nodes[n].children {
                self.leaves(c, out);
            }
        }
    }
}

/// The smallest slice a row chain's stage is folded to: each slice taken per thread costs a
/// few tens of nanoseconds, more than a short row saves (BERT's softmax, rows of 128: 8.7 ->
/// 6.0 GFLOP/s folded; a depthwise convolution's padded planes of 12-52 KB gain 28-38%).
pub(crate) const MIN_FOLD_BYTES: usize = 4096;

/// The schedule replayed on a graph: per-stage loop structure, ready to emit.
struct Lowering {
    graph: Graph,
    stages: Vec<StageState>,
    /// Consumers attached at (target, loop position).
    attached: HashMap<(usize, usize), Vec<usize>>,
    var_extents: Vec<usize>,
    /// While emitting a nest: the thread loop's variable and its parts (they vary across the
    /// threads of a block, which shared staging must know).
    thread_vars: Vec<usize>,
    /// While emitting a nest: the bytes of its shared boxes so far.
    shared_bytes: usize,
    /// Stages the schedule has added so far (rfactor, cache_read).
    added: usize,
    /// Per stage: the epilogue computed in its write-back, straight from its accumulator
    /// ([`Lowering::forwarded_epilogue`]); the stage then has no buffer, unless its
    /// reduction is split around the accumulator block (`Forward::partials`).
    forward: Vec<Option<Forward>>,
    /// Per stage: whether a write-back of its split reduction stores the first block's sums
    /// instead of adding them to a pre-filled buffer ([`Lowering::first_stores`]).
    first_store: Vec<bool>,
    /// While emitting a nest: the reduce loops entered so far, as (stage, variable, extent).
    reduce_loops: Vec<(usize, usize, usize)>,
}

/// A consumer computed in a stage's write-back ([`Lowering::forwarded_epilogue`]).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Forward {
    /// The consumer stage.
    consumer: usize,
    /// The reduction has loops outside the accumulator block: the stage keeps a buffer of
    /// partial sums, and the consumer is computed in the last reduction block's write-back.
    partials: bool,
}

/// The indices at which `body` reads stage `s`.
fn stage_reads(body: &Expr, s: usize) -> Vec<Vec<Expr>> {
    let mut out = Vec::new();
    body.visit(&mut |e| {
        if let Expr::Load(TensorRef::Stage(t), idx) = e {
            if *t == s {
                out.push(idx.clone());
            }
        }
    });
    out
}

/// Nodes of an expression tree.
fn node_count(e: &Expr) -> usize {
    let mut n = 0usize;
    e.visit(&mut |_| n += 1);
    n
}

/// Nesting depth of an expression (a leaf is 1). Recursive: bodies are at most
/// [`MAX_BODY_DEPTH`] deep, which graph validation and [`Lowering::inline`] ensure.
fn depth(e: &Expr) -> usize {
    1 + match e {
        Expr::Const(..) | Expr::Axis(_) => 0,
        Expr::Load(_, idx) => idx.iter().map(depth).max().unwrap_or(0),
        Expr::Unary(_, a) | Expr::Cast(_, a) => depth(a),
        Expr::Binary(_, a, b) | Expr::Cmp(_, a, b) => depth(a).max(depth(b)),
        Expr::Select(c, a, b) => depth(c).max(depth(a)).max(depth(b)),
    }
}

/// Whether `order` lists each of `0..n` exactly once.
fn is_permutation(order: &[usize], n: usize) -> bool {
    let mut seen = vec![false; n];
    order.len() == n
        && order
            .iter()
            .all(|&o| o < n && !std::mem::replace(&mut seen[o], true))
}

/// Applies `schedule` to `graph` and emits the loop program, validating every step.
pub fn lower(graph: &Graph, schedule: &Schedule) -> Result<Program, ScheduleError> {
    if schedule.steps.len() > MAX_STEPS {
        return Err(ScheduleError::TooManySteps(schedule.steps.len()));
    }
    graph.validate()?;
    let stages = graph
        .stages
        .iter()
        .map(|s| StageState::new(&s.axis_extents(), s.n_spatial()))
        .collect();
    let mut lw = Lowering {
        graph: graph.clone(),
        stages,
        attached: HashMap::new(),
        var_extents: vec![],
        thread_vars: vec![],
        shared_bytes: 0,
        added: 0,
        forward: vec![],
        first_store: vec![],
        reduce_loops: vec![],
    };
    for (index, step) in schedule.steps.iter().enumerate() {
        lw.apply(index, step).map_err(|why| ScheduleError::Step {
            index,
            step: step.clone(),
            why,
        })?;
    }
    lw.check_attachments()
        .map_err(|(index, why)| ScheduleError::Step {
            index,
            step: schedule.steps[index].clone(),
            why,
        })?;
    let mut program = lw.emit().map_err(|(index, why)| ScheduleError::Step {
        index,
        step: schedule.steps[index].clone(),
        why,
    })?;
    check_scratch(graph, &program)?;
    crate::partition::partition_program(&mut program);
    program.workload_key = graph.workload_key();
    Ok(program)
}

/// Bounds the intermediate buffers a schedule makes the kernel allocate per call (see
/// [`MAX_SCRATCH_FACTOR`]).
fn check_scratch(graph: &Graph, program: &Program) -> Result<(), ScheduleError> {
    let largest = graph
        .inputs
        .iter()
        .map(|t| harl_te::limits::checked_product(&t.shape))
        .chain(
            graph
                .stages
                .iter()
                .map(|s| harl_te::limits::checked_product(&s.shape)),
        )
        .try_fold(0usize, |m, n| n.map(|n| m.max(n)))
        .unwrap_or(usize::MAX);
    let allowed = largest
        .saturating_mul(MAX_SCRATCH_FACTOR)
        .max(MIN_SCRATCH_ELEMS);
    let stages = &program.graph.stages;
    let last = stages.len().saturating_sub(1);
    let scratch = stages
        .iter()
        .enumerate()
        .filter(|&(s, _)| s != last && program.has_buffer.get(s) == Some(&true))
        .map(|(_, st)| harl_te::limits::checked_product(&st.shape).unwrap_or(usize::MAX))
        .fold(0usize, usize::saturating_add);
    if scratch > allowed {
        return Err(ScheduleError::Scratch { scratch, allowed });
    }
    Ok(())
}

impl Lowering {
    fn stage_mut(&mut self, s: usize) -> Result<&mut StageState, String> {
        self.stages
            .get_mut(s)
            .ok_or_else(|| format!("stage {s} does not exist"))
    }

    fn check_loop(&self, s: usize, at: usize) -> Result<(), String> {
        let st = self
            .stages
            .get(s)
            .ok_or_else(|| format!("stage {s} does not exist"))?;
        match st.attach {
            Attach::Root | Attach::Within { .. } | Attach::Packed { .. } => {}
            Attach::Inline => return Err(format!("stage {s} is inlined and has no loops")),
            Attach::At { .. } => {
                return Err(format!(
                    "stage {s} runs inside its target's loops and has none of its own"
                ))
            }
        }
        if at >= st.loops.len() {
            return Err(format!(
                "stage {s} has {} loops; there is no loop {at}",
                st.loops.len()
            ));
        }
        Ok(())
    }

    fn apply(&mut self, index: usize, step: &Step) -> Result<(), String> {
        match step {
            Step::Split { stage, at, factors } => {
                self.check_loop(*stage, *at)?;
                self.split(*stage, *at, factors)
            }
            Step::Reorder { stage, order } => {
                self.check_loop(*stage, 0)?;
                let st = self.stage_mut(*stage)?;
                let n = st.loops.len();
                if !is_permutation(order, n) {
                    return Err(format!("{order:?} is not a permutation of {n} loops"));
                }
                if st.cache_write.is_some() || !st.shared.is_empty() {
                    return Err("reorder after cache_write or shared_read".into());
                }
                st.loops = order.iter().map(|&o| st.loops[o].clone()).collect();
                Ok(())
            }
            Step::Fuse { stage, at } => {
                let inner = at.checked_add(1).ok_or("no loop after the last one")?;
                self.check_loop(*stage, inner)?;
                if self.stages[*stage].loops[*at].kind != LoopKind::Serial
                    || self.stages[*stage].loops[*at + 1].kind != LoopKind::Serial
                {
                    return Err("cannot fuse an annotated loop".into());
                }
                let st = self.stage_mut(*stage)?;
                if st.loops[*at].reduce != st.loops[*at + 1].reduce {
                    return Err("cannot fuse a spatial loop with a reduce loop".into());
                }
                if st.cache_write.is_some() || !st.shared.is_empty() {
                    return Err("fuse after cache_write or shared_read".into());
                }
                let inner = st.loops.remove(*at + 1);
                st.loops[*at].parts.extend(inner.parts);
                Ok(())
            }
            Step::ComputeInline { stage } => self.inline(*stage),
            Step::Rfactor { stage, factor } => self.rfactor(*stage, *factor),
            Step::CacheRead {
                stage,
                input,
                order,
                panel,
            } => self.cache_read(*stage, *input, order, *panel),
            Step::ComputeAt { stage, target, at } => {
                self.check_loop(*target, *at)?;
                let c = *stage;
                if c >= self.graph.stages.len() || c <= *target {
                    return Err(format!("stage {c} cannot attach to stage {target}"));
                }
                if self.stages[c].attach != Attach::Root {
                    return Err(format!("stage {c} is already attached or inlined"));
                }
                if self.stages[c].loops.len() != self.graph.stages[c].n_spatial()
                    || self.stages[c]
                        .loops
                        .iter()
                        .any(|l| l.parts.len() != 1 || l.kind != LoopKind::Serial)
                {
                    return Err(format!("attach stage {c} before scheduling its own loops"));
                }
                if self.stages[*target].attach != Attach::Root {
                    return Err(format!("target stage {target} is not at the root"));
                }
                self.stages[c].attach = Attach::At {
                    target: *target,
                    at: *at,
                    step: index,
                };
                self.attached.entry((*target, *at)).or_default().push(c);
                Ok(())
            }
            Step::ComputeWithin { stage, target, at } => {
                let c = *stage;
                if c >= self.graph.stages.len() || c <= *target {
                    return Err(format!(
                        "stage {c} cannot be computed within stage {target}"
                    ));
                }
                // The rest is checked once every step has applied (`check_within`): later
                // steps may still change either stage's loops.
                let within = Attach::Within {
                    target: *target,
                    at: *at,
                    step: index,
                };
                self.attach_in_loop(c, *target, *at, within)
            }
            Step::Slide { stage } => {
                let st = self.stage_mut(*stage)?;
                if st.slide.replace(index).is_some() {
                    return Err(format!("stage {stage} slides twice"));
                }
                // The rest is checked once every step has applied (`check_slide`).
                Ok(())
            }
            Step::PackAt { stage, target, at } => {
                let c = *stage;
                if c >= *target {
                    return Err(format!("stage {c} is not a copy that stage {target} reads"));
                }
                // The rest is checked once every step has applied (`check_packed`).
                let packed = Attach::Packed {
                    target: *target,
                    at: *at,
                    step: index,
                };
                self.attach_in_loop(c, *target, *at, packed)
            }
            Step::CacheWrite { stage, at } => {
                self.check_loop(*stage, *at)?;
                let st = &self.stages[*stage];
                if st.cache_write.is_some() {
                    return Err("cache_write twice".into());
                }
                if self.graph.stages[*stage].reduce.is_none() {
                    return Err("cache_write needs a reduction stage".into());
                }
                let tile: usize = st.loops[at + 1..]
                    .iter()
                    .filter(|l| !l.reduce)
                    .map(|l| st.loop_extent(l))
                    .product();
                if tile > MAX_ACC_ELEMS {
                    return Err(format!(
                        "accumulator of {tile} elements exceeds {MAX_ACC_ELEMS}"
                    ));
                }
                self.stages[*stage].cache_write = Some(*at);
                Ok(())
            }
            Step::Parallel { stage, at } => {
                self.check_loop(*stage, *at)?;
                let st = &self.stages[*stage];
                if *at != 0 || st.attach != Attach::Root {
                    return Err("only the outermost loop of a root stage can be parallel".into());
                }
                if st.loops[0].reduce {
                    return Err("a reduce loop cannot be parallel".into());
                }
                self.stages[*stage].loops[0].kind = LoopKind::Parallel;
                Ok(())
            }
            Step::SharedRead { stage, input, at } => {
                self.check_loop(*stage, *at)?;
                let st = &self.stages[*stage];
                if *at < 2 || st.loops[1].kind != LoopKind::GpuThread {
                    return Err(
                        "shared_read stages at a loop inside a bound (spatial) thread loop".into(),
                    );
                }
                if *input >= self.graph.inputs.len() {
                    return Err(format!("input {input} does not exist"));
                }
                if st.shared.iter().any(|&(i, _, _)| i == *input) {
                    return Err(format!("input {input} is staged twice"));
                }
                if st.nodes.iter().any(|n| n.overrun) {
                    // A remainder guard could keep some threads from the block's barriers.
                    return Err("shared_read needs splits that divide their extents".into());
                }
                self.stages[*stage].shared.push((*input, *at, index));
                Ok(())
            }
            Step::BindBlock { stage, at } => {
                self.check_loop(*stage, *at)?;
                let st = &self.stages[*stage];
                if *at != 0 || st.attach != Attach::Root {
                    return Err("only the outermost loop of a root stage binds to blocks".into());
                }
                if st.loops[0].reduce || st.loops[0].kind != LoopKind::Serial {
                    return Err("a block loop must be a plain spatial loop".into());
                }
                self.stages[*stage].loops[0].kind = LoopKind::GpuBlock;
                Ok(())
            }
            Step::BindThread { stage, at } => {
                self.check_loop(*stage, *at)?;
                let st = &self.stages[*stage];
                if *at != 1 || st.loops[0].kind != LoopKind::GpuBlock {
                    return Err("threads bind to the loop right inside the block loop".into());
                }
                if st.loops[1].kind != LoopKind::Serial {
                    return Err("a thread loop must be a plain loop".into());
                }
                if st.loops[1].reduce && st.cache_write != Some(1) {
                    // Without a per-thread accumulator, threads would race on the output.
                    return Err("threads bind to a reduce loop only after cache_write at it".into());
                }
                let ext = st.loop_extent(&st.loops[1]);
                if ext > MAX_GPU_THREADS {
                    return Err(format!("{ext} threads per block exceed {MAX_GPU_THREADS}"));
                }
                self.stages[*stage].loops[1].kind = if st.loops[1].reduce {
                    LoopKind::GpuThreadReduce
                } else {
                    LoopKind::GpuThread
                };
                Ok(())
            }
            Step::Vectorize { stage, at } | Step::Unroll { stage, at } => {
                self.check_loop(*stage, *at)?;
                let st = &self.stages[*stage];
                let ext = st.loop_extent(&st.loops[*at]);
                if ext > MAX_UNROLL {
                    return Err(format!("loop of {ext} iterations is too long to unroll"));
                }
                if matches!(
                    st.loops[*at].kind,
                    LoopKind::Parallel
                        | LoopKind::GpuBlock
                        | LoopKind::GpuThread
                        | LoopKind::GpuThreadReduce
                ) {
                    return Err("loop is already parallel or bound".into());
                }
                let vector = matches!(step, Step::Vectorize { .. });
                if vector && *at + 1 != st.loops.len() {
                    return Err("only the innermost loop can be vectorised".into());
                }
                self.stages[*stage].loops[*at].kind = if vector {
                    LoopKind::Vectorized
                } else {
                    LoopKind::Unrolled
                };
                Ok(())
            }
        }
    }

    fn split(&mut self, s: usize, at: usize, factors: &[usize]) -> Result<(), String> {
        let st = &mut self.stages[s];
        if st.cache_write.is_some() || !st.shared.is_empty() {
            return Err("split after cache_write or shared_read".into());
        }
        if factors.is_empty() || factors.contains(&0) {
            return Err("split factors must be non-empty and positive".into());
        }
        if factors.len() > MAX_SPLIT_FACTORS {
            return Err(format!(
                "a split into {} factors exceeds the limit of {MAX_SPLIT_FACTORS}",
                factors.len()
            ));
        }
        if st.loops.len() + factors.len() > MAX_LOOPS_PER_STAGE {
            return Err(format!(
                "the split would give stage {s} more than {MAX_LOOPS_PER_STAGE} loops"
            ));
        }
        let lp = st.loops[at].clone();
        if lp.parts.len() != 1 {
            return Err("cannot split a fused loop".into());
        }
        if lp.kind != LoopKind::Serial {
            return Err("cannot split an annotated loop".into());
        }
        let node = lp.parts[0];
        let Node {
            axis,
            extent,
            stride,
            ..
        } = st.nodes[node];
        // Checked: factors from a cache file may multiply past usize and wrap to a small
        // product that would pass the test below.
        let inner = factors
            .iter()
            .try_fold(1usize, |acc, &f| acc.checked_mul(f))
            .filter(|&inner| inner <= extent)
            .ok_or_else(|| format!("factors {factors:?} exceed the extent {extent}"))?;
        let outer = extent.div_ceil(inner);
        let mut extents = vec![outer];
        extents.extend_from_slice(factors);
        let mut new_loops = Vec::new();
        let mut child_stride = stride.checked_mul(inner).ok_or("split strides overflow")?;
        for (k, &e) in extents.iter().enumerate() {
            if k > 0 {
                child_stride /= e;
            }
            st.nodes.push(Node {
                axis,
                extent: e,
                stride: child_stride,
                children: vec![],
                overrun: false,
            });
            let id = st.nodes.len() - 1;
            st.nodes[node].children.push(id);
            new_loops.push(LoopState {
                parts: vec![id],
                kind: LoopKind::Serial,
                reduce: lp.reduce,
            });
        }
        // outer * inner < extent + inner <= 2 * extent: no overflow.
        st.nodes[node].overrun = outer * inner != extent;
        st.loops.splice(at..=at, new_loops);
        match st.nest_iterations() {
            Some(n) if n <= MAX_NEST_ITERATIONS => Ok(()),
            _ => Err(format!(
                "the split's remainders make stage {s}'s nest exceed {MAX_NEST_ITERATIONS} iterations"
            )),
        }
    }

    fn rfactor(&mut self, s: usize, factor: usize) -> Result<(), String> {
        let stage = self
            .graph
            .stages
            .get(s)
            .cloned()
            .ok_or_else(|| format!("stage {s} does not exist"))?;
        let Some(red) = stage.reduce.clone() else {
            return Err("rfactor needs a reduction stage".into());
        };
        let extent = red.extents[0];
        if factor < 2 || factor >= extent || !extent.is_multiple_of(factor) {
            return Err(format!(
                "factor {factor} must divide the reduce extent {extent} and be between 2 and it"
            ));
        }
        self.check_untouched_from(s, "rfactor")?;
        let n = stage.n_spatial();
        // Partial stage: spatial axes ++ [rf], reduce over [outer, other reduce axes...].
        let body = stage.body.map(&mut |e| match e {
            Expr::Axis(a) if a == n => Expr::Axis(n + 1) * Expr::int(factor as i64) + Expr::Axis(n),
            Expr::Axis(a) if a > n => Expr::Axis(a + 1),
            other => other,
        });
        let mut shape = stage.shape.clone();
        shape.push(factor);
        let mut extents = red.extents.clone();
        extents[0] = extent / factor;
        let partial = harl_te::Stage {
            name: format!("{}_rf", stage.name),
            shape: shape.clone(),
            reduce: Some(harl_te::Reduction {
                op: red.op,
                extents: extents.clone(),
            }),
            body,
            dtype: stage.dtype,
        };
        self.insert_stage(s, partial)?;
        let mut idx: Vec<Expr> = (0..n).map(Expr::Axis).collect();
        idx.push(Expr::Axis(n));
        let final_stage = &mut self.graph.stages[s + 1];
        final_stage.reduce = Some(harl_te::Reduction {
            op: red.op,
            extents: vec![factor],
        });
        final_stage.body = Expr::Load(TensorRef::Stage(s), idx);
        self.stages[s + 1] = StageState::new(&self.graph.stages[s + 1].axis_extents(), n);
        Ok(())
    }

    /// Runs root stage `c` in loop `at` of root stage `target` as `attach` says (compute_within,
    /// pack_at); what depends on the final loops is checked once every step has applied.
    fn attach_in_loop(
        &mut self,
        c: usize,
        target: usize,
        at: usize,
        attach: Attach,
    ) -> Result<(), String> {
        self.check_loop(target, at)?;
        if self.stages[target].attach != Attach::Root {
            return Err(format!("target stage {target} is not at the root"));
        }
        if self.stages[c].attach != Attach::Root {
            return Err(format!("stage {c} is already attached or inlined"));
        }
        self.stages[c].attach = attach;
        self.attached.entry((target, at)).or_default().push(c);
        Ok(())
    }

    /// Steps that insert a stage (rfactor, cache_read) renumber the stages after it, so they
    /// must come before any other step on those stages.
    fn check_untouched_from(&self, s: usize, what: &str) -> Result<(), String> {
        let untouched = |st: &StageState, g: &harl_te::Stage| {
            st.attach == Attach::Root
                && st.cache_write.is_none()
                && st.loops.len() == g.axis_extents().len()
                && st
                    .loops
                    .iter()
                    .all(|l| l.parts.len() == 1 && l.kind == LoopKind::Serial)
        };
        if (s..self.stages.len()).any(|i| !untouched(&self.stages[i], &self.graph.stages[i]))
            || self.attached.keys().any(|&(t, _)| t >= s)
        {
            return Err(format!(
                "{what} must come before other steps on this stage and later ones"
            ));
        }
        Ok(())
    }

    /// Inserts stage `s` (shifting `s..` up by one), renumbering later loads of stages `>= s`.
    fn insert_stage(&mut self, s: usize, stage: harl_te::Stage) -> Result<(), String> {
        if self.added >= MAX_ADDED_STAGES {
            return Err(format!(
                "the schedule adds more than {MAX_ADDED_STAGES} stages (rfactor, cache_read)"
            ));
        }
        self.added += 1;
        for st in &mut self.graph.stages[s..] {
            st.body = st.body.map(&mut |e| match e {
                Expr::Load(TensorRef::Stage(t), idx) if t >= s => {
                    Expr::Load(TensorRef::Stage(t + 1), idx)
                }
                other => other,
            });
        }
        let axes = stage.axis_extents();
        let n_spatial = stage.n_spatial();
        self.graph.stages.insert(s, stage);
        self.stages.insert(s, StageState::new(&axes, n_spatial));
        Ok(())
    }

    fn cache_read(
        &mut self,
        s: usize,
        input: usize,
        order: &[usize],
        panel: Option<usize>,
    ) -> Result<(), String> {
        if s >= self.graph.stages.len() {
            return Err(format!("stage {s} does not exist"));
        }
        let Some(param) = self.graph.inputs.get(input) else {
            return Err(format!("input {input} does not exist"));
        };
        let rank = param.shape.len();
        if !is_permutation(order, rank) {
            return Err(format!("{order:?} is not a permutation of {rank} axes"));
        }
        // Every `sample[d]`-th element along input axis `d`: all the stage reads of it (a 1x1
        // convolution of stride 2 reads every second pixel).
        let sample = crate::layout::sample_factors(&self.graph.stages[s], input, rank);
        let extents = crate::layout::sampled_shape(&param.shape, &sample);
        // The input axis cut into panels, its (sampled) extent and the panel width.
        let panel = match (panel, order.last()) {
            (None, _) | (_, None) => None,
            (Some(p), Some(&last)) => {
                let n = extents[last];
                if p == 0 || !n.is_multiple_of(p) {
                    return Err(format!("a panel of {p} does not divide the extent {n}"));
                }
                if rank >= harl_te::limits::MAX_RANK {
                    return Err(format!(
                        "a panel copy of a rank-{rank} input is over the rank limit"
                    ));
                }
                Some((last, n, p))
            }
        };
        let mut reads = false;
        self.graph.stages[s].body.visit(&mut |e| {
            reads |= matches!(e, Expr::Load(TensorRef::Input(i), _) if *i == input);
        });
        if !reads {
            return Err(format!("stage {s} does not read input {input}"));
        }
        self.check_untouched_from(s, "cache_read")?;
        // The copy's element at axes (a_0..a_r) is the input at a_{inverse(order)} (times the
        // sampling); with panels the axes are (panel, a_0..a_{r-2}, within panel).
        let mut src = vec![Expr::int(0); rank];
        let shift = usize::from(panel.is_some());
        for (i, &o) in order.iter().enumerate() {
            src[o] = Expr::Axis(i + shift);
        }
        let mut shape: Vec<usize> = order.iter().map(|&o| extents[o]).collect();
        if let Some((last, n, p)) = panel {
            src[last] = Expr::Axis(0) * Expr::int(p as i64) + Expr::Axis(rank);
            shape.insert(0, n / p);
            if let Some(l) = shape.last_mut() {
                *l = p;
            }
        }
        for (e, &f) in src.iter_mut().zip(&sample) {
            if f > 1 {
                *e = e.clone() * Expr::int(f as i64);
            }
        }
        let reader_extents = self.graph.stages[s].axis_extents();
        let copy = harl_te::Stage {
            name: format!("{}_read{input}", self.graph.stages[s].name),
            shape,
            reduce: None,
            body: Expr::Load(TensorRef::Input(input), src),
            dtype: param.dtype,
        };
        self.insert_stage(s, copy)?;
        let mut undivided = false;
        let reader = &mut self.graph.stages[s + 1];
        reader.body = reader.body.map(&mut |e| match e {
            Expr::Load(TensorRef::Input(i), idx) if i == input => {
                let idx: Vec<Expr> = idx
                    .iter()
                    .zip(&sample)
                    .map(|(e, &f)| {
                        crate::layout::sampled_index(e, f, &reader_extents).unwrap_or_else(|| {
                            // `sample_factors` divides every read's index; never reached.
                            undivided = true;
                            e.clone()
                        })
                    })
                    .collect();
                let mut to: Vec<Expr> = order.iter().map(|&o| idx[o].clone()).collect();
                if let Some((last, _, p)) = panel {
                    let p = Expr::int(p as i64);
                    to.insert(0, idx[last].clone().binary(BinaryOp::Div, p.clone()));
                    if let Some(l) = to.last_mut() {
                        *l = idx[last].clone().binary(BinaryOp::Rem, p);
                    }
                }
                Expr::Load(TensorRef::Stage(s), to)
            }
            other => other,
        });
        if undivided {
            return Err(format!("input {input}'s reads are not sampled evenly"));
        }
        Ok(())
    }

    fn inline(&mut self, s: usize) -> Result<(), String> {
        if s >= self.graph.stages.len() {
            return Err(format!("stage {s} does not exist"));
        }
        if s + 1 == self.graph.stages.len() {
            return Err("the output stage cannot be inlined".into());
        }
        if self.graph.stages[s].reduce.is_some() {
            return Err("a reduction cannot be inlined".into());
        }
        if self.stages[s].attach != Attach::Root
            || self.stages[s].loops.len() != self.graph.stages[s].n_spatial()
        {
            return Err("inline a stage before scheduling it".into());
        }
        if self.attached.keys().any(|&(t, _)| t == s) {
            return Err("a stage with an attached epilogue cannot be inlined".into());
        }
        let body = self.graph.stages[s].body.clone();
        let body_nodes = node_count(&body);
        let body_depth = depth(&body);
        for c in s + 1..self.graph.stages.len() {
            // Each load of stage `s` becomes a copy of its body: bound the result before
            // building it.
            // (Its axes become the load's indices, so a copy is at most body x indices.)
            let consumer = &self.graph.stages[c].body;
            let mut grown = node_count(consumer);
            let mut idx_depth = 0;
            consumer.visit(&mut |e| {
                if let Expr::Load(TensorRef::Stage(t), idx) = e {
                    if *t == s {
                        let idx_nodes: usize = idx.iter().map(node_count).sum();
                        grown = grown.saturating_add(body_nodes.saturating_mul(1 + idx_nodes));
                        idx_depth = idx.iter().map(depth).fold(idx_depth, usize::max);
                    }
                }
            });
            if grown > MAX_BODY_NODES {
                return Err(format!(
                    "inlining stage {s} would give stage {c} a body of more than {MAX_BODY_NODES} nodes"
                ));
            }
            if depth(consumer) + body_depth + idx_depth > MAX_BODY_DEPTH {
                return Err(format!(
                    "inlining stage {s} would nest stage {c}'s body deeper than {MAX_BODY_DEPTH}"
                ));
            }
        }
        self.stages[s].attach = Attach::Inline;
        for c in s + 1..self.graph.stages.len() {
            let new = self.graph.stages[c].body.map(&mut |e| match e {
                Expr::Load(TensorRef::Stage(t), idx) if t == s => substitute_axes(&body, &idx),
                other => other,
            });
            self.graph.stages[c].body = new;
        }
        Ok(())
    }

    /// Checks every compute_at once all steps (including inlines) are known.
    fn check_attachments(&self) -> Result<(), (usize, String)> {
        for (c, st) in self.stages.iter().enumerate() {
            if let Attach::Within { target, at, step } = st.attach {
                self.check_within(c, target, at)
                    .map_err(|why| (step, why))?;
            }
            if let Attach::Packed { target, at, step } = st.attach {
                self.check_packed(c, target, at)
                    .map_err(|why| (step, why))?;
            }
            if let Some(step) = st.slide {
                self.check_slide(c).map_err(|why| (step, why))?;
            }
        }
        for (c, st) in self.stages.iter().enumerate() {
            let Attach::At {
                target,
                at,
                step: idx,
            } = st.attach
            else {
                continue;
            };
            let cs = &self.graph.stages[c];
            let ts = &self.graph.stages[target];
            let err = |why: String| Err((idx, why));
            if cs.reduce.is_some() {
                return err(format!(
                    "stage {c} is a reduction and cannot be an epilogue"
                ));
            }
            if cs.shape != ts.shape {
                return err(format!("stage {c} and stage {target} differ in shape"));
            }
            let identity: Vec<Expr> = (0..cs.n_spatial()).map(Expr::Axis).collect();
            let mut bad = None;
            cs.body.visit(&mut |e| {
                if let Expr::Load(TensorRef::Stage(t), i) = e {
                    if *t == target && *i != identity {
                        bad = Some(format!(
                            "stage {c} reads stage {target} at other than its own index"
                        ));
                    } else if *t > target && self.stages[*t].attach != Attach::Inline {
                        bad = Some(format!(
                            "stage {c} reads stage {t}, which runs after stage {target}"
                        ));
                    }
                }
            });
            if let Some(why) = bad {
                return err(why);
            }
            let tst = &self.stages[target];
            if at >= tst.loops.len() {
                // Checked when the step applied; a later fuse on the target removed the loop.
                return err(format!(
                    "stage {target} has {} loops once scheduled; there is no loop {at} to attach to",
                    tst.loops.len()
                ));
            }
            if tst.cache_write.is_some_and(|p| at > p) {
                return err(format!(
                    "loop {at} of stage {target} is inside its accumulator block; attach at or outside it"
                ));
            }
            if tst.loops[..=at].iter().any(|l| l.reduce) {
                return err(format!(
                    "loop {at} of stage {target} is inside a reduce loop"
                ));
            }
        }
        Ok(())
    }

    /// The leading axes of `target` that its loops `0..=at` cover, if they are exactly
    /// axes `0..k`, each unsplit, spatial, and in a loop that can hold other statements.
    fn leading_axes(&self, target: usize, at: usize) -> Result<usize, String> {
        let tst = &self.stages[target];
        let loops = tst.loops.get(..=at).ok_or_else(|| {
            format!(
                "stage {target} has {} loops once scheduled; there is no loop {at} to compute within",
                tst.loops.len()
            )
        })?;
        let n_axes = self.graph.stages[target].axis_extents().len();
        let mut axes = Vec::new();
        for l in loops {
            if l.reduce || !matches!(l.kind, LoopKind::Serial | LoopKind::Parallel) {
                return Err(format!(
                    "loops 0..={at} of stage {target} must be plain spatial loops"
                ));
            }
            for &p in &l.parts {
                if p >= n_axes || !tst.nodes[p].children.is_empty() {
                    return Err(format!(
                        "loops 0..={at} of stage {target} must be whole (unsplit) axes"
                    ));
                }
                axes.push(p);
            }
        }
        axes.sort_unstable();
        if axes.iter().enumerate().any(|(i, &a)| a != i) {
            return Err(format!(
                "loops 0..={at} of stage {target} must be its leading axes"
            ));
        }
        Ok(axes.len())
    }

    /// Checks a [`Step::ComputeWithin`] of stage `c` in loop `at` of `target` against the
    /// final state (see the step's documentation for the rules).
    fn check_within(&self, c: usize, target: usize, at: usize) -> Result<(), String> {
        let k = self.leading_axes(target, at)?;
        let tst = &self.stages[target];
        let st = &self.stages[c];
        let (cs, ts) = (&self.graph.stages[c], &self.graph.stages[target]);
        if tst.loops.iter().any(|l| l.kind.is_gpu()) || !tst.shared.is_empty() {
            return Err("compute_within is for CPU nests".into());
        }
        if tst.cache_write.is_some_and(|p| at > p) {
            return Err(format!(
                "loop {at} of stage {target} is inside its accumulator block; compute within at or outside it"
            ));
        }
        if cs.n_spatial() < k || cs.shape[..k] != ts.shape[..k] {
            return Err(format!(
                "stage {c}'s leading axes differ from stage {target}'s first {k}"
            ));
        }
        let plain = (0..k).all(|i| {
            st.loops[i].parts == [i]
                && st.nodes[i].children.is_empty()
                && st.loops[i].kind == LoopKind::Serial
        });
        if !plain {
            return Err(format!(
                "stage {c}'s loops 0..{k} must be its leading axes, unsplit and plain"
            ));
        }
        // Its leading loops are the target's: a stage attached at one of them would be emitted
        // nowhere (an epilogue of the final reduction of an rfactor at its row loop left the
        // output unwritten).
        if let Some(a) = (0..k).find(|a| self.attached.get(&(c, *a)).is_some_and(|v| !v.is_empty()))
        {
            return Err(format!(
                "a stage is attached at loop {a} of stage {c}, which is stage {target}'s loop; attach it inside stage {c}'s own loops"
            ));
        }
        if st.loops[k..]
            .iter()
            .any(|l| l.kind == LoopKind::Parallel || l.kind.is_gpu())
            || !st.shared.is_empty()
        {
            return Err(format!(
                "stage {c} runs inside a loop of stage {target}; its own loops are serial"
            ));
        }
        if cs.reduce.is_some() {
            // Its buffer is not filled before the target's nest: the accumulator block starts
            // every slice at the reduction's identity instead.
            let ok = st
                .cache_write
                .is_some_and(|p| p + 1 >= k && !st.reduces_outside(p));
            if !ok {
                return Err(format!(
                    "stage {c} is a reduction computed within stage {target}: it needs cache_write at loop {} or at a loop inside its reduce loops",
                    k - 1
                ));
            }
        }
        // What runs before stage `c` in each slice: the target, then the stages attached to
        // the same loop ahead of it.
        let same_loop = self
            .attached
            .get(&(target, at))
            .map_or(&[][..], |v| v.as_slice());
        let before = same_loop
            .iter()
            .position(|&x| x == c)
            .map_or(&[][..], |i| &same_loop[..i]);
        let mut bad = None;
        cs.body.visit(&mut |e| {
            let Expr::Load(TensorRef::Stage(t), idx) = e else {
                return;
            };
            if *t == target || before.contains(t) {
                let own = idx.len() >= k && (0..k).all(|i| idx[i] == Expr::Axis(i));
                if !own {
                    bad = Some(format!(
                        "stage {c} reads stage {t} at other than its own leading indices"
                    ));
                }
            } else if *t > target {
                bad = Some(format!(
                    "stage {c} reads stage {t}, which is not done when stage {c} runs"
                ));
            }
        });
        bad.map_or(Ok(()), Err)
    }

    /// Checks a [`Step::Slide`] of stage `c` against the final state; what depends on the
    /// emitted loops (the rows each iteration reads) is checked as they are emitted.
    fn check_slide(&self, c: usize) -> Result<(), String> {
        let Attach::Within { target, at, .. } = self.stages[c].attach else {
            return Err(format!("stage {c} is not computed within another stage"));
        };
        let first = self.attached.get(&(target, at)).and_then(|v| v.first());
        if first != Some(&c) {
            return Err(format!(
                "stage {c} is not the first stage placed in loop {at} of stage {target}"
            ));
        }
        if self.graph.stages[target].reduce.is_some() {
            return Err(format!(
                "stage {target} is a reduction; only its result can slide"
            ));
        }
        let k = self.leading_axes(target, at)?;
        let tst = &self.stages[target];
        let row_loop = tst.loops.get(at + 1).filter(|l| {
            l.parts == [k]
                && tst.nodes.get(k).is_some_and(|n| n.children.is_empty())
                && l.kind == LoopKind::Serial
        });
        if row_loop.is_none() {
            return Err(format!(
                "stage {target}'s loop after loop {at} must be its axis {k}, unsplit and serial"
            ));
        }
        if self
            .attached
            .iter()
            .any(|(&(t, p), v)| t == target && p > at && !v.is_empty())
        {
            return Err(format!("a stage is attached inside stage {target}'s rows"));
        }
        let own = self.stages[c].loops.get(k).filter(|l| !l.reduce);
        if own.is_none() {
            return Err(format!("stage {c} has no spatial loop {k} to slide into"));
        }
        Ok(())
    }

    /// The axis of `target` whose value picks the panel of copy `c` it reads, and the panel
    /// width: every read of `c` in `target` is `[Axis(a) / w, .., Axis(a) % w]` (`w` the
    /// copy's last extent), as `cache_read` with panels writes it.
    fn panel_axis(&self, c: usize, target: usize) -> Result<(usize, usize), String> {
        let cs = &self.graph.stages[c];
        let width = cs.shape.last().copied().unwrap_or(0);
        let n_spatial = self.graph.stages[target].n_spatial();
        let w = Expr::int(width as i64);
        let mut axis = None;
        let mut bad = false;
        for idx in stage_reads(&self.graph.stages[target].body, c) {
            let (Some(first), Some(last)) = (idx.first(), idx.last()) else {
                bad = true;
                continue;
            };
            let a = match (first, last) {
                (Expr::Binary(BinaryOp::Div, e, d), Expr::Binary(BinaryOp::Rem, f, r))
                    if e == f && **d == w && **r == w =>
                {
                    match **e {
                        Expr::Axis(a) if a < n_spatial => Some(a),
                        _ => None,
                    }
                }
                _ => None,
            };
            match (a, axis) {
                (Some(a), None) => axis = Some(a),
                (Some(a), Some(b)) if a == b => {}
                _ => bad = true,
            }
        }
        match axis {
            Some(a) if !bad && cs.shape.len() >= 2 && width > 0 => Ok((a, width)),
            _ => Err(format!(
                "stage {target} reads stage {c} other than by panels of one spatial axis"
            )),
        }
    }

    /// Checks a [`Step::PackAt`] of copy `c` in loop `at` of `target` against the final state
    /// (see the step's documentation for the rules).
    fn check_packed(&self, c: usize, target: usize, at: usize) -> Result<(), String> {
        let cs = &self.graph.stages[c];
        let (st, tst) = (&self.stages[c], &self.stages[target]);
        let has_stage_load = cs
            .body
            .loads()
            .iter()
            .any(|t| matches!(t, TensorRef::Stage(_)));
        if cs.reduce.is_some() || has_stage_load {
            return Err(format!("stage {c} is not a copy of a graph input"));
        }
        let other_reader = (0..self.graph.stages.len()).any(|x| {
            x != target
                && self.stages[x].attach != Attach::Inline
                && !stage_reads(&self.graph.stages[x].body, c).is_empty()
        });
        if other_reader {
            return Err(format!("stage {c} has readers other than stage {target}"));
        }
        let (a, width) = self.panel_axis(c, target)?;
        if at >= tst.loops.len() {
            return Err(format!(
                "stage {target} has {} loops once scheduled; there is no loop {at} to pack in",
                tst.loops.len()
            ));
        }
        if tst.loops.iter().any(|l| l.kind.is_gpu()) || !tst.shared.is_empty() {
            return Err("pack_at is for CPU nests".into());
        }
        if tst.cache_write.is_some_and(|p| at > p) {
            return Err(format!(
                "loop {at} of stage {target} is inside its accumulator block; pack at or outside it"
            ));
        }
        let (bound, inner) = self.panel_parts(target, a, at);
        if tst.nodes.iter().any(|n| n.axis == a && n.overrun) {
            return Err(format!("axis {a} of stage {target} has a remainder guard"));
        }
        let inner_span = inner
            .iter()
            .map(|&n| (tst.nodes[n].extent - 1).saturating_mul(tst.nodes[n].stride))
            .fold(0usize, usize::saturating_add);
        let whole = bound
            .iter()
            .all(|&n| tst.nodes[n].stride.is_multiple_of(width));
        if !whole || inner_span >= width {
            return Err(format!(
                "loops 0..={at} of stage {target} do not fix one panel of {width} along axis {a}"
            ));
        }
        let plain = st.loops.first().is_some_and(|l| {
            l.parts == [0] && st.nodes[0].children.is_empty() && l.kind == LoopKind::Serial
        });
        if !plain
            || st
                .loops
                .iter()
                .any(|l| l.kind == LoopKind::Parallel || l.kind.is_gpu())
            || !st.shared.is_empty()
            || st.cache_write.is_some()
        {
            return Err(format!(
                "stage {c}'s loop 0 must be its panel axis, unsplit and serial, and none of its loops parallel"
            ));
        }
        if self.attached.get(&(c, 0)).is_some_and(|v| !v.is_empty()) {
            return Err(format!(
                "a stage is attached at loop 0 of stage {c}, which stage {target}'s loops replace"
            ));
        }
        Ok(())
    }

    /// The leaves of axis `a` of stage `s` bound by loops `0..=at`, and the others.
    fn panel_parts(&self, s: usize, a: usize, at: usize) -> (Vec<NodeId>, Vec<NodeId>) {
        let st = &self.stages[s];
        let mut leaves = Vec::new();
        st.leaves(a, &mut leaves);
        leaves.into_iter().partition(|leaf| {
            st.loops
                .iter()
                .position(|l| l.parts.contains(leaf))
                .is_some_and(|p| p <= at)
        })
    }

    /// Copy `c`'s panel at the top of loop `pos` of its reader `s`: its panel index bound from
    /// the reader's loops outside (`check_packed` proved it fixed there), then its own loops.
    fn emit_packed(
        &mut self,
        s: usize,
        pos: usize,
        c: usize,
        env: &HashMap<NodeId, usize>,
    ) -> Result<Vec<Stmt>, (usize, String)> {
        let step = match self.stages[c].attach {
            Attach::Packed { step, .. } => step,
            _ => 0,
        };
        let (a, width) = self.panel_axis(c, s).map_err(|why| (step, why))?;
        let (bound, _) = self.panel_parts(s, a, pos);
        let mut value = Expr::int(0);
        for leaf in bound {
            let var = env.get(&leaf).copied().ok_or((
                step,
                format!("a part of axis {a} of stage {s} is not bound"),
            ))?;
            let panels = self.stages[s].nodes[leaf].stride / width;
            value = value + Expr::Axis(var) * Expr::int(panels as i64);
        }
        let panels = self.graph.stages[c].shape.first().copied().unwrap_or(1);
        let var = self.new_var(panels);
        let mut env_c = HashMap::from([(0, var)]);
        let mut body = vec![Stmt::Let { var, value }];
        body.extend(self.emit_loops(c, 1, &mut env_c, &mut Vec::new())?);
        Ok(body)
    }

    fn new_var(&mut self, extent: usize) -> usize {
        self.var_extents.push(extent);
        self.var_extents.len() - 1
    }

    /// The consumer of stage `s` that its write-back can compute directly from the
    /// accumulator, on the CPU, when it is the only reader of `s` (every read at `s`'s own
    /// index, which `check_attachments` ensured) and attached (`compute_at`) either at the
    /// accumulator's own loop, where the block holds whole reductions, or, where reduce loops
    /// are outside the block (a split reduction: `s` keeps its partial sums in memory),
    /// outside all of them: it is then computed in the last reduction block's write-back
    /// rather than in a pass of its own over `s` (BERT's FFN layer: its GELU no longer reads
    /// the 128 x 3072 partial sums back from L2).
    fn forwarded_epilogue(&self, s: usize) -> Option<Forward> {
        let st = &self.stages[s];
        let pos = st.cache_write?;
        let placed = matches!(st.attach, Attach::Root | Attach::Within { .. });
        if !placed || st.loops.iter().any(|l| l.kind.is_gpu()) {
            return None;
        }
        let partials = st.reduces_outside(pos);
        let levels = if partials {
            0..st.loops[..=pos].iter().position(|l| l.reduce)?
        } else {
            pos..pos + 1
        };
        let consumers: Vec<usize> = levels
            .filter_map(|a| self.attached.get(&(s, a)))
            .flatten()
            .copied()
            .filter(|&c| !matches!(self.stages[c].attach, Attach::Packed { .. }))
            .collect();
        let [c] = consumers.as_slice() else {
            return None;
        };
        if !matches!(self.stages[*c].attach, Attach::At { .. }) {
            return None;
        }
        // Computed at every element of `s`, once: the consumer covers exactly `s`'s elements,
        // and nothing is placed in its own loops, which are not emitted.
        if partials
            && (self.graph.stages[*c].shape != self.graph.stages[s].shape
                || self.attached.keys().any(|&(t, _)| t == *c)
                || !self.first_store[s])
        {
            return None;
        }
        let others = (0..self.graph.stages.len())
            .filter(|&x| x != *c && self.stages[x].attach != Attach::Inline)
            .any(|x| !stage_reads(&self.graph.stages[x].body, s).is_empty());
        (!others).then_some(Forward {
            consumer: *c,
            partials,
        })
    }

    /// [`Program::fold`]: the stages of each row chain (a root stage and the stages computed
    /// within its loop 0) that only the chain reads, each with the chain's leading axes, when
    /// a slice is [`MIN_FOLD_BYTES`] or more. A consumer attached to a chain stage counts as
    /// the chain. The output, a stage without a buffer, and a buffer its nest pre-fills keep
    /// their whole buffers.
    fn folds(&self, buffers: &[bool], nests: &[Nest]) -> Vec<usize> {
        let n = self.graph.stages.len();
        let mut fold = vec![0; n];
        for t in 0..n {
            let chain: Vec<usize> = std::iter::once(t)
                .chain((0..n).filter(|&c| {
                    matches!(self.stages[c].attach, Attach::Within { target, at: 0, .. } if target == t)
                }))
                .collect();
            if self.stages[t].attach != Attach::Root || chain.len() < 2 {
                continue;
            }
            let Ok(k) = self.leading_axes(t, 0) else {
                continue;
            };
            let in_chain = |x: usize| {
                chain.contains(&x)
                    || matches!(self.stages[x].attach, Attach::At { target, .. } if chain.contains(&target))
            };
            let filled = |m: usize| {
                nests
                    .iter()
                    .any(|nest| nest.stage == m && nest.fill.is_some())
            };
            for &m in &chain {
                let st = &self.graph.stages[m];
                let slice_bytes = st.shape[k.min(st.shape.len())..]
                    .iter()
                    .product::<usize>()
                    .saturating_mul(crate::default_schedule::elem_bytes(st.dtype));
                if m + 1 == n || !buffers[m] || filled(m) || slice_bytes < MIN_FOLD_BYTES {
                    continue;
                }
                // Within members read chain stages at their own leading indices
                // (`check_within`); a consumer attached to a member must too.
                let outside = (0..n).any(|x| {
                    let reads = stage_reads(&self.graph.stages[x].body, m);
                    let own = reads
                        .iter()
                        .all(|idx| idx.len() >= k && (0..k).all(|i| idx[i] == Expr::Axis(i)));
                    !reads.is_empty()
                        && (self.stages[x].attach == Attach::Inline || !in_chain(x) || !own)
                });
                if !outside {
                    fold[m] = k;
                }
            }
        }
        // A panel copy holds the one panel its reader's iteration reads (`check_packed`).
        for (c, st) in self.stages.iter().enumerate() {
            if matches!(st.attach, Attach::Packed { .. }) && buffers[c] {
                fold[c] = 1;
            }
        }
        fold
    }

    fn emit(mut self) -> Result<Program, (usize, String)> {
        self.first_store = self.first_stores();
        self.forward = (0..self.graph.stages.len())
            .map(|s| self.forwarded_epilogue(s))
            .collect();
        let mut nests = Vec::new();
        for s in 0..self.graph.stages.len() {
            if self.stages[s].attach != Attach::Root {
                continue;
            }
            let stage = &self.graph.stages[s];
            let st = &self.stages[s];
            let reduce_outside_acc = match st.cache_write {
                None => true,
                Some(p) => st.reduces_outside(p),
            };
            // A write-back that stores its first block's sums needs no fill.
            let fill = stage
                .reduce
                .as_ref()
                .filter(|_| reduce_outside_acc && !self.first_store[s])
                .map(|r| r.op.identity(stage.dtype));
            let mut env = HashMap::new();
            self.shared_bytes = 0;
            let body = self.emit_loops(s, 0, &mut env, &mut Vec::new())?;
            nests.push(Nest {
                stage: s,
                fill,
                body,
            });
        }
        let buffers: Vec<bool> = self
            .stages
            .iter()
            .zip(&self.forward)
            .map(|(st, f)| st.attach != Attach::Inline && f.is_none_or(|f| f.partials))
            .collect();
        let fold = self.folds(&buffers, &nests);
        let mut program = Program {
            workload_key: String::new(),
            graph: self.graph,
            nests,
            var_extents: self.var_extents,
            has_buffer: buffers,
            fold,
        };
        crate::simplify::program(&mut program);
        Ok(program)
    }

    /// Emits loops `pos..` of stage `s`; `env` maps split-tree leaves to loop variables.
    fn emit_loops(
        &mut self,
        s: usize,
        pos: usize,
        env: &mut HashMap<NodeId, usize>,
        acc: &mut Vec<(usize, usize)>,
    ) -> Result<Vec<Stmt>, (usize, String)> {
        let n_loops = self.stages[s].loops.len();
        if pos == n_loops {
            return Ok(vec![self.innermost(s, env, acc)]);
        }
        let lp = self.stages[s].loops[pos].clone();
        let extent = self.stages[s].loop_extent(&lp);
        let var = self.new_var(extent);
        let mut body = self.bind_parts(s, &lp, var, env);
        if lp.kind == LoopKind::GpuThread {
            self.thread_vars = std::iter::once(var)
                .chain(lp.parts.iter().filter_map(|p| env.get(p).copied()))
                .collect();
        }
        if !lp.reduce && self.stages[s].cache_write.is_some_and(|p| pos > p) {
            acc.push((var, lp.kind.acc_row(extent)));
        }
        // The reduce loops around a write-back: this one too, as the block is inside it.
        if lp.reduce {
            self.reduce_loops.push((s, var, extent));
        }
        let inner = self.emit_loops(s, pos + 1, env, acc).and_then(|inner| {
            let inner = self.stage_shared(s, pos, inner)?;
            Ok(if self.stages[s].cache_write == Some(pos) {
                self.wrap_acc(s, pos, env, inner)
            } else {
                inner
            })
        });
        if lp.reduce {
            self.reduce_loops.pop();
        }
        if !lp.reduce && self.stages[s].cache_write.is_some_and(|p| pos > p) {
            acc.pop();
        }
        let mut inner = inner?;
        if let Some(consumers) = self.attached.get(&(s, pos)).cloned() {
            let forwarded = self.forward.get(s).copied().flatten().map(|f| f.consumer);
            for c in consumers.into_iter().filter(|&c| Some(c) != forwarded) {
                if let (Attach::Within { .. }, Some(slid)) =
                    (&self.stages[c].attach, self.stages[c].slide)
                {
                    // The producer's loops so far (`check_slide`: nothing placed before `c`)
                    // slide into the consumer's first loop.
                    let consumer = self.emit_within(s, pos, c, env)?;
                    let producer = std::mem::take(&mut inner);
                    let k = self.leading_axes(s, pos).map_err(|why| (slid, why))?;
                    inner = crate::slide::slide(producer, consumer, s, k, &mut self.var_extents)
                        .map_err(|why| (slid, why))?;
                    continue;
                }
                match self.stages[c].attach {
                    Attach::Within { .. } => inner.extend(self.emit_within(s, pos, c, env)?),
                    // A panel copy runs first, before the loops that read it.
                    Attach::Packed { .. } => {
                        let mut body = self.emit_packed(s, pos, c, env)?;
                        body.append(&mut inner);
                        inner = body;
                    }
                    _ => inner.extend(self.emit_epilogue(s, pos, c, env)),
                }
            }
        }
        body.extend(self.guard(s, &lp, env, inner));
        for &p in &lp.parts {
            env.remove(&p);
        }
        Ok(vec![Stmt::For {
            var,
            extent,
            kind: lp.kind,
            body,
        }])
    }

    /// Wraps the body of loop `pos` of stage `s` in the shared-memory copies staged there.
    fn stage_shared(
        &mut self,
        s: usize,
        pos: usize,
        inner: Vec<Stmt>,
    ) -> Result<Vec<Stmt>, (usize, String)> {
        let staged: Vec<(usize, usize)> = self.stages[s]
            .shared
            .iter()
            .filter(|&&(_, at, _)| at == pos)
            .map(|&(input, _, step)| (input, step))
            .collect();
        if staged.is_empty() {
            return Ok(inner);
        }
        let mut varying: HashSet<usize> = self.thread_vars.iter().copied().collect();
        bound_vars(&inner, &mut varying);
        let mut boxes = Vec::new();
        for &(input, step) in &staged {
            let b: SharedBox =
                footprint(&inner, input, &varying, &self.var_extents).map_err(|e| (step, e))?;
            boxes.push(b);
        }
        let elem = |b: &SharedBox| match self.graph.inputs[b.input].dtype {
            harl_te::DType::F64 => 8,
            _ => 4,
        };
        // Boxes staged at different loops of the nest are live together.
        let bytes = boxes
            .iter()
            .map(|b| b.len().saturating_mul(elem(b)))
            .fold(0usize, usize::saturating_add);
        self.shared_bytes = self.shared_bytes.saturating_add(bytes);
        let bytes = self.shared_bytes;
        if bytes > MAX_SHARED_BYTES {
            return Err((
                staged[0].1,
                format!("shared boxes of {bytes} bytes exceed {MAX_SHARED_BYTES}"),
            ));
        }
        Ok(vec![Stmt::Shared { boxes, body: inner }])
    }

    /// Binds the parts of a (possibly fused) loop to variables.
    fn bind_parts(
        &mut self,
        s: usize,
        lp: &LoopState,
        var: usize,
        env: &mut HashMap<NodeId, usize>,
    ) -> Vec<Stmt> {
        if lp.parts.len() == 1 {
            env.insert(lp.parts[0], var);
            return vec![];
        }
        let mut lets = Vec::new();
        let mut inner_prod = 1usize;
        for &p in lp.parts.iter().rev() {
            let e = self.stages[s].nodes[p].extent;
            let pv = self.new_var(e);
            let value = (Expr::Axis(var) / Expr::int(inner_prod as i64)) % Expr::int(e as i64);
            lets.push(Stmt::Let { var: pv, value });
            env.insert(p, pv);
            inner_prod *= e;
        }
        lets
    }

    /// Wraps `inner` in the guards that became decidable once `lp`'s parts are bound.
    fn guard(
        &self,
        s: usize,
        lp: &LoopState,
        env: &HashMap<NodeId, usize>,
        inner: Vec<Stmt>,
    ) -> Vec<Stmt> {
        let st = &self.stages[s];
        let mut conds = Vec::new();
        for (id, node) in st.nodes.iter().enumerate() {
            if !node.overrun {
                continue;
            }
            let mut leaves = Vec::new();
            st.leaves(id, &mut leaves);
            let all_bound = leaves.iter().all(|l| env.contains_key(l));
            let newly = leaves.iter().any(|l| lp.parts.contains(l));
            if all_bound && newly {
                let rel = leaves
                    .iter()
                    .map(|&l| {
                        Expr::Axis(env[&l]) * Expr::int((st.nodes[l].stride / node.stride) as i64)
                    })
                    .reduce(|a, b| a + b)
                    .unwrap_or_else(|| Expr::int(0));
                conds.push(rel.cmp(harl_te::CmpOp::Lt, Expr::int(node.extent as i64)));
            }
        }
        match conds.into_iter().reduce(|a, b| a.and(b)) {
            None => inner,
            Some(cond) => vec![Stmt::If { cond, body: inner }],
        }
    }

    /// The value of each axis of stage `s` in terms of bound loop variables.
    fn axis_values(&self, s: usize, env: &HashMap<NodeId, usize>) -> Vec<Expr> {
        let st = &self.stages[s];
        let n_axes = self.graph.stages[s].axis_extents().len();
        (0..n_axes)
            .map(|a| {
                let mut leaves = Vec::new();
                st.leaves(a, &mut leaves);
                leaves
                    .iter()
                    .filter_map(|l| env.get(l).map(|&v| (v, st.nodes[*l].stride)))
                    .map(|(v, stride)| {
                        if stride == 1 {
                            Expr::Axis(v)
                        } else {
                            Expr::Axis(v) * Expr::int(stride as i64)
                        }
                    })
                    .reduce(|a, b| a + b)
                    .unwrap_or_else(|| Expr::int(0))
            })
            .collect()
    }

    fn innermost(&self, s: usize, env: &HashMap<NodeId, usize>, acc: &[(usize, usize)]) -> Stmt {
        let stage = &self.graph.stages[s];
        let axes = self.axis_values(s, env);
        let value = substitute_axes(&stage.body, &axes);
        let index = axes[..stage.n_spatial()].to_vec();
        match (&stage.reduce, self.stages[s].cache_write) {
            (Some(r), Some(_)) => Stmt::AccUpdate {
                index: tile_index(acc),
                op: r.op,
                value,
            },
            (r, _) => Stmt::Store {
                stage: s,
                index,
                value,
                combine: r.as_ref().map(|r| r.op),
            },
        }
    }

    /// Declares the accumulator block at loop `pos` and writes it back after `inner`.
    fn wrap_acc(
        &mut self,
        s: usize,
        pos: usize,
        env: &mut HashMap<NodeId, usize>,
        inner: Vec<Stmt>,
    ) -> Vec<Stmt> {
        let stage = &self.graph.stages[s];
        let op = stage.reduce.as_ref().map_or(ReduceOp::Sum, |r| r.op);
        let st = &self.stages[s];
        let combine = st.reduces_outside(pos).then_some(op);
        let size = st.loops[pos + 1..]
            .iter()
            .filter(|l| !l.reduce)
            .map(|l| l.kind.acc_row(st.loop_extent(l)))
            .product();
        let mut out = vec![Stmt::AccDecl {
            size,
            dtype: stage.dtype,
            init: op.identity(stage.dtype),
        }];
        out.extend(inner);
        let forwarded = self.forward.get(s).copied().flatten();
        let Some(combine) = combine.filter(|_| self.first_store[s]) else {
            let epilogue = forwarded.map(|f| f.consumer);
            out.extend(self.write_back(s, pos, env, combine, epilogue));
            return out;
        };
        // A split reduction (`Forward::partials`, or none forwarded): the reduce loops outside
        // the block, entered on the way here, numbered as one block index. The first block
        // stores its sums (the buffer needs no fill), the middle ones add theirs, and the last
        // computes the forwarded consumer, if any, from the stored sums plus its own.
        let outer: Vec<(usize, usize)> = self
            .reduce_loops
            .iter()
            .filter(|r| r.0 == s)
            .map(|&(_, var, extent)| (var, extent))
            .collect();
        let blocks = outer.iter().fold(1usize, |n, r| n.saturating_mul(r.1));
        let block = tile_index(&outer);
        let at = |i: usize| block.clone().cmp(CmpOp::Eq, Expr::int(i as i64));
        let last = blocks.saturating_sub(1);
        let consumer = forwarded.map(|f| f.consumer);
        if blocks <= 1 {
            out.extend(self.write_back(s, pos, env, None, consumer));
            return out;
        }
        let mut branch = |lw: &mut Self, cond: Expr, combine, epilogue| Stmt::If {
            cond,
            body: lw.write_back(s, pos, env, combine, epilogue),
        };
        out.push(branch(self, at(0), None, None));
        if blocks > 2 {
            let middle = block
                .clone()
                .cmp(CmpOp::Gt, Expr::int(0))
                .and(block.clone().cmp(CmpOp::Lt, Expr::int(last as i64)));
            out.push(branch(self, middle, Some(combine), None));
        }
        out.push(branch(self, at(last), Some(combine), consumer));
        out
    }

    /// Per stage, whether the write-back of its reduction, where split around its accumulator
    /// block, stores the first block's sums instead of adding them to a pre-filled buffer (no
    /// fill before the nest, no load in that block). Never in a program with a GPU loop in any
    /// stage (a GPU schedule may bind another stage than the reduction; the CUDA codegen
    /// combines only in write-backs without an epilogue). Elsewhere for a stage with an
    /// accumulator block whose every reduce-loop iteration runs the write-back: a split of a
    /// reduce axis that overruns it is guarded at the loop binding the last of its parts
    /// ([`Lowering::guard`]), and that guard must lie inside the block (`k.o` outside, `k.i`
    /// guarded inside), or it could skip a first block's store or the last block's epilogue.
    fn first_stores(&self) -> Vec<bool> {
        let gpu = self
            .stages
            .iter()
            .flat_map(|t| &t.loops)
            .any(|l| l.kind.is_gpu());
        (0..self.stages.len())
            .map(|s| !gpu && self.reduce_guards_inside_block(s))
            .collect()
    }

    /// Whether stage `s` has an accumulator block and every guard of its reduce axes' splits
    /// lies inside it (see [`Lowering::first_stores`]).
    fn reduce_guards_inside_block(&self, s: usize) -> bool {
        let st = &self.stages[s];
        let Some(pos) = st.cache_write else {
            return false;
        };
        let n_spatial = self.graph.stages[s].n_spatial();
        let loop_of = |leaf: NodeId| st.loops.iter().position(|l| l.parts.contains(&leaf));
        let guard_inside = |id: NodeId| {
            let mut leaves = Vec::new();
            st.leaves(id, &mut leaves);
            leaves
                .into_iter()
                .map(loop_of)
                .max()
                .flatten()
                .is_some_and(|at| at > pos)
        };
        (0..st.nodes.len())
            .filter(|&id| st.nodes[id].overrun && st.nodes[id].axis >= n_spatial)
            .all(guard_inside)
    }

    /// The write-back loops of stage `s`'s accumulator block at loop `pos`: each element
    /// stored (or combined with the stored value), or, with `epilogue`, that consumer
    /// computed from it.
    fn write_back(
        &mut self,
        s: usize,
        pos: usize,
        env: &mut HashMap<NodeId, usize>,
        combine: Option<ReduceOp>,
        epilogue: Option<usize>,
    ) -> Vec<Stmt> {
        self.emit_tile_loops(s, pos, env, &mut Vec::new(), &mut |lw, env, tile| {
            let axes = lw.axis_values(s, env);
            let n = lw.graph.stages[s].n_spatial();
            let dest = axes[..n].to_vec();
            let epilogue = epilogue.map(|c| crate::loop_ir::Epilogue {
                stage: c,
                value: substitute_axes(&lw.graph.stages[c].body, &dest),
            });
            Stmt::AccStore {
                index: tile_index(tile),
                stage: s,
                dest,
                combine,
                epilogue,
            }
        })
    }

    /// Emits the spatial loops of stage `s` inside position `pos`, with fresh variables, around the
    /// statement `leaf` builds (write-back of an accumulator, or an attached epilogue).
    fn emit_tile_loops(
        &mut self,
        s: usize,
        pos: usize,
        env: &mut HashMap<NodeId, usize>,
        tile: &mut Vec<(usize, usize)>,
        leaf: &mut TileLeaf<'_>,
    ) -> Vec<Stmt> {
        let next = (pos + 1..self.stages[s].loops.len()).find(|&p| !self.stages[s].loops[p].reduce);
        let Some(p) = next else {
            return vec![leaf(self, env, tile)];
        };
        let lp = self.stages[s].loops[p].clone();
        let extent = self.stages[s].loop_extent(&lp);
        let var = self.new_var(extent);
        let mut body = self.bind_parts(s, &lp, var, env);
        tile.push((var, lp.kind.acc_row(extent)));
        let inner = self.emit_tile_loops(s, p, env, tile, leaf);
        tile.pop();
        body.extend(self.guard(s, &lp, env, inner));
        for &part in &lp.parts {
            env.remove(&part);
        }
        let kind = match lp.kind {
            LoopKind::Parallel => LoopKind::Serial,
            k => k,
        };
        vec![Stmt::For {
            var,
            extent,
            kind,
            body,
        }]
    }

    /// Stage `c`'s own loops past the leading axes that loops `0..=pos` of stage `s` bind
    /// (checked by `check_within`), with its accumulator block if it has one there.
    fn emit_within(
        &mut self,
        s: usize,
        pos: usize,
        c: usize,
        env: &HashMap<NodeId, usize>,
    ) -> Result<Vec<Stmt>, (usize, String)> {
        let step = match self.stages[c].attach {
            Attach::Within { step, .. } => step,
            _ => 0,
        };
        let k = self.leading_axes(s, pos).map_err(|why| (step, why))?;
        // The target's root nodes `0..k` are its leading axes, as are stage c's.
        let mut env_c = HashMap::new();
        for axis in 0..k {
            let var = env
                .get(&axis)
                .copied()
                .ok_or((step, format!("axis {axis} of stage {s} is not bound")))?;
            env_c.insert(axis, var);
        }
        let mut body = self.emit_loops(c, k, &mut env_c, &mut Vec::new())?;
        if self.stages[c].cache_write.is_some_and(|p| p + 1 == k) {
            body = self.wrap_acc(c, k - 1, &mut env_c, body);
        }
        Ok(body)
    }

    /// The loops and store of consumer `c`, computed over the tile stage `s` finished at `pos`.
    fn emit_epilogue(
        &mut self,
        s: usize,
        pos: usize,
        c: usize,
        env: &mut HashMap<NodeId, usize>,
    ) -> Vec<Stmt> {
        self.emit_tile_loops(s, pos, env, &mut Vec::new(), &mut |lw, env, _| {
            let n = lw.graph.stages[s].n_spatial();
            let axes = lw.axis_values(s, env)[..n].to_vec();
            let cs = &lw.graph.stages[c];
            Stmt::Store {
                stage: c,
                index: axes.clone(),
                value: substitute_axes(&cs.body, &axes),
                combine: None,
            }
        })
    }
}

/// Flat index into an accumulator tile from its loop variables and row lengths, row-major.
fn tile_index(tile: &[(usize, usize)]) -> Expr {
    let mut idx: Option<Expr> = None;
    for &(v, e) in tile {
        idx = Some(match idx {
            None => Expr::Axis(v),
            Some(i) => i * Expr::int(e as i64) + Expr::Axis(v),
        });
    }
    idx.unwrap_or_else(|| Expr::int(0))
}

/// Replaces `Axis(i)` in `body` by `values[i]`.
pub fn substitute_axes(body: &Expr, values: &[Expr]) -> Expr {
    body.map(&mut |e| match e {
        Expr::Axis(i) => values.get(i).cloned().unwrap_or(Expr::Axis(i)),
        other => other,
    })
}
