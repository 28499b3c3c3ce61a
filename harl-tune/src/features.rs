//! Schedule features: a fixed-length vector that describes a lowered [`Program`] for the cost
//! model, in the spirit of Ansor's per-statement features.
//!
//! [`extract`] walks the loop nests and looks at every innermost statement (`Store`,
//! `AccUpdate`, `AccStore`) with the loops around it. The vector has three parts:
//!
//! - **program** ([`PROGRAM_LEN`] values): operation counts weighted by trip counts (float
//!   add/mul/fma/div/math functions, index arithmetic, selects, ...), bytes accessed and touched,
//!   arithmetic intensity, and the loop structure (nests, loops, guards, the share of the work
//!   that runs parallel, vectorised or unrolled, accumulator blocks);
//! - **statements** (2 x [`STMT_LEN`]): the two heaviest statements (by trip count times float
//!   operations): their loop extents and annotations (vector extent, unrolled extents, parallel
//!   extent and work per parallel iteration), whether the innermost loop carries a dependency on
//!   the written element, and how much of the loop nest fits in L1/L2-sized footprints;
//! - **buffers** ([`MAX_BUFFERS`] x [`BUFFER_LEN`]): per tensor read or written (inputs, stage
//!   buffers, the accumulator block), sorted by bytes touched: innermost stride (broadcast,
//!   contiguous, strided), bytes touched by the innermost 1, 2, 3, 4 and 6 loops (reuse),
//!   unique bytes and cache lines, reuse ratio, and Ansor's reuse distance (the innermost loop
//!   that leaves the access invariant, the iterations and bytes between two uses).
//!
//! Magnitudes go through `log2(1 + x)`; flags are 0/1; counts are small integers. Every name is
//! in [`FEATURE_NAMES`]. Absent statements and buffers are all zeros (their `present` flag
//! included). The vector depends only on the program (deterministic, no hashing of addresses),
//! and every value is finite.
//!
//! Glossary of the less obvious names:
//!
//! - `log_leaf_execs` / `log_trip`: executions of innermost statements (product of the
//!   enclosing loop extents); `log_float_ops` counts an FMA as 2;
//! - `log_int_*`: index arithmetic (in indices, fused-loop `Let`s and guards);
//! - `write_invariant_innermost`: the innermost loop leaves the written element (or
//!   accumulator slot) in place, i.e. it carries a reduction dependency; `n_write_invariant_loops`
//!   counts such loops;
//! - `log_iters_l1_tile` / `log_iters_l2_tile`: iterations of the largest suffix of the loop nest
//!   (innermost loops) whose accesses touch at most 32 KiB / 1 MiB;
//! - `log_bytes_innerK`: bytes touched by the innermost K loops (all accesses for a statement,
//!   one buffer for a buffer block);
//! - `stride_*`, `log_stride_inner`: flat-index stride (elements) along the innermost loop;
//!   `log_stride_varying`: along the innermost loop that moves the access;
//! - `log_reuse_ct`, `log_reuse_dist_iters`, `log_reuse_dist_bytes`: the innermost loop that leaves
//!   the access invariant (its extent), the iterations inside it and the bytes they touch (Ansor's
//!   reuse count and distance); 0 when every loop moves the access;
//! - `log_reuse_ratio`: bytes accessed over unique bytes; `log_intensity_*`: float operations
//!   per unique byte, per accessed byte, per byte of unique cache lines.
//!
//! Footprints come from interval analysis of the index expressions over the loop variables
//! (split parts and fused-loop parts alike), clamped to the tensor's shape; strides from
//! evaluating the flat index with one loop variable at 1. Guards (`If`) are ignored for trip
//! counts (the work is counted as if unguarded) and reported as a share of the work.

use harl_build::loop_ir::{LoopKind, Program, Stmt};
use harl_te::graph::interval;
use harl_te::{BinaryOp, DType, Expr, ReduceOp, TensorRef, UnaryOp};
use std::collections::BTreeMap;

/// Buffers described individually (the rest only count in the program totals).
pub const MAX_BUFFERS: usize = 6;
/// Statements described individually.
pub const MAX_STMTS: usize = 2;
/// Innermost loop counts at which each buffer's footprint is reported.
pub const FOOTPRINT_LOOPS: [usize; 5] = [1, 2, 3, 4, 6];

const LINE_BYTES: f64 = 64.0;
const L1_BYTES: f64 = 32.0 * 1024.0;
const L2_BYTES: f64 = 1024.0 * 1024.0;

macro_rules! prefixed {
    ($p:literal; $($n:literal),* $(,)?) => { [$(concat!($p, $n)),*] };
}

macro_rules! program_names {
    () => {
        prefixed!("prog.";
            "log_float_addsub", "log_float_mul", "log_float_fma", "log_float_div",
            "log_float_math", "log_float_minmax", "log_float_ops", "log_cmp", "log_select",
            "log_cast", "log_logic", "log_int_arith", "log_int_divmod", "log_loads",
            "log_stores", "log_leaf_execs",
            "log_accessed_bytes", "log_unique_bytes", "log_unique_lines",
            "log_intensity_unique", "log_intensity_accessed", "log_intensity_lines",
            "n_nests", "n_leaf_stmts", "n_loops", "max_depth", "n_lets", "n_guards",
            "guarded_work_frac", "parallel_work_frac", "vector_work_frac", "unrolled_work_frac",
            "n_parallel_loops", "log_max_acc_block", "log_acc_decl_execs", "log_acc_init_elems",
            "log_fill_elems", "log_shared_elems",
        )
    };
}

macro_rules! stmt_names {
    ($p:literal) => {
        prefixed!($p;
            "present", "kind_store", "kind_acc_update", "kind_acc_store", "log_trip",
            "log_float_ops", "depth", "log_extent_inner1", "log_extent_inner2",
            "log_extent_inner3", "log_extent_inner4", "log_extent_outer", "log_vec_extent",
            "vec_innermost", "n_unrolled", "log_unroll_prod", "log_unroll_max",
            "log_parallel_extent", "log_work_per_parallel_iter", "write_invariant_innermost",
            "n_write_invariant_loops", "guarded", "n_loads", "log_iters_l1_tile",
            "log_iters_l2_tile", "log_bytes_inner1", "log_bytes_inner2", "log_bytes_inner4",
        )
    };
}

macro_rules! buffer_names {
    ($p:literal) => {
        prefixed!($p;
            "present", "is_input", "is_stage", "is_acc", "read", "written",
            "log_accessed_bytes", "log_unique_bytes", "log_unique_lines", "log_reuse_ratio",
            "stride_broadcast", "stride_contiguous", "stride_strided", "log_stride_inner",
            "log_stride_varying", "log_bytes_inner1", "log_bytes_inner2", "log_bytes_inner3",
            "log_bytes_inner4", "log_bytes_inner6", "log_lines_inner1", "log_reuse_ct",
            "log_reuse_dist_iters", "log_reuse_dist_bytes",
        )
    };
}

/// Values in the program part.
pub const PROGRAM_LEN: usize = program_names!().len();
/// Values per statement block.
pub const STMT_LEN: usize = stmt_names!("").len();
/// Values per buffer block.
pub const BUFFER_LEN: usize = buffer_names!("").len();
/// Length of every feature vector.
pub const FEATURE_LEN: usize = PROGRAM_LEN + MAX_STMTS * STMT_LEN + MAX_BUFFERS * BUFFER_LEN;

/// The name of each feature, in vector order: `prog.*`, then `stmt0.*`, `stmt1.*`, then
/// `buf0.*` .. `buf5.*`.
pub const FEATURE_NAMES: [&str; FEATURE_LEN] = concat_names(&[
    &program_names!(),
    &stmt_names!("stmt0."),
    &stmt_names!("stmt1."),
    &buffer_names!("buf0."),
    &buffer_names!("buf1."),
    &buffer_names!("buf2."),
    &buffer_names!("buf3."),
    &buffer_names!("buf4."),
    &buffer_names!("buf5."),
]);

const _: () = assert!(MAX_STMTS == 2 && MAX_BUFFERS == 6, "update FEATURE_NAMES");

const fn concat_names<const N: usize>(parts: &[&[&'static str]]) -> [&'static str; N] {
    let mut out = [""; N];
    let mut k = 0;
    let mut i = 0;
    while i < parts.len() {
        let mut j = 0;
        while j < parts[i].len() {
            out[k] = parts[i][j];
            k += 1;
            j += 1;
        }
        i += 1;
    }
    assert!(k == N, "feature names do not add up to FEATURE_LEN");
    out
}

/// The feature vector of a lowered program: [`FEATURE_LEN`] finite values, named by
/// [`FEATURE_NAMES`].
pub fn extract(program: &Program) -> Vec<f32> {
    let mut w = Walker::new(program);
    for nest in &program.nests {
        w.nest_stage = nest.stage;
        if nest.fill.is_some() {
            let size = program.graph.stages.get(nest.stage).map_or(0, |s| s.size());
            w.t.fill_elems += size as f64;
        }
        w.walk(&nest.body);
    }
    w.finish()
}

/// `log2(1 + x)` for non-negative magnitudes (negative and NaN map to 0).
fn lg(x: f64) -> f32 {
    if x.is_nan() || x <= 0.0 {
        0.0
    } else {
        (1.0 + x).log2() as f32
    }
}

fn flag(b: bool) -> f32 {
    if b {
        1.0
    } else {
        0.0
    }
}

fn elem_bytes(d: DType) -> f64 {
    match d {
        DType::F64 => 8.0,
        DType::Bool => 1.0,
        _ => 4.0,
    }
}

/// Operation counts (already multiplied by trip counts).
#[derive(Clone, Debug, Default)]
struct Ops {
    fadd: f64,
    fmul: f64,
    ffma: f64,
    fdiv: f64,
    fmath: f64,
    fminmax: f64,
    cmp: f64,
    select: f64,
    cast: f64,
    logic: f64,
    iarith: f64,
    idivmod: f64,
    loads: f64,
}

impl Ops {
    /// Float operations, an FMA counting two.
    fn float_ops(&self) -> f64 {
        self.fadd + self.fmul + 2.0 * self.ffma + self.fdiv + self.fmath + self.fminmax
    }

    fn add(&mut self, o: &Ops) {
        self.fadd += o.fadd;
        self.fmul += o.fmul;
        self.ffma += o.ffma;
        self.fdiv += o.fdiv;
        self.fmath += o.fmath;
        self.fminmax += o.fminmax;
        self.cmp += o.cmp;
        self.select += o.select;
        self.cast += o.cast;
        self.logic += o.logic;
        self.iarith += o.iarith;
        self.idivmod += o.idivmod;
        self.loads += o.loads;
    }

    fn scaled(&self, k: f64) -> Ops {
        Ops {
            fadd: self.fadd * k,
            fmul: self.fmul * k,
            ffma: self.ffma * k,
            fdiv: self.fdiv * k,
            fmath: self.fmath * k,
            fminmax: self.fminmax * k,
            cmp: self.cmp * k,
            select: self.select * k,
            cast: self.cast * k,
            logic: self.logic * k,
            iarith: self.iarith * k,
            idivmod: self.idivmod * k,
            loads: self.loads * k,
        }
    }

    /// Counts the operations of one evaluation of `e`.
    fn count(&mut self, g: &harl_te::Graph, e: &Expr) {
        e.visit(&mut |x| match x {
            Expr::Binary(op, ..) => {
                let dt = g.expr_dtype(x);
                match op {
                    BinaryOp::And | BinaryOp::Or => self.logic += 1.0,
                    _ if dt == DType::Bool => self.logic += 1.0,
                    BinaryOp::Add | BinaryOp::Sub if dt.is_float() => self.fadd += 1.0,
                    BinaryOp::Mul if dt.is_float() => self.fmul += 1.0,
                    BinaryOp::Div | BinaryOp::Rem if dt.is_float() => self.fdiv += 1.0,
                    BinaryOp::Min | BinaryOp::Max if dt.is_float() => self.fminmax += 1.0,
                    BinaryOp::Div | BinaryOp::Rem => self.idivmod += 1.0,
                    _ => self.iarith += 1.0,
                }
            }
            Expr::Unary(op, _) => {
                let dt = g.expr_dtype(x);
                match op {
                    UnaryOp::Not => self.logic += 1.0,
                    UnaryOp::Neg | UnaryOp::Abs if dt.is_float() => self.fadd += 1.0,
                    UnaryOp::Neg | UnaryOp::Abs => self.iarith += 1.0,
                    _ => self.fmath += 1.0,
                }
            }
            Expr::Cmp(..) => self.cmp += 1.0,
            Expr::Select(..) => self.select += 1.0,
            Expr::Cast(..) => self.cast += 1.0,
            Expr::Load(..) => self.loads += 1.0,
            Expr::Const(..) | Expr::Axis(_) => {}
        });
    }

    /// Counts combining `value` into an accumulator with `op` (a sum of a float product is an
    /// FMA, which codegen emits as `mul_add`).
    fn combine(&mut self, g: &harl_te::Graph, op: ReduceOp, value: &Expr) {
        match op {
            ReduceOp::Sum => {
                let is_mul = matches!(value, Expr::Binary(BinaryOp::Mul, ..))
                    && g.expr_dtype(value).is_float();
                if is_mul && self.fmul >= 1.0 {
                    self.fmul -= 1.0;
                    self.ffma += 1.0;
                } else {
                    self.fadd += 1.0;
                }
            }
            ReduceOp::Max | ReduceOp::Min => self.fminmax += 1.0,
        }
    }
}

/// Program-wide totals.
#[derive(Default)]
struct Totals {
    ops: Ops,
    stores: f64,
    leaf_execs: f64,
    n_loops: usize,
    n_lets: usize,
    n_guards: usize,
    n_parallel: usize,
    max_depth: usize,
    max_acc: usize,
    acc_decl_execs: f64,
    acc_init_elems: f64,
    fill_elems: f64,
    /// Elements copied to shared memory (GPU staging), over all executions.
    shared_elems: f64,
}

/// A buffer an access goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum BufKey {
    Input(usize),
    Stage(usize),
    /// The accumulator block of the nest of this stage.
    Acc(usize),
}

/// One access of an innermost statement, analysed.
#[derive(Clone, Debug)]
struct AccessInfo {
    buf: BufKey,
    read: bool,
    write: bool,
    elem: f64,
    /// Executions times element bytes.
    accessed_bytes: f64,
    /// Elements touched by the loops at depth >= l, for l in 0..=depth (last: one execution).
    footprint: Vec<f64>,
    /// Cache lines touched by the loops at depth >= l.
    lines: Vec<f64>,
    /// Stride (elements) along the innermost loop; `None` when not analysable.
    stride_inner: Option<i64>,
    /// Stride along the innermost loop that moves the access.
    stride_varying: Option<i64>,
    /// Whether loop l leaves the access where it is.
    invariant: Vec<bool>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LeafKind {
    Store,
    AccUpdate,
    AccStore,
}

/// One innermost statement with its loops.
#[derive(Clone, Debug)]
struct StmtInfo {
    kind: LeafKind,
    trip: f64,
    /// (extent, kind), outermost first.
    loops: Vec<(usize, LoopKind)>,
    guarded: bool,
    /// Operations of one execution.
    ops: Ops,
    accesses: Vec<AccessInfo>,
}

impl StmtInfo {
    fn depth(&self) -> usize {
        self.loops.len()
    }

    fn weight(&self) -> f64 {
        self.trip * (1.0 + self.ops.float_ops())
    }

    /// Iterations of loops at depth >= l.
    fn iters_inside(&self, l: usize) -> f64 {
        self.loops[l.min(self.depth())..]
            .iter()
            .map(|&(e, _)| e as f64)
            .product()
    }

    /// Bytes touched by all accesses in the loops at depth >= l.
    fn bytes_at(&self, l: usize) -> f64 {
        self.accesses
            .iter()
            .map(|a| a.footprint[l.min(self.depth())] * a.elem)
            .sum()
    }

    /// Iterations of the largest loop suffix whose accesses fit in `cap` bytes.
    fn iters_fitting(&self, cap: f64) -> f64 {
        (0..=self.depth())
            .find(|&l| self.bytes_at(l) <= cap)
            .map_or(1.0, |l| self.iters_inside(l))
    }

    /// The written access (the store destination or the accumulator).
    fn written(&self) -> Option<&AccessInfo> {
        self.accesses.iter().find(|a| a.write)
    }
}

struct Walker<'a> {
    p: &'a Program,
    /// Enclosing loops: (var, extent, kind).
    loops: Vec<(usize, usize, LoopKind)>,
    /// Loop depth each variable is bound at (loop variables and fused parts).
    level: Vec<Option<usize>>,
    /// Active `Let`s, in binding order.
    lets: Vec<(usize, Expr)>,
    guards: usize,
    acc: Vec<usize>,
    nest_stage: usize,
    t: Totals,
    stmts: Vec<StmtInfo>,
}

impl<'a> Walker<'a> {
    fn new(p: &'a Program) -> Self {
        Walker {
            p,
            loops: vec![],
            level: vec![None; p.var_extents.len()],
            lets: vec![],
            guards: 0,
            acc: vec![],
            nest_stage: 0,
            t: Totals::default(),
            stmts: vec![],
        }
    }

    fn trip(&self) -> f64 {
        self.loops.iter().map(|&(_, e, _)| e as f64).product()
    }

    fn bind(&mut self, var: usize, depth: Option<usize>) {
        if var >= self.level.len() {
            self.level.resize(var + 1, None);
        }
        self.level[var] = depth;
    }

    fn walk(&mut self, stmts: &[Stmt]) {
        let (n_lets, n_acc) = (self.lets.len(), self.acc.len());
        for s in stmts {
            match s {
                Stmt::For {
                    var,
                    extent,
                    kind,
                    body,
                } => {
                    self.t.n_loops += 1;
                    if *kind == LoopKind::Parallel {
                        self.t.n_parallel += 1;
                    }
                    self.bind(*var, Some(self.loops.len()));
                    self.loops.push((*var, *extent, *kind));
                    self.t.max_depth = self.t.max_depth.max(self.loops.len());
                    self.walk(body);
                    self.loops.pop();
                    self.bind(*var, None);
                }
                Stmt::Let { var, value } => {
                    self.t.n_lets += 1;
                    let mut o = Ops::default();
                    o.count(&self.p.graph, value);
                    self.t.ops.add(&o.scaled(self.trip()));
                    self.bind(*var, Some(self.loops.len().saturating_sub(1)));
                    self.lets.push((*var, value.clone()));
                }
                Stmt::If { cond, body } => {
                    self.t.n_guards += 1;
                    let mut o = Ops::default();
                    o.count(&self.p.graph, cond);
                    self.t.ops.add(&o.scaled(self.trip()));
                    self.guards += 1;
                    self.walk(body);
                    self.guards -= 1;
                }
                Stmt::Shared { boxes, body } => {
                    // One cooperative copy per block, not per thread.
                    let threads: f64 = self
                        .loops
                        .iter()
                        .filter(|l| l.2 == LoopKind::GpuThread)
                        .map(|l| l.1 as f64)
                        .product();
                    let execs = self.trip() / threads;
                    let elems: usize = boxes.iter().map(|b| b.len()).sum();
                    self.t.shared_elems += execs * elems as f64;
                    self.walk(body);
                }
                Stmt::AccDecl { size, .. } => {
                    let execs = self.trip();
                    self.t.max_acc = self.t.max_acc.max(*size);
                    self.t.acc_decl_execs += execs;
                    self.t.acc_init_elems += execs * *size as f64;
                    self.acc.push(*size);
                }
                Stmt::Store {
                    stage,
                    index,
                    value,
                    combine,
                } => {
                    let mut ops = Ops::default();
                    ops.count(&self.p.graph, value);
                    index.iter().for_each(|i| ops.count(&self.p.graph, i));
                    if let Some(op) = combine {
                        ops.combine(&self.p.graph, *op, value);
                    }
                    let dest = TensorRef::Stage(*stage);
                    let mut acc = self.loads(value);
                    acc.push(self.tensor_access(dest, index, combine.is_some(), true));
                    self.leaf(LeafKind::Store, ops, acc);
                }
                Stmt::AccUpdate { index, op, value } => {
                    let mut ops = Ops::default();
                    ops.count(&self.p.graph, value);
                    ops.count(&self.p.graph, index);
                    ops.combine(&self.p.graph, *op, value);
                    let mut acc = self.loads(value);
                    acc.push(self.acc_access(index, true));
                    self.leaf(LeafKind::AccUpdate, ops, acc);
                }
                Stmt::AccStore {
                    index,
                    stage,
                    dest,
                    combine,
                    epilogue,
                } => {
                    let mut ops = Ops::default();
                    ops.count(&self.p.graph, index);
                    dest.iter().for_each(|i| ops.count(&self.p.graph, i));
                    if combine.is_some() {
                        ops.fadd += 1.0;
                    }
                    let mut acc = vec![self.acc_access(index, false)];
                    let out = match epilogue {
                        // The consumer's work and reads join the write-back's; the producer
                        // is read from the accumulator, not memory.
                        Some(e) => {
                            ops.count(&self.p.graph, &e.value);
                            acc.extend(
                                self.loads(&e.value)
                                    .into_iter()
                                    .filter(|a| a.buf != BufKey::Stage(*stage)),
                            );
                            TensorRef::Stage(e.stage)
                        }
                        None => TensorRef::Stage(*stage),
                    };
                    acc.push(self.tensor_access(out, dest, combine.is_some(), true));
                    self.leaf(LeafKind::AccStore, ops, acc);
                }
            }
        }
        for (var, _) in self.lets.drain(n_lets..).collect::<Vec<_>>() {
            self.bind(var, None);
        }
        self.acc.truncate(n_acc);
    }

    fn loads(&self, value: &Expr) -> Vec<AccessRaw> {
        let mut out = vec![];
        value.visit(&mut |e| {
            if let Expr::Load(t, idx) = e {
                out.push(self.tensor_access(*t, idx, true, false));
            }
        });
        out
    }

    fn tensor_access(&self, t: TensorRef, idx: &[Expr], read: bool, write: bool) -> AccessRaw {
        let g = &self.p.graph;
        AccessRaw {
            buf: match t {
                TensorRef::Input(i) => BufKey::Input(i),
                TensorRef::Stage(s) => BufKey::Stage(s),
            },
            read,
            write,
            elem: elem_bytes(g.dtype(t)),
            shape: g.shape(t).to_vec(),
            index: idx.to_vec(),
        }
    }

    fn acc_access(&self, index: &Expr, write: bool) -> AccessRaw {
        let dtype = self
            .p
            .graph
            .stages
            .get(self.nest_stage)
            .map_or(DType::F32, |s| s.dtype);
        AccessRaw {
            buf: BufKey::Acc(self.nest_stage),
            read: true,
            write,
            elem: elem_bytes(dtype),
            shape: vec![self.acc.last().copied().unwrap_or(1).max(1)],
            index: vec![index.clone()],
        }
    }

    fn leaf(&mut self, kind: LeafKind, ops: Ops, raw: Vec<AccessRaw>) {
        let trip = self.trip();
        self.t.ops.add(&ops.scaled(trip));
        self.t.leaf_execs += trip;
        if kind != LeafKind::AccUpdate {
            self.t.stores += trip;
        }
        let depth = self.loops.len();
        let n_vars = self.level.len();
        let extents = |keep: &dyn Fn(usize) -> bool| -> Vec<usize> {
            (0..n_vars)
                .map(|v| match self.level[v] {
                    Some(l) if keep(l) => self.p.var_extents.get(v).copied().unwrap_or(1),
                    _ => 1,
                })
                .collect()
        };
        // Variables free at depth >= l, and those bound at exactly depth l.
        let inside: Vec<Vec<usize>> = (0..=depth).map(|l| extents(&|b| b >= l)).collect();
        let at: Vec<Vec<usize>> = (0..depth).map(|l| extents(&|b| b == l)).collect();
        let accesses = raw
            .into_iter()
            .map(|r| self.analyse(r, trip, &inside, &at))
            .collect();
        self.stmts.push(StmtInfo {
            kind,
            trip,
            loops: self.loops.iter().map(|&(_, e, k)| (e, k)).collect(),
            guarded: self.guards > 0,
            ops,
            accesses,
        });
    }

    fn analyse(
        &self,
        r: AccessRaw,
        trip: f64,
        inside: &[Vec<usize>],
        at: &[Vec<usize>],
    ) -> AccessInfo {
        let spans = |ext: &[usize]| -> Vec<f64> {
            r.index
                .iter()
                .zip(&r.shape)
                .map(|(e, &n)| {
                    let (lo, hi) = interval(e, ext);
                    let span = hi.saturating_sub(lo).saturating_add(1);
                    span.clamp(1, n.max(1) as i64) as f64
                })
                .collect()
        };
        let mut footprint = Vec::with_capacity(inside.len());
        let mut lines = Vec::with_capacity(inside.len());
        for ext in inside {
            let s = spans(ext);
            footprint.push(s.iter().product::<f64>());
            let (last, rest) = s.split_last().map_or((1.0, &[][..]), |(l, r)| (*l, r));
            let per_row = (last * r.elem / LINE_BYTES).ceil().max(1.0);
            lines.push(rest.iter().product::<f64>() * per_row);
        }
        let invariant: Vec<bool> = at
            .iter()
            .map(|ext| spans(ext).iter().all(|&s| s <= 1.0))
            .collect();
        let depth = at.len();
        let strides: Vec<Option<i64>> = (0..depth).map(|l| self.stride(&r, l)).collect();
        let stride_inner = strides.last().copied().unwrap_or(Some(0));
        let stride_varying = strides
            .iter()
            .rev()
            .find(|s| **s != Some(0))
            .copied()
            .unwrap_or(Some(0));
        AccessInfo {
            buf: r.buf,
            read: r.read,
            write: r.write,
            elem: r.elem,
            accessed_bytes: trip * r.elem,
            footprint,
            lines,
            stride_inner,
            stride_varying,
            invariant,
        }
    }

    /// Flat-index stride of an access along the loop at depth `l`: the index with that loop's
    /// variable at 1 minus the index with it at 0 (every other loop at 0, fused parts derived).
    fn stride(&self, r: &AccessRaw, l: usize) -> Option<i64> {
        let var = self.loops.get(l)?.0;
        let at = |one: bool| -> Option<i64> {
            let mut vals = vec![0i64; self.level.len().max(self.p.var_extents.len())];
            if let Some(v) = vals.get_mut(var) {
                *v = i64::from(one);
            }
            for (lv, value) in &self.lets {
                let x = value.eval_int(&vals)?;
                if let Some(v) = vals.get_mut(*lv) {
                    *v = x;
                }
            }
            let mut flat = 0i64;
            for (e, &n) in r.index.iter().zip(&r.shape) {
                flat = flat
                    .checked_mul(n as i64)?
                    .checked_add(e.eval_int(&vals)?)?;
            }
            Some(flat)
        };
        at(true)?.checked_sub(at(false)?)
    }

    fn finish(self) -> Vec<f32> {
        let mut v = Vec::with_capacity(FEATURE_LEN);
        let buffers = merge_buffers(&self.stmts);
        let t = &self.t;
        let ops = &t.ops;
        let float_ops = ops.float_ops();
        let mem = buffers.iter().filter(|b| !matches!(b.key, BufKey::Acc(_)));
        let (accessed, unique, lines) = mem.fold((0.0, 0.0, 0.0), |(a, u, l), b| {
            (a + b.accessed_bytes, u + b.unique_bytes, l + b.unique_lines)
        });
        let work: f64 = self.stmts.iter().map(|s| s.trip).sum::<f64>().max(1.0);
        let frac = |f: &dyn Fn(&StmtInfo) -> bool| -> f32 {
            (self
                .stmts
                .iter()
                .filter(|s| f(s))
                .map(|s| s.trip)
                .sum::<f64>()
                / work) as f32
        };
        let has = |s: &StmtInfo, k: LoopKind| s.loops.iter().any(|l| l.1 == k);
        let program: [f32; PROGRAM_LEN] = [
            lg(ops.fadd),
            lg(ops.fmul),
            lg(ops.ffma),
            lg(ops.fdiv),
            lg(ops.fmath),
            lg(ops.fminmax),
            lg(float_ops),
            lg(ops.cmp),
            lg(ops.select),
            lg(ops.cast),
            lg(ops.logic),
            lg(ops.iarith),
            lg(ops.idivmod),
            lg(ops.loads),
            lg(t.stores),
            lg(t.leaf_execs),
            lg(accessed),
            lg(unique),
            lg(lines),
            lg(float_ops / unique.max(1.0)),
            lg(float_ops / accessed.max(1.0)),
            lg(float_ops / (lines * LINE_BYTES).max(1.0)),
            self.p.nests.len() as f32,
            self.stmts.len() as f32,
            t.n_loops as f32,
            t.max_depth as f32,
            t.n_lets as f32,
            t.n_guards as f32,
            frac(&|s| s.guarded),
            frac(&|s| has(s, LoopKind::Parallel)),
            frac(&|s| has(s, LoopKind::Vectorized)),
            frac(&|s| has(s, LoopKind::Unrolled)),
            t.n_parallel as f32,
            lg(t.max_acc as f64),
            lg(t.acc_decl_execs),
            lg(t.acc_init_elems),
            lg(t.fill_elems),
            lg(t.shared_elems),
        ];
        v.extend_from_slice(&program);
        // The heaviest statements, heaviest first (stable: program order on ties).
        let mut order: Vec<usize> = (0..self.stmts.len()).collect();
        order.sort_by(|&a, &b| self.stmts[b].weight().total_cmp(&self.stmts[a].weight()));
        for k in 0..MAX_STMTS {
            match order.get(k) {
                Some(&i) => v.extend_from_slice(&stmt_block(&self.stmts[i])),
                None => v.extend_from_slice(&[0.0; STMT_LEN]),
            }
        }
        for k in 0..MAX_BUFFERS {
            match buffers.get(k) {
                Some(b) => v.extend_from_slice(&buffer_block(b)),
                None => v.extend_from_slice(&[0.0; BUFFER_LEN]),
            }
        }
        debug_assert_eq!(v.len(), FEATURE_LEN);
        v.iter_mut().for_each(|x| {
            if !x.is_finite() {
                *x = 0.0;
            }
        });
        v
    }
}

/// An access before analysis.
struct AccessRaw {
    buf: BufKey,
    read: bool,
    write: bool,
    elem: f64,
    shape: Vec<usize>,
    index: Vec<Expr>,
}

/// One buffer over all statements.
struct Buffer<'a> {
    key: BufKey,
    read: bool,
    written: bool,
    accessed_bytes: f64,
    unique_bytes: f64,
    unique_lines: f64,
    /// The access with the most traffic, and the statement it is in.
    main: (&'a AccessInfo, &'a StmtInfo),
}

/// Buffers sorted by bytes touched (then bytes accessed, then buffer order).
fn merge_buffers(stmts: &[StmtInfo]) -> Vec<Buffer<'_>> {
    let mut map: BTreeMap<BufKey, Buffer<'_>> = BTreeMap::new();
    for s in stmts {
        for a in &s.accesses {
            let unique = a.footprint.first().copied().unwrap_or(1.0) * a.elem;
            let lines = a.lines.first().copied().unwrap_or(1.0);
            let b = map.entry(a.buf).or_insert(Buffer {
                key: a.buf,
                read: false,
                written: false,
                accessed_bytes: 0.0,
                unique_bytes: 0.0,
                unique_lines: 0.0,
                main: (a, s),
            });
            b.read |= a.read;
            b.written |= a.write;
            b.accessed_bytes += a.accessed_bytes;
            b.unique_bytes = b.unique_bytes.max(unique);
            b.unique_lines = b.unique_lines.max(lines);
            if a.accessed_bytes > b.main.0.accessed_bytes {
                b.main = (a, s);
            }
        }
    }
    let mut out: Vec<Buffer<'_>> = map.into_values().collect();
    out.sort_by(|a, b| {
        b.unique_bytes
            .total_cmp(&a.unique_bytes)
            .then(b.accessed_bytes.total_cmp(&a.accessed_bytes))
            .then(a.key.cmp(&b.key))
    });
    out
}

fn stmt_block(s: &StmtInfo) -> [f32; STMT_LEN] {
    let d = s.depth();
    let inner = |k: usize| d.checked_sub(k).map_or(0.0, |i| s.loops[i].0 as f64);
    let of_kind = |k: LoopKind| s.loops.iter().filter(move |l| l.1 == k).map(|l| l.0 as f64);
    let vec_ext: f64 = of_kind(LoopKind::Vectorized).product();
    let has_vec = of_kind(LoopKind::Vectorized).next().is_some();
    let n_unrolled = of_kind(LoopKind::Unrolled).count();
    let unroll_prod: f64 = of_kind(LoopKind::Unrolled).product();
    let unroll_max = of_kind(LoopKind::Unrolled).fold(0.0, f64::max);
    let par: f64 = of_kind(LoopKind::Parallel).product();
    let has_par = of_kind(LoopKind::Parallel).next().is_some();
    let written = s.written();
    let inv = written.map_or(&[][..], |w| &w.invariant[..]);
    let loads = s.accesses.iter().filter(|a| a.read && !a.write).count();
    [
        1.0,
        flag(s.kind == LeafKind::Store),
        flag(s.kind == LeafKind::AccUpdate),
        flag(s.kind == LeafKind::AccStore),
        lg(s.trip),
        lg(s.trip * s.ops.float_ops()),
        d as f32,
        lg(inner(1)),
        lg(inner(2)),
        lg(inner(3)),
        lg(inner(4)),
        lg(s.loops.first().map_or(0.0, |l| l.0 as f64)),
        lg(if has_vec { vec_ext } else { 0.0 }),
        flag(s.loops.last().is_some_and(|l| l.1 == LoopKind::Vectorized)),
        n_unrolled as f32,
        lg(if n_unrolled > 0 { unroll_prod } else { 0.0 }),
        lg(unroll_max),
        lg(if has_par { par } else { 0.0 }),
        lg(if has_par { s.trip / par.max(1.0) } else { 0.0 }),
        flag(inv.last().copied().unwrap_or(false)),
        inv.iter().filter(|&&b| b).count() as f32,
        flag(s.guarded),
        loads as f32,
        lg(s.iters_fitting(L1_BYTES)),
        lg(s.iters_fitting(L2_BYTES)),
        lg(s.bytes_at(d.saturating_sub(1))),
        lg(s.bytes_at(d.saturating_sub(2))),
        lg(s.bytes_at(d.saturating_sub(4))),
    ]
}

fn buffer_block(b: &Buffer<'_>) -> [f32; BUFFER_LEN] {
    let (a, s) = b.main;
    let d = s.depth();
    let at_inner = |k: usize| a.footprint[d.saturating_sub(k)] * a.elem;
    let stride_class = |x: Option<i64>| match x {
        Some(0) => 0,
        Some(1 | -1) => 1,
        _ => 2,
    };
    // Magnitude of an unanalysable stride: as bad as the whole buffer.
    let mag = |x: Option<i64>| x.map_or(a.footprint[0], |x| x.unsigned_abs() as f64);
    let class = stride_class(a.stride_inner);
    // Ansor's reuse: the innermost loop that leaves the access invariant.
    let reuse = (0..d).rev().find(|&l| a.invariant[l]);
    let (reuse_ct, reuse_iters, reuse_bytes) = reuse.map_or((0.0, 0.0, 0.0), |l| {
        (
            s.loops[l].0 as f64,
            s.iters_inside(l + 1),
            s.bytes_at(l + 1),
        )
    });
    [
        1.0,
        flag(matches!(b.key, BufKey::Input(_))),
        flag(matches!(b.key, BufKey::Stage(_))),
        flag(matches!(b.key, BufKey::Acc(_))),
        flag(b.read),
        flag(b.written),
        lg(b.accessed_bytes),
        lg(b.unique_bytes),
        lg(b.unique_lines),
        lg(b.accessed_bytes / b.unique_bytes.max(1.0)),
        flag(class == 0),
        flag(class == 1),
        flag(class == 2),
        lg(mag(a.stride_inner)),
        lg(mag(a.stride_varying)),
        lg(at_inner(FOOTPRINT_LOOPS[0])),
        lg(at_inner(FOOTPRINT_LOOPS[1])),
        lg(at_inner(FOOTPRINT_LOOPS[2])),
        lg(at_inner(FOOTPRINT_LOOPS[3])),
        lg(at_inner(FOOTPRINT_LOOPS[4])),
        lg(a.lines[d.saturating_sub(1)]),
        lg(reuse_ct),
        lg(reuse_iters),
        lg(reuse_bytes),
    ]
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use harl_build::lower::lower;
    use harl_build::schedule::{Schedule, Step};
    use harl_te::ops::workloads;

    fn matmul(n: usize) -> harl_te::Graph {
        workloads::matmul(n, n, n).expect("matmul graph")
    }

    /// i, j, k -> io, jo, ko, ii, ki, ji with an 8x16 accumulator, ji vectorised.
    fn tiled() -> Schedule {
        Schedule {
            steps: vec![
                Step::Split {
                    stage: 0,
                    at: 0,
                    factors: vec![8],
                },
                Step::Split {
                    stage: 0,
                    at: 2,
                    factors: vec![16],
                },
                Step::Split {
                    stage: 0,
                    at: 4,
                    factors: vec![4],
                },
                // Loops: io ii jo ji ko ki.
                Step::Reorder {
                    stage: 0,
                    order: vec![0, 2, 4, 1, 5, 3],
                },
                Step::CacheWrite { stage: 0, at: 1 },
                Step::Parallel { stage: 0, at: 0 },
                Step::Unroll { stage: 0, at: 3 },
                Step::Vectorize { stage: 0, at: 5 },
            ],
        }
    }

    /// Random multi-level tilings of matmuls (sizes cycling through a few shapes, some with
    /// non-dividing factors), lowered: schedule-like programs for tests and timings.
    pub(crate) fn random_matmul_programs(n: usize, seed: u64) -> Vec<(usize, Program)> {
        use harl_build::rng::Rng;
        let shapes = [(64, 64, 64), (128, 96, 256), (96, 200, 72), (256, 256, 256)];
        let graphs: Vec<_> = shapes
            .iter()
            .map(|&(m, k, n)| workloads::matmul(m, k, n).expect("graph"))
            .collect();
        let mut rng = Rng::new(seed);
        let mut out = Vec::new();
        let factors = [1, 1, 2, 2, 4, 4, 8, 8, 16, 3, 5];
        let pick = |rng: &mut Rng, cap: usize| -> usize {
            let f = *rng.pick(&factors).unwrap_or(&1);
            f.min(cap).max(1)
        };
        while out.len() < n {
            let task = out.len() % graphs.len();
            let g = &graphs[task];
            let (m, k, nn) = shapes[task];
            let (i1, i2) = (pick(&mut rng, m), pick(&mut rng, m));
            let (j1, j2) = (pick(&mut rng, nn), pick(&mut rng, nn));
            let k1 = pick(&mut rng, k);
            // i0 i1 i2 j0 j1 j2 k0 k1
            let mut steps = vec![
                Step::Split {
                    stage: 0,
                    at: 0,
                    factors: vec![i1, i2],
                },
                Step::Split {
                    stage: 0,
                    at: 3,
                    factors: vec![j1, j2],
                },
                Step::Split {
                    stage: 0,
                    at: 6,
                    factors: vec![k1],
                },
            ];
            // Positions of i0.. in the new order; spatial loops are 0..6.
            let order: Vec<usize> = if rng.chance(0.7) {
                vec![0, 3, 1, 4, 6, 2, 7, 5]
            } else {
                let mut o: Vec<usize> = (0..8).collect();
                for a in (1..8).rev() {
                    o.swap(a, rng.below(a + 1));
                }
                o
            };
            steps.push(Step::Reorder {
                stage: 0,
                order: order.clone(),
            });
            if rng.chance(0.6) {
                steps.push(Step::CacheWrite {
                    stage: 0,
                    at: rng.below(4),
                });
            }
            if order[0] < 6 && rng.chance(0.7) {
                steps.push(Step::Parallel { stage: 0, at: 0 });
            }
            if rng.chance(0.5) {
                steps.push(Step::Unroll {
                    stage: 0,
                    at: 5 + rng.below(2),
                });
            }
            if rng.chance(0.7) {
                steps.push(Step::Vectorize { stage: 0, at: 7 });
            }
            if let Ok(p) = lower(g, &Schedule { steps }) {
                out.push((task, p));
            }
        }
        out
    }

    fn features(g: &harl_te::Graph, s: &Schedule) -> Vec<f32> {
        extract(&lower(g, s).expect("schedule lowers"))
    }

    fn get(v: &[f32], name: &str) -> f32 {
        let i = FEATURE_NAMES
            .iter()
            .position(|n| *n == name)
            .expect("known feature");
        v[i]
    }

    #[test]
    fn names_are_unique_and_cover_the_vector() {
        let mut names = FEATURE_NAMES.to_vec();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), FEATURE_LEN);
        assert!(FEATURE_NAMES.iter().all(|n| !n.is_empty()));
    }

    #[test]
    fn length_is_constant_and_values_finite() {
        let g = matmul(64);
        let graphs = [
            (g.clone(), Schedule::naive()),
            (g, tiled()),
            (
                workloads::dense_bias_relu(33, 17, 40).expect("graph"),
                Schedule::naive(),
            ),
            (workloads::softmax(7, 50).expect("graph"), Schedule::naive()),
        ];
        for (g, s) in &graphs {
            let v = features(g, s);
            assert_eq!(v.len(), FEATURE_LEN);
            assert!(v.iter().all(|x| x.is_finite()), "{v:?}");
        }
    }

    #[test]
    fn default_schedules_give_finite_features() {
        let target = harl_build::default_schedule::CpuTarget::portable();
        let graphs = [
            matmul(96),
            workloads::dense_bias_relu(50, 70, 90).expect("graph"),
            workloads::softmax(13, 77).expect("graph"),
            workloads::layer_norm(9, 64).expect("graph"),
            workloads::batch_matmul(2, 16, 24, 40).expect("graph"),
        ];
        for g in &graphs {
            let s = harl_build::default_schedule::default_schedule(g, &target);
            let v = features(g, &s);
            assert_eq!(v.len(), FEATURE_LEN);
            assert!(v.iter().all(|x| x.is_finite()));
            // Some work is described.
            assert!(get(&v, "prog.log_float_ops") > 0.0);
            assert_eq!(get(&v, "stmt0.present"), 1.0);
        }
    }

    fn close(a: f32, b: f32) -> bool {
        (a - b).abs() < 1e-4
    }

    #[test]
    fn random_schedules_give_distinct_finite_features() {
        let programs = random_matmul_programs(300, 9);
        let mut distinct_programs = Vec::new();
        let mut distinct_features = Vec::new();
        for (_, p) in &programs {
            let v = extract(p);
            assert_eq!(v.len(), FEATURE_LEN);
            assert!(v.iter().all(|x| x.is_finite()));
            if !distinct_programs.contains(&p.nests) {
                distinct_programs.push(p.nests.clone());
            }
            if !distinct_features.contains(&v) {
                distinct_features.push(v);
            }
        }
        // Different loop nests almost always get different vectors.
        assert!(
            distinct_features.len() * 100 >= distinct_programs.len() * 95,
            "{} feature vectors for {} programs",
            distinct_features.len(),
            distinct_programs.len()
        );
    }

    #[test]
    fn naive_and_tiled_matmul_differ_as_expected() {
        let g = matmul(64);
        let naive = features(&g, &Schedule::naive());
        let tiled = features(&g, &tiled());
        assert_ne!(naive, tiled);
        // Same arithmetic: 64^3 multiply-adds either way.
        let fma = (1.0f64 + 64f64.powi(3)).log2() as f32;
        assert!((get(&naive, "prog.log_float_fma") - fma).abs() < 1e-4);
        assert!((get(&tiled, "prog.log_float_fma") - fma).abs() < 1e-4);
        // Annotations.
        assert_eq!(get(&naive, "prog.parallel_work_frac"), 0.0);
        assert_eq!(get(&tiled, "prog.parallel_work_frac"), 1.0);
        assert!(close(get(&tiled, "stmt0.log_vec_extent"), 17f32.log2()));
        assert_eq!(get(&tiled, "stmt0.vec_innermost"), 1.0);
        assert_eq!(get(&tiled, "stmt0.n_unrolled"), 1.0);
        assert_eq!(get(&tiled, "stmt0.kind_acc_update"), 1.0);
        assert_eq!(get(&naive, "stmt0.kind_store"), 1.0);
        assert!(close(get(&tiled, "prog.log_max_acc_block"), 129f32.log2()));
        // Naive i, j, k: the innermost loop (k) reduces into one element.
        assert_eq!(get(&naive, "stmt0.write_invariant_innermost"), 1.0);
        assert_eq!(get(&tiled, "stmt0.write_invariant_innermost"), 0.0);
        // Tiling shrinks what the inner loops touch: far more work fits in L1.
        assert!(get(&tiled, "stmt0.log_iters_l1_tile") > get(&naive, "stmt0.log_iters_l1_tile"));
    }

    #[test]
    fn strides_and_reuse_of_a_naive_matmul() {
        let g = matmul(32);
        let v = features(&g, &Schedule::naive());
        // a, b and c are 4 KiB each; order among ties: by traffic, then inputs first.
        // Naive loop order i, j, k: a[i, k] contiguous along k, b[k, j] strided (32), c[i, j]
        // broadcast (invariant along k).
        let bufs: Vec<(f32, f32, f32, f32)> = (0..MAX_BUFFERS)
            .map(|k| {
                let p = |n: &str| get(&v, &format!("buf{k}.{n}"));
                (
                    p("is_input"),
                    p("stride_broadcast"),
                    p("stride_contiguous"),
                    p("stride_strided"),
                )
            })
            .collect();
        // c (stage 0) has as much traffic (read + write per k) as the inputs and comes after.
        assert_eq!(bufs[0], (1.0, 0.0, 1.0, 0.0), "a: contiguous");
        assert_eq!(bufs[1], (1.0, 0.0, 0.0, 1.0), "b: strided");
        assert_eq!(bufs[2], (0.0, 1.0, 0.0, 0.0), "c: broadcast");
        assert_eq!(get(&v, "buf3.present"), 0.0);
        // c[i, j] is reused across the k loop (32 iterations).
        assert!(close(get(&v, "buf2.log_reuse_ct"), 33f32.log2()));
        // a[i, k] is invariant along j: reused after one k loop (32 iterations).
        assert!(close(get(&v, "buf0.log_reuse_ct"), 33f32.log2()));
        assert!(close(get(&v, "buf0.log_reuse_dist_iters"), 33f32.log2()));
        // Unique bytes: the whole 32x32 f32 tensors.
        assert!(close(get(&v, "buf0.log_unique_bytes"), 4097f32.log2()));
        assert!(close(get(&v, "buf1.log_bytes_inner1"), 129f32.log2()));
    }

    #[test]
    fn deterministic() {
        let g = workloads::dense_bias_relu(48, 32, 64).expect("graph");
        let s = harl_build::default_schedule::default_schedule(
            &g,
            &harl_build::default_schedule::CpuTarget::portable(),
        );
        let p = lower(&g, &s).expect("lowers");
        assert_eq!(extract(&p), extract(&p.clone()));
    }
}
