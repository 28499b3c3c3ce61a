//! The loop IR: what lowering produces and codegen prints.
//!
//! Expressions are te [`Expr`]s in which `Axis(v)` names loop variable `v` of the program (not a
//! stage axis). [`execute`] runs a program directly, so the schedule transforms are tested
//! against the reference interpreter without compiling anything.

use harl_te::interp::round_to;
use harl_te::{BinaryOp, CmpOp, DType, Expr, Graph, ReduceOp, TensorRef, UnaryOp};

/// The lanes of the vectors that end a vectorised loop whose extent they do not divide: the
/// last `extent % ACC_ROW_LANES` iterations run as one vector of this many lanes, its loads
/// and stores of tensors masked, when [`masked_tail`] says so.
pub const ACC_ROW_LANES: usize = 8;

/// The lanes of the widest vectors (AVX-512's): where a loop's remainder after them is more
/// than [`ACC_ROW_LANES`], that variant ends the loop in one masked vector of this many lanes
/// ([`masked_wide_tail`]).
pub const WIDE_ROW_LANES: usize = 16;

/// Whether a vectorised loop of `extent` iterations ends in a masked vector: its remainder
/// is neither a whole 4-lane vector nor one scalar iteration. A register tile's accumulator
/// rows are then padded to whole vectors ([`LoopKind::acc_row`]), so the masked vector's
/// accumulators stay whole in registers.
pub fn masked_tail(extent: usize) -> bool {
    let r = extent % ACC_ROW_LANES;
    r >= 2 && r != 4
}

/// Whether a vectorised loop of `extent` iterations ends, in the variant with
/// [`WIDE_ROW_LANES`]-lane vectors, in one masked vector of that width: its remainder after
/// the whole ones is more than [`ACC_ROW_LANES`] (a 14-pixel row is one masked 16-lane vector
/// there, not 8 lanes and a masked 8). Accumulator rows are padded to match.
pub fn masked_wide_tail(extent: usize) -> bool {
    extent % WIDE_ROW_LANES > ACC_ROW_LANES
}

/// Whether `rest` iterations left after a variant's `lanes`-wide vectors (fewer than `lanes`)
/// run as one masked vector of that width: [`masked_wide_tail`] for 16 lanes, [`masked_tail`]
/// for 8, never for narrower vectors.
pub fn masked_rest(lanes: usize, rest: usize) -> bool {
    match lanes {
        WIDE_ROW_LANES => masked_wide_tail(rest),
        ACC_ROW_LANES => masked_tail(rest),
        _ => false,
    }
}

/// How a loop is emitted.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LoopKind {
    /// A plain loop.
    Serial,
    /// Iterations run on the thread pool.
    Parallel,
    /// Constant trip count, innermost: for the vectoriser.
    Vectorized,
    /// Constant trip count, unrolled.
    Unrolled,
    /// One GPU thread block per iteration (`blockIdx.x`); the outermost loop of a root nest.
    /// Serial on the CPU.
    GpuBlock,
    /// One GPU thread per iteration (`threadIdx.x`); directly inside the block loop. Serial on
    /// the CPU.
    GpuThread,
    /// The threads of a block each take a share of a reduction (a reduce loop bound to
    /// `threadIdx.x`, directly inside the block loop): each accumulates a partial result in
    /// registers, and the accumulator's write-back combines the partials across the block
    /// (Ansor's cross-thread reduction). Serial on the CPU, where the write-back's combine
    /// does the same.
    GpuThreadReduce,
}

impl LoopKind {
    /// The row length an accumulator block gives a tile loop of this kind and `extent`:
    /// padded to whole vectors where a vectorised loop ends in a masked one.
    pub fn acc_row(self, extent: usize) -> usize {
        if self != LoopKind::Vectorized {
            extent
        } else if masked_wide_tail(extent) {
            extent.next_multiple_of(WIDE_ROW_LANES)
        } else if masked_tail(extent) {
            extent.next_multiple_of(ACC_ROW_LANES)
        } else {
            extent
        }
    }

    /// Whether the loop is bound to GPU blocks or threads (serial on the CPU).
    pub fn is_gpu(self) -> bool {
        matches!(
            self,
            LoopKind::GpuBlock | LoopKind::GpuThread | LoopKind::GpuThreadReduce
        )
    }
}

/// A statement.
#[derive(Clone, Debug, PartialEq)]
pub enum Stmt {
    /// `for var in 0..extent { body }`.
    For {
        /// Loop variable.
        var: usize,
        /// Trip count.
        extent: usize,
        /// Annotation.
        kind: LoopKind,
        /// Body.
        body: Vec<Stmt>,
    },
    /// Binds `var` to an index expression (the parts of a fused loop).
    Let {
        /// Variable bound.
        var: usize,
        /// Its value.
        value: Expr,
    },
    /// `if cond { body }`: the remainder guard of a non-dividing split.
    If {
        /// Condition.
        cond: Expr,
        /// Body.
        body: Vec<Stmt>,
    },
    /// `stage[index] = value`, or `stage[index] = combine(stage[index], value)`.
    Store {
        /// Destination stage.
        stage: usize,
        /// One index per dimension.
        index: Vec<Expr>,
        /// Value stored.
        value: Expr,
        /// Reduction combining with the current value.
        combine: Option<ReduceOp>,
    },
    /// Declares the accumulator block of the enclosing scope, filled with `init`.
    AccDecl {
        /// Elements.
        size: usize,
        /// Element type.
        dtype: DType,
        /// Initial value (the reduction's identity).
        init: f64,
    },
    /// `acc[index] = op(acc[index], value)`.
    AccUpdate {
        /// Flat index into the block.
        index: Expr,
        /// Combining op.
        op: ReduceOp,
        /// Value.
        value: Expr,
    },
    /// GPU: the block's threads copy each box of a graph input into shared memory, then run
    /// `body`, whose reads of those inputs are served from the copies (every read must fall
    /// inside its box; the executor checks that it does). Indices in `body` stay global.
    Shared {
        /// The staged boxes, one per input.
        boxes: Vec<SharedBox>,
        /// The statements that read them.
        body: Vec<Stmt>,
    },
    /// `stage[dest] = acc[index]` (or combined with the stored value); with an
    /// [`Epilogue`], the consumer's value computed from `acc[index]` (or from it combined
    /// with the stored value: the last block of a split reduction) is stored instead, and
    /// `stage` itself is not stored.
    AccStore {
        /// Flat index into the block.
        index: Expr,
        /// Destination stage.
        stage: usize,
        /// Destination index.
        dest: Vec<Expr>,
        /// Combine with the stored value (reduce loops outside the block).
        combine: Option<ReduceOp>,
        /// An elementwise consumer fused into the write-back.
        epilogue: Option<Epilogue>,
    },
}

/// An elementwise consumer computed in a write-back, straight from the accumulator: its
/// value's loads of the accumulating stage (all at the write-back's `dest`) read
/// `acc[index]`, and the consumer is stored at `dest`. The accumulating stage then needs no
/// buffer (a 1x1 convolution's bias and ReLU6 no longer pass its whole output through
/// memory between two passes).
#[derive(Clone, Debug, PartialEq)]
pub struct Epilogue {
    /// The consumer stage stored.
    pub stage: usize,
    /// Its value; `Load(Stage(s), _)` of the accumulating stage `s` is the accumulator.
    pub value: Expr,
}

impl Stmt {
    /// The expressions this statement holds itself (indices, values, conditions, shared boxes'
    /// origins), not those of the statements nested in it.
    pub fn exprs(&self) -> Vec<&Expr> {
        match self {
            Stmt::For { .. } | Stmt::AccDecl { .. } => vec![],
            Stmt::Let { value, .. } => vec![value],
            Stmt::If { cond, .. } => vec![cond],
            Stmt::Store { index, value, .. } => index.iter().chain([value]).collect(),
            Stmt::AccUpdate { index, value, .. } => vec![index, value],
            Stmt::Shared { boxes, .. } => boxes.iter().flat_map(|b| &b.origin).collect(),
            Stmt::AccStore {
                index,
                dest,
                epilogue,
                ..
            } => std::iter::once(index)
                .chain(dest)
                .chain(epilogue.as_ref().map(|e| &e.value))
                .collect(),
        }
    }

    /// [`Stmt::exprs`], mutable.
    pub fn exprs_mut(&mut self) -> Vec<&mut Expr> {
        match self {
            Stmt::For { .. } | Stmt::AccDecl { .. } => vec![],
            Stmt::Let { value, .. } => vec![value],
            Stmt::If { cond, .. } => vec![cond],
            Stmt::Store { index, value, .. } => index.iter_mut().chain([value]).collect(),
            Stmt::AccUpdate { index, value, .. } => vec![index, value],
            Stmt::Shared { boxes, .. } => boxes.iter_mut().flat_map(|b| &mut b.origin).collect(),
            Stmt::AccStore {
                index,
                dest,
                epilogue,
                ..
            } => std::iter::once(index)
                .chain(dest)
                .chain(epilogue.as_mut().map(|e| &mut e.value))
                .collect(),
        }
    }

    /// Replaces every expression of this statement and of the statements in its body with
    /// `f` of it.
    pub fn map_exprs(&mut self, f: &dyn Fn(&Expr) -> Expr) {
        for e in self.exprs_mut() {
            *e = f(e);
        }
        for inner in self.body_mut() {
            inner.map_exprs(f);
        }
    }

    /// The stage this statement stores into, if it stores: a write-back with an
    /// [`Epilogue`] stores its consumer.
    pub fn stored_stage(&self) -> Option<usize> {
        match self {
            Stmt::Store { stage, .. } => Some(*stage),
            Stmt::AccStore {
                stage, epilogue, ..
            } => Some(epilogue.as_ref().map_or(*stage, |e| e.stage)),
            _ => None,
        }
    }

    /// The statements nested in this one (a loop's, an `if`'s or a shared block's body).
    pub fn body(&self) -> &[Stmt] {
        match self {
            Stmt::For { body, .. } | Stmt::If { body, .. } | Stmt::Shared { body, .. } => body,
            _ => &[],
        }
    }

    /// [`Stmt::body`], mutable.
    pub fn body_mut(&mut self) -> &mut [Stmt] {
        match self {
            Stmt::For { body, .. } | Stmt::If { body, .. } | Stmt::Shared { body, .. } => body,
            _ => &mut [],
        }
    }
}

/// The part of a graph input a [`Stmt::Shared`] stages: a box at a block-uniform origin.
#[derive(Clone, Debug, PartialEq)]
pub struct SharedBox {
    /// The graph input.
    pub input: usize,
    /// Global index of the box's first element, per dimension; the same for every thread of
    /// a block (it may lie outside the input, where a padding select reads nothing).
    pub origin: Vec<Expr>,
    /// Elements per dimension.
    pub extents: Vec<usize>,
}

impl SharedBox {
    /// Elements in the box.
    pub fn len(&self) -> usize {
        self.extents.iter().product()
    }

    /// Whether the box is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// The loop nest of one root stage.
#[derive(Clone, Debug, PartialEq)]
pub struct Nest {
    /// The stage it computes (attached epilogues are inside).
    pub stage: usize,
    /// Fill the stage's buffer with this value first (identity of a reduction).
    pub fill: Option<f64>,
    /// The statements (one outermost loop).
    pub body: Vec<Stmt>,
}

/// A lowered graph: nests run in order.
#[derive(Clone, Debug, PartialEq)]
pub struct Program {
    /// The workload key of the graph as declared (before rfactor added stages).
    pub workload_key: String,
    /// The graph after inlining and rfactor (stage bodies refer to stage axes).
    pub graph: Graph,
    /// Root nests, in stage order.
    pub nests: Vec<Nest>,
    /// Extent of each loop variable.
    pub var_extents: Vec<usize>,
    /// Whether each stage has a buffer (inlined stages do not).
    pub has_buffer: Vec<bool>,
    /// Per stage: leading axes its buffer drops (0 for none). A row chain's stage that only
    /// its chain reads, one slice of those axes at a time, holds one slice: the nest that
    /// writes it keeps that slice per thread, in cache (a depthwise convolution's padded
    /// plane, 52 KB, where the whole padded tensor was 5 MB).
    pub fold: Vec<usize>,
}

impl Program {
    /// The index and shape the buffer of `t` is addressed by: a folded stage's drop their
    /// leading [`Program::fold`] axes.
    pub fn view<'a>(&'a self, t: TensorRef, index: &'a [Expr]) -> (&'a [Expr], &'a [usize]) {
        let shape = self.graph.shape(t);
        let k = match t {
            TensorRef::Stage(s) => self.fold.get(s).copied().unwrap_or(0),
            TensorRef::Input(_) => 0,
        };
        let k = k.min(index.len()).min(shape.len());
        (&index[k..], &shape[k..])
    }

    /// Elements in the buffer of stage `s` (one slice if folded).
    pub fn buffer_len(&self, s: usize) -> usize {
        let shape = &self.graph.stages[s].shape;
        let k = self.fold.get(s).copied().unwrap_or(0).min(shape.len());
        shape[k..].iter().product()
    }
}

/// Whether interval analysis proves every index of an access within `shape`, given the loop
/// variables' extents (codegen then emits it unchecked).
pub fn in_bounds(index: &[Expr], shape: &[usize], var_extents: &[usize]) -> bool {
    index.iter().zip(shape).all(|(e, &n)| {
        let (lo, hi) = harl_te::graph::interval(e, var_extents);
        lo >= 0 && hi < n as i64
    })
}

/// Why [`execute`] failed: only for malformed programs or inputs.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ExecError {
    /// Wrong inputs.
    #[error("bad inputs: {0}")]
    Inputs(String),
    /// A load or store left its buffer.
    #[error("access out of bounds in stage {0}")]
    OutOfBounds(usize),
    /// A loaded stage has no buffer.
    #[error("stage {0} was read but has no buffer")]
    NoBuffer(usize),
    /// A read of a staged input fell outside its shared-memory box.
    #[error("input {0} was read outside its shared-memory box")]
    OutsideShared(usize),
}

/// Runs a program on inputs, returning the output (last stage) buffer.
pub fn execute(p: &Program, inputs: &[&[f64]]) -> Result<Vec<f64>, ExecError> {
    if inputs.len() != p.graph.inputs.len() {
        return Err(ExecError::Inputs(format!("{} inputs", inputs.len())));
    }
    let mut m = Machine {
        p,
        inputs,
        bufs: (0..p.graph.stages.len())
            // A buffer without a fill starts as NaN: codegen leaves it uninitialised, so every
            // element must be written before it is read, and a read of one that was not shows
            // up in the result.
            .map(|s| {
                if p.has_buffer[s] {
                    vec![f64::NAN; p.buffer_len(s)]
                } else {
                    vec![]
                }
            })
            .collect(),
        vars: vec![0; p.var_extents.len()],
        acc: vec![],
        shared: vec![],
        cur: 0,
        forward: None,
    };
    for nest in &p.nests {
        m.cur = nest.stage;
        if let Some(v) = nest.fill {
            m.bufs[nest.stage].iter_mut().for_each(|x| *x = v);
        }
        m.run(&nest.body)?;
    }
    Ok(m.bufs.pop().unwrap_or_default())
}

struct Machine<'a> {
    p: &'a Program,
    inputs: &'a [&'a [f64]],
    bufs: Vec<Vec<f64>>,
    vars: Vec<i64>,
    acc: Vec<Vec<f64>>,
    /// Active shared boxes: input, origin, extents.
    shared: Vec<(usize, Vec<i64>, Vec<usize>)>,
    cur: usize,
    /// In an [`Epilogue`]: the accumulating stage and its value.
    forward: Option<(usize, f64)>,
}

impl Machine<'_> {
    fn run(&mut self, stmts: &[Stmt]) -> Result<(), ExecError> {
        let depth = self.acc.len();
        for s in stmts {
            match s {
                Stmt::For {
                    var, extent, body, ..
                } => {
                    for i in 0..*extent {
                        self.vars[*var] = i as i64;
                        self.run(body)?;
                    }
                }
                Stmt::Let { var, value } => self.vars[*var] = self.int(value)?,
                Stmt::If { cond, body } => {
                    if self.val(cond)? != 0.0 {
                        self.run(body)?;
                    }
                }
                Stmt::Store {
                    stage,
                    index,
                    value,
                    combine,
                } => {
                    let v = self.val(value)?;
                    let flat = self.flat(TensorRef::Stage(*stage), index)?;
                    let dtype = self.p.graph.stages[*stage].dtype;
                    let slot = &mut self.bufs[*stage][flat];
                    *slot = round_to(combine.map_or(v, |op| combine_op(op, *slot, v)), dtype);
                }
                Stmt::AccDecl { size, init, .. } => self.acc.push(vec![*init; *size]),
                Stmt::Shared { boxes, body } => {
                    // Serial threads read global memory directly; what the executor checks is
                    // that every read lies in its box, i.e. that the copy would have served it.
                    let depth = self.shared.len();
                    for b in boxes {
                        let origin = b
                            .origin
                            .iter()
                            .map(|e| self.int(e))
                            .collect::<Result<_, _>>()?;
                        self.shared.push((b.input, origin, b.extents.clone()));
                    }
                    let done = self.run(body);
                    self.shared.truncate(depth);
                    done?;
                }
                Stmt::AccUpdate { index, op, value } => {
                    let v = self.val(value)?;
                    let i = self.int(index)? as usize;
                    let dtype = self.p.graph.stages[self.cur].dtype;
                    let block = self
                        .acc
                        .last_mut()
                        .ok_or(ExecError::OutOfBounds(self.cur))?;
                    let slot = block.get_mut(i).ok_or(ExecError::OutOfBounds(self.cur))?;
                    *slot = round_to(combine_op(*op, *slot, v), dtype);
                }
                Stmt::AccStore {
                    index,
                    stage,
                    dest,
                    combine,
                    epilogue,
                } => {
                    let i = self.int(index)? as usize;
                    let v = *self
                        .acc
                        .last()
                        .and_then(|b| b.get(i))
                        .ok_or(ExecError::OutOfBounds(*stage))?;
                    if let Some(e) = epilogue {
                        // The stage's value (the stored partial sums combined with the
                        // accumulator's, for the last block of a split reduction), rounded as
                        // a store to the stage would.
                        let v = match combine {
                            Some(op) => {
                                let flat = self.flat(TensorRef::Stage(*stage), dest)?;
                                let stored = *self.bufs[*stage]
                                    .get(flat)
                                    .ok_or(ExecError::OutOfBounds(*stage))?;
                                combine_op(*op, stored, v)
                            }
                            None => v,
                        };
                        self.forward =
                            Some((*stage, round_to(v, self.p.graph.stages[*stage].dtype)));
                        let value = self.val(&e.value);
                        self.forward = None;
                        let value = value?;
                        let flat = self.flat(TensorRef::Stage(e.stage), dest)?;
                        let dtype = self.p.graph.stages[e.stage].dtype;
                        self.bufs[e.stage][flat] = round_to(value, dtype);
                        continue;
                    }
                    let flat = self.flat(TensorRef::Stage(*stage), dest)?;
                    let dtype = self.p.graph.stages[*stage].dtype;
                    let slot = &mut self.bufs[*stage][flat];
                    *slot = round_to(combine.map_or(v, |op| combine_op(op, *slot, v)), dtype);
                }
            }
        }
        self.acc.truncate(depth);
        Ok(())
    }

    fn flat(&self, t: TensorRef, index: &[Expr]) -> Result<usize, ExecError> {
        let shape = self.p.graph.shape(t);
        let stage = match t {
            TensorRef::Stage(s) => s,
            TensorRef::Input(_) => self.cur,
        };
        // A folded buffer holds the trailing axes only; the leading ones are still checked.
        let dropped = index.len() - self.p.view(t, index).0.len();
        let mut flat = 0usize;
        for (d, (e, &n)) in index.iter().zip(shape).enumerate() {
            let i = self.int(e)?;
            if i < 0 || i >= n as i64 {
                return Err(ExecError::OutOfBounds(stage));
            }
            if d >= dropped {
                flat = flat * n + i as usize;
            }
        }
        Ok(flat)
    }

    /// A read of input `input` inside a shared scope of it must fall in the box.
    fn check_shared(&self, input: usize, idx: &[Expr]) -> Result<(), ExecError> {
        let Some((_, origin, extents)) = self.shared.iter().rev().find(|b| b.0 == input) else {
            return Ok(());
        };
        for ((e, &o), &n) in idx.iter().zip(origin).zip(extents) {
            let rel = self.int(e)? - o;
            if rel < 0 || rel >= n as i64 {
                return Err(ExecError::OutsideShared(input));
            }
        }
        Ok(())
    }

    fn int(&self, e: &Expr) -> Result<i64, ExecError> {
        Ok(self.val(e)? as i64)
    }

    fn val(&self, e: &Expr) -> Result<f64, ExecError> {
        Ok(match e {
            Expr::Const(v, _) => *v,
            Expr::Axis(v) => self.vars[*v] as f64,
            Expr::Load(TensorRef::Stage(s), _) if self.forward.is_some_and(|(f, _)| f == *s) => {
                self.forward.map_or(0.0, |(_, v)| v)
            }
            Expr::Load(t, idx) => {
                if let TensorRef::Input(i) = t {
                    self.check_shared(*i, idx)?;
                }
                let flat = self.flat(*t, idx)?;
                match t {
                    TensorRef::Input(i) => self.inputs[*i][flat],
                    TensorRef::Stage(s) => {
                        if !self.p.has_buffer[*s] {
                            return Err(ExecError::NoBuffer(*s));
                        }
                        self.bufs[*s][flat]
                    }
                }
            }
            Expr::Unary(op, a) => {
                let x = self.val(a)?;
                match op {
                    UnaryOp::Not => (x == 0.0) as i64 as f64,
                    _ => harl_te::interp::unary_f(*op, x),
                }
            }
            Expr::Binary(op @ (BinaryOp::And | BinaryOp::Or), a, b) => {
                let x = self.val(a)? != 0.0;
                let v = if x == (*op == BinaryOp::Or) {
                    x
                } else {
                    self.val(b)? != 0.0
                };
                v as i64 as f64
            }
            Expr::Binary(op, a, b) => {
                let (x, y) = (self.val(a)?, self.val(b)?);
                let int = is_int(a);
                match op {
                    BinaryOp::Add => x + y,
                    BinaryOp::Sub => x - y,
                    BinaryOp::Mul => x * y,
                    BinaryOp::Div if int => {
                        if y == 0.0 {
                            return Err(ExecError::OutOfBounds(self.cur));
                        }
                        (x as i64 / y as i64) as f64
                    }
                    BinaryOp::Rem if int => {
                        if y == 0.0 {
                            return Err(ExecError::OutOfBounds(self.cur));
                        }
                        (x as i64 % y as i64) as f64
                    }
                    BinaryOp::Div => x / y,
                    BinaryOp::Rem => x % y,
                    BinaryOp::Min => x.min(y),
                    BinaryOp::Max => x.max(y),
                    // Matched lazily above; kept exhaustive without a panic.
                    BinaryOp::And => ((x != 0.0) && (y != 0.0)) as i64 as f64,
                    BinaryOp::Or => ((x != 0.0) || (y != 0.0)) as i64 as f64,
                }
            }
            Expr::Cmp(op, a, b) => {
                let (x, y) = (self.val(a)?, self.val(b)?);
                (match op {
                    CmpOp::Eq => x == y,
                    CmpOp::Ne => x != y,
                    CmpOp::Lt => x < y,
                    CmpOp::Le => x <= y,
                    CmpOp::Gt => x > y,
                    CmpOp::Ge => x >= y,
                }) as i64 as f64
            }
            Expr::Select(c, a, b) => {
                if self.val(c)? != 0.0 {
                    self.val(a)?
                } else {
                    self.val(b)?
                }
            }
            Expr::Cast(d, a) => {
                let x = self.val(a)?;
                match d {
                    DType::I32 => x as i32 as f64,
                    DType::F32 => x as f32 as f64,
                    _ => x,
                }
            }
        })
    }
}

/// Whether an expression is integer-typed (axes, int constants and arithmetic on them, i32 loads).
fn is_int(e: &Expr) -> bool {
    match e {
        Expr::Const(_, d) => *d == DType::I32,
        Expr::Axis(_) => true,
        Expr::Load(..) => false,
        Expr::Unary(_, a) | Expr::Binary(_, a, _) => is_int(a),
        Expr::Select(_, a, _) => is_int(a),
        Expr::Cast(d, _) => *d == DType::I32,
        Expr::Cmp(..) => false,
    }
}

fn combine_op(op: ReduceOp, acc: f64, v: f64) -> f64 {
    match op {
        ReduceOp::Sum => acc + v,
        ReduceOp::Max => acc.max(v),
        ReduceOp::Min => acc.min(v),
    }
}
