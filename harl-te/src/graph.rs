//! Te graphs: placeholders and compute stages, their validation and their workload key.

use crate::expr::{BinaryOp, DType, Expr, TensorRef, UnaryOp};
use crate::limits::{
    checked_product, MAX_DOMAIN, MAX_EXPR_DEPTH, MAX_EXPR_NODES, MAX_EXTENT, MAX_INPUTS, MAX_RANK,
    MAX_STAGES, MAX_TENSOR_ELEMS,
};

/// A graph input with a static shape.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Placeholder {
    /// Name, for messages and generated parameter names only.
    pub name: String,
    /// Static shape, row-major.
    pub shape: Vec<usize>,
    /// Element type.
    pub dtype: DType,
    /// A weight: its values stay the same over many calls (a model's parameters), so work that
    /// depends on it alone (a filter copied into a vector-friendly layout) may be done once, in
    /// the generated `prepare`, instead of on every call.
    #[cfg_attr(feature = "serde", serde(default))]
    pub constant: bool,
}

/// How a reduction stage combines values.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum ReduceOp {
    /// Sum, identity 0.
    Sum,
    /// Maximum, identity -inf (or i32::MIN).
    Max,
    /// Minimum, identity +inf (or i32::MAX).
    Min,
}

impl ReduceOp {
    /// The identity element as an f64 (exact for i32).
    pub fn identity(self, dtype: DType) -> f64 {
        match (self, dtype) {
            (ReduceOp::Sum, _) => 0.0,
            (ReduceOp::Max, DType::I32) => i32::MIN as f64,
            (ReduceOp::Min, DType::I32) => i32::MAX as f64,
            (ReduceOp::Max, _) => f64::NEG_INFINITY,
            (ReduceOp::Min, _) => f64::INFINITY,
        }
    }
}

/// The reduce part of a stage: the combining op and the extents of the reduce axes.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Reduction {
    /// How values combine.
    pub op: ReduceOp,
    /// Extent of each reduce axis; these axes follow the spatial ones in `Expr::Axis`.
    pub extents: Vec<usize>,
}

/// One compute stage: `out[spatial] = reduce_{reduce axes} body` (or just `body` without a reduction).
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Stage {
    /// Name, for messages and generated code only.
    pub name: String,
    /// Output shape = extents of the spatial axes.
    pub shape: Vec<usize>,
    /// The reduction, if any.
    pub reduce: Option<Reduction>,
    /// The value of one element (one term of the reduction).
    pub body: Expr,
    /// Element type of the output.
    pub dtype: DType,
}

impl Stage {
    /// Number of spatial axes.
    pub fn n_spatial(&self) -> usize {
        self.shape.len()
    }
    /// Extents of all axes, spatial then reduce.
    pub fn axis_extents(&self) -> Vec<usize> {
        let mut v = self.shape.clone();
        if let Some(r) = &self.reduce {
            v.extend_from_slice(&r.extents);
        }
        v
    }
    /// Number of output elements.
    pub fn size(&self) -> usize {
        self.shape.iter().product()
    }
}

/// A tensor-expression graph; its output is the last stage.
#[derive(Clone, Debug, Default, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub struct Graph {
    /// Inputs, in the order of the kernel's parameters.
    pub inputs: Vec<Placeholder>,
    /// Stages in topological order; a stage loads only inputs and earlier stages.
    pub stages: Vec<Stage>,
}

/// Why a graph is not valid.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum GraphError {
    /// The graph has no stage.
    #[error("the graph has no compute stage")]
    Empty,
    /// A tensor has an empty or zero-sized shape where one is not allowed.
    #[error("tensor `{0}` has a zero extent")]
    ZeroExtent(String),
    /// A stage loads a tensor that does not exist or comes later.
    #[error("stage `{stage}` reads {tensor:?}, which is not defined before it")]
    BadReference {
        /// The stage.
        stage: String,
        /// The reference.
        tensor: TensorRef,
    },
    /// Wrong number of indices.
    #[error("stage `{stage}` indexes `{tensor}` with {got} indices, but it has {want} dimensions")]
    Rank {
        /// The stage.
        stage: String,
        /// The tensor read.
        tensor: String,
        /// Indices given.
        got: usize,
        /// Dimensions.
        want: usize,
    },
    /// A type error.
    #[error("stage `{stage}`: {msg}")]
    Type {
        /// The stage.
        stage: String,
        /// What is wrong.
        msg: String,
    },
    /// An index that can leave the tensor and is not guarded by a select.
    #[error("stage `{stage}` reads `{tensor}` dimension {dim} at indices {lo}..={hi}, outside 0..{extent}; guard it with `select(cond, value, 0.0)`")]
    OutOfBounds {
        /// The stage.
        stage: String,
        /// The tensor read.
        tensor: String,
        /// The dimension.
        dim: usize,
        /// Lowest possible index.
        lo: i64,
        /// Highest possible index.
        hi: i64,
        /// The extent of that dimension.
        extent: usize,
    },
    /// A tensor without dimensions. 0-d tensors are not supported (a scalar is shape `[1]`).
    #[error("tensor `{0}` has no dimensions; a harl tensor has at least one (a scalar is `[1]`)")]
    EmptyShape(String),
    /// A reduction over no axes: its value would be the identity, which is never meant.
    #[error("stage `{0}` reduces over no axes; give at least one reduce extent")]
    EmptyReduction(String),
    /// More dimensions (or reduce axes) than [`MAX_RANK`].
    #[error("tensor `{tensor}` has {rank} {what}, over the limit of {MAX_RANK}")]
    RankLimit {
        /// The tensor or stage.
        tensor: String,
        /// Dimensions or reduce axes it has.
        rank: usize,
        /// "dimensions" or "reduce axes".
        what: &'static str,
    },
    /// An extent over [`MAX_EXTENT`] (axes are i32 values).
    #[error("tensor `{tensor}` has an extent of {extent}, over the limit of {MAX_EXTENT} (axes are i32)")]
    ExtentLimit {
        /// The tensor or stage.
        tensor: String,
        /// The extent.
        extent: usize,
    },
    /// A tensor whose element count overflows or exceeds [`MAX_TENSOR_ELEMS`].
    #[error("tensor `{tensor}` of shape {shape:?} has more than {MAX_TENSOR_ELEMS} elements")]
    TooManyElements {
        /// The tensor.
        tensor: String,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A stage whose iteration domain (spatial times reduce extents) exceeds [`MAX_DOMAIN`].
    #[error("stage `{stage}` iterates over {extents:?}, more than {MAX_DOMAIN} points")]
    DomainLimit {
        /// The stage.
        stage: String,
        /// Its spatial then reduce extents.
        extents: Vec<usize>,
    },
    /// More stages than [`MAX_STAGES`].
    #[error("the graph has {0} stages, over the limit of {MAX_STAGES}")]
    TooManyStages(usize),
    /// More inputs than [`MAX_INPUTS`].
    #[error("the graph has {0} inputs, over the limit of {MAX_INPUTS}")]
    TooManyInputs(usize),
    /// A stage body over [`MAX_EXPR_NODES`] nodes or [`MAX_EXPR_DEPTH`] levels.
    #[error("stage `{stage}`: its expression has more than {limit} {what}")]
    ExprLimit {
        /// The stage.
        stage: String,
        /// "nodes" or "levels of nesting".
        what: &'static str,
        /// The limit passed.
        limit: usize,
    },
    /// A constant that its type cannot hold (a non-finite float, an i32 out of range).
    #[error("stage `{stage}`: the constant {value} is not a valid {} value", dtype.rust_name())]
    BadConst {
        /// The stage.
        stage: String,
        /// The constant as stored.
        value: f64,
        /// Its type.
        dtype: DType,
    },
    /// Integer arithmetic on axes and constants that leaves i32 (the interpreter would wrap, the
    /// emitted code would not).
    #[error("stage `{stage}`: integer arithmetic reaches {lo}..={hi}, outside i32")]
    IntOverflow {
        /// The stage.
        stage: String,
        /// Lowest possible value (clamped to i64).
        lo: i64,
        /// Highest possible value (clamped to i64).
        hi: i64,
    },
    /// An integer division or remainder whose divisor can be zero.
    #[error("stage `{0}` divides an integer by a divisor that can be zero")]
    DivByZero(String),
}

impl Graph {
    /// Shape of a tensor of this graph.
    pub fn shape(&self, t: TensorRef) -> &[usize] {
        match t {
            TensorRef::Input(i) => &self.inputs[i].shape,
            TensorRef::Stage(i) => &self.stages[i].shape,
        }
    }
    /// Element type of a tensor of this graph.
    pub fn dtype(&self, t: TensorRef) -> DType {
        match t {
            TensorRef::Input(i) => self.inputs[i].dtype,
            TensorRef::Stage(i) => self.stages[i].dtype,
        }
    }
    /// Name of a tensor of this graph.
    pub fn name(&self, t: TensorRef) -> &str {
        match t {
            TensorRef::Input(i) => &self.inputs[i].name,
            TensorRef::Stage(i) => &self.stages[i].name,
        }
    }
    /// The output tensor (the last stage).
    pub fn output(&self) -> TensorRef {
        TensorRef::Stage(self.stages.len().saturating_sub(1))
    }
    /// Stages that read stage `s`.
    pub fn consumers(&self, s: usize) -> Vec<usize> {
        (s + 1..self.stages.len())
            .filter(|&c| self.stages[c].body.loads().contains(&TensorRef::Stage(s)))
            .collect()
    }

    /// Floating-point operations of one run (a multiply-add is 2), for GFLOP/s figures: float
    /// arithmetic in each stage body per term, plus one combine per reduction term.
    pub fn flops(&self) -> f64 {
        self.stages
            .iter()
            .map(|s| {
                let mut ops = 0usize;
                s.body.visit(&mut |e| {
                    if matches!(e, Expr::Binary(..) | Expr::Unary(..))
                        && self.expr_dtype(e).is_float()
                    {
                        ops += 1;
                    }
                });
                let red: usize = s.reduce.as_ref().map_or(1, |r| r.extents.iter().product());
                let per = ops + usize::from(s.reduce.is_some());
                (s.size() * red * per) as f64
            })
            .sum()
    }

    /// The type of an expression of this graph (assuming it type-checks).
    pub fn expr_dtype(&self, e: &Expr) -> DType {
        match e {
            Expr::Const(_, d) | Expr::Cast(d, _) => *d,
            Expr::Axis(_) => DType::I32,
            Expr::Load(t, _) => self.dtype(*t),
            Expr::Unary(_, a) | Expr::Binary(_, a, _) | Expr::Select(_, a, _) => self.expr_dtype(a),
            Expr::Cmp(..) => DType::Bool,
        }
    }

    /// Checks limits ([`crate::limits`]), references, ranks, types, constants, integer
    /// arithmetic, and that every unguarded load stays in bounds.
    pub fn validate(&self) -> Result<(), GraphError> {
        if self.stages.is_empty() {
            return Err(GraphError::Empty);
        }
        if self.stages.len() > MAX_STAGES {
            return Err(GraphError::TooManyStages(self.stages.len()));
        }
        if self.inputs.len() > MAX_INPUTS {
            return Err(GraphError::TooManyInputs(self.inputs.len()));
        }
        for p in &self.inputs {
            check_shape(&p.name, &p.shape)?;
        }
        for (si, stage) in self.stages.iter().enumerate() {
            check_shape(&stage.name, &stage.shape)?;
            if let Some(r) = &stage.reduce {
                if r.extents.is_empty() {
                    return Err(GraphError::EmptyReduction(stage.name.clone()));
                }
                if r.extents.len() > MAX_RANK {
                    return Err(GraphError::RankLimit {
                        tensor: stage.name.clone(),
                        rank: r.extents.len(),
                        what: "reduce axes",
                    });
                }
                check_extents(&stage.name, &r.extents)?;
            }
            let ext = stage.axis_extents();
            if checked_product(&ext).is_none_or(|n| n > MAX_DOMAIN) {
                return Err(GraphError::DomainLimit {
                    stage: stage.name.clone(),
                    extents: ext,
                });
            }
            // Bound the body before the recursive checks below walk it.
            check_expr_size(&stage.name, &stage.body)?;
            let checker = Checker {
                graph: self,
                stage: si,
                extents: &ext,
            };
            let ty = checker.check(&stage.body, false)?;
            if ty != stage.dtype || ty == DType::Bool {
                return Err(checker.type_err(format!(
                    "body has type {ty:?} but the stage stores {:?}",
                    stage.dtype
                )));
            }
        }
        Ok(())
    }

    /// The canonical, name-independent key of this workload: structure, shapes and dtypes.
    pub fn workload_key(&self) -> String {
        let mut h = KeyHasher::new();
        h.bytes(b"harl-te-v1");
        h.u64(self.inputs.len() as u64);
        for p in &self.inputs {
            h.u8(p.dtype.tag());
            h.shape(&p.shape);
        }
        h.u64(self.stages.len() as u64);
        for s in &self.stages {
            h.u8(s.dtype.tag());
            h.shape(&s.shape);
            match &s.reduce {
                None => h.u8(0),
                Some(r) => {
                    h.u8(1 + r.op as u8);
                    h.shape(&r.extents);
                }
            }
            h.expr(&s.body);
        }
        // Weights change what the generated code may hoist, so they are part of the workload;
        // a graph without any keeps the key it had before weights existed.
        if self.inputs.iter().any(|p| p.constant) {
            h.bytes(b"constant");
            for p in &self.inputs {
                h.u8(u8::from(p.constant));
            }
        }
        h.finish()
    }
}

/// Rank, extents and element count of one tensor.
fn check_shape(name: &str, shape: &[usize]) -> Result<(), GraphError> {
    if shape.is_empty() {
        return Err(GraphError::EmptyShape(name.to_string()));
    }
    if shape.len() > MAX_RANK {
        return Err(GraphError::RankLimit {
            tensor: name.to_string(),
            rank: shape.len(),
            what: "dimensions",
        });
    }
    check_extents(name, shape)?;
    if checked_product(shape).is_none_or(|n| n > MAX_TENSOR_ELEMS) {
        return Err(GraphError::TooManyElements {
            tensor: name.to_string(),
            shape: shape.to_vec(),
        });
    }
    Ok(())
}

fn check_extents(name: &str, extents: &[usize]) -> Result<(), GraphError> {
    if extents.contains(&0) {
        return Err(GraphError::ZeroExtent(name.to_string()));
    }
    match extents.iter().find(|&&n| n > MAX_EXTENT) {
        Some(&extent) => Err(GraphError::ExtentLimit {
            tensor: name.to_string(),
            extent,
        }),
        None => Ok(()),
    }
}

/// Node count and depth of a body, walked with an explicit stack so that a hostile depth
/// cannot overflow the stack here.
fn check_expr_size(stage: &str, body: &Expr) -> Result<(), GraphError> {
    let limit = |what, limit| GraphError::ExprLimit {
        stage: stage.to_string(),
        what,
        limit,
    };
    let mut stack = vec![(body, 1usize)];
    let mut nodes = 0usize;
    while let Some((e, depth)) = stack.pop() {
        nodes += 1;
        if nodes > MAX_EXPR_NODES {
            return Err(limit("nodes", MAX_EXPR_NODES));
        }
        if depth > MAX_EXPR_DEPTH {
            return Err(limit("levels of nesting", MAX_EXPR_DEPTH));
        }
        match e {
            Expr::Const(..) | Expr::Axis(_) => {}
            Expr::Load(_, idx) => stack.extend(idx.iter().map(|i| (i, depth + 1))),
            Expr::Unary(_, a) | Expr::Cast(_, a) => stack.push((a, depth + 1)),
            Expr::Binary(_, a, b) | Expr::Cmp(_, a, b) => {
                stack.push((a, depth + 1));
                stack.push((b, depth + 1));
            }
            Expr::Select(c, a, b) => {
                stack.push((c, depth + 1));
                stack.push((a, depth + 1));
                stack.push((b, depth + 1));
            }
        }
    }
    Ok(())
}

/// Whether `v` is a value of `dtype`: finite in its float type, an integer within i32.
pub fn const_fits(v: f64, dtype: DType) -> bool {
    match dtype {
        DType::F32 => (v as f32).is_finite(),
        DType::F64 => v.is_finite(),
        DType::I32 => v.fract() == 0.0 && (i32::MIN as f64..=i32::MAX as f64).contains(&v),
        DType::Bool => v == 0.0 || v == 1.0,
    }
}

/// Exact range of an integer expression of axes and constants, or `None` where it depends on
/// loaded values or casts (which the emitted code and the interpreter both treat as i32 data).
pub fn exact_interval(e: &Expr, extents: &[usize]) -> Option<(i128, i128)> {
    Some(match e {
        Expr::Const(v, DType::I32) => (*v as i128, *v as i128),
        Expr::Axis(a) => (0, *extents.get(*a)? as i128 - 1),
        Expr::Unary(UnaryOp::Neg, a) => {
            let (lo, hi) = exact_interval(a, extents)?;
            (hi.saturating_neg(), lo.saturating_neg())
        }
        Expr::Unary(UnaryOp::Abs, a) => {
            let (lo, hi) = exact_interval(a, extents)?;
            if lo >= 0 {
                (lo, hi)
            } else if hi <= 0 {
                (hi.saturating_neg(), lo.saturating_neg())
            } else {
                (0, hi.max(lo.saturating_neg()))
            }
        }
        Expr::Binary(op, a, b) => {
            let (a0, a1) = exact_interval(a, extents)?;
            let (b0, b1) = exact_interval(b, extents)?;
            match op {
                // Saturating: the checker bounds operands to i32 bottom-up, but this is public.
                BinaryOp::Add => (a0.saturating_add(b0), a1.saturating_add(b1)),
                BinaryOp::Sub => (a0.saturating_sub(b1), a1.saturating_sub(b0)),
                BinaryOp::Mul => {
                    let c = [
                        a0.saturating_mul(b0),
                        a0.saturating_mul(b1),
                        a1.saturating_mul(b0),
                        a1.saturating_mul(b1),
                    ];
                    (*c.iter().min()?, *c.iter().max()?)
                }
                // By a positive constant (how indices divide): tight, `/` truncating.
                BinaryOp::Div if b0 == b1 && b0 > 0 => (a0 / b0, a1 / b0),
                BinaryOp::Rem if b0 == b1 && b0 > 0 => {
                    if a0 >= 0 {
                        (0, (b0 - 1).min(a1))
                    } else {
                        (-(b0 - 1), b0 - 1)
                    }
                }
                BinaryOp::Div | BinaryOp::Rem => {
                    if b0 <= 0 && b1 >= 0 {
                        return None;
                    }
                    let m = a0.abs().max(a1.abs());
                    if *op == BinaryOp::Div {
                        (-m, m)
                    } else {
                        let d = b0.abs().max(b1.abs()) - 1;
                        (if a0 < 0 { -d } else { 0 }, if a1 > 0 { d } else { 0 })
                    }
                }
                BinaryOp::Min => (a0.min(b0), a1.min(b1)),
                BinaryOp::Max => (a0.max(b0), a1.max(b1)),
                BinaryOp::And | BinaryOp::Or => return None,
            }
        }
        Expr::Select(_, a, b) => {
            let (a0, a1) = exact_interval(a, extents)?;
            let (b0, b1) = exact_interval(b, extents)?;
            (a0.min(b0), a1.max(b1))
        }
        _ => return None,
    })
}

struct Checker<'a> {
    graph: &'a Graph,
    stage: usize,
    extents: &'a [usize],
}

impl Checker<'_> {
    fn type_err(&self, msg: String) -> GraphError {
        GraphError::Type {
            stage: self.graph.stages[self.stage].name.clone(),
            msg,
        }
    }

    /// An i32 `a op b` (operands already checked): no division by a divisor that can be zero,
    /// and no result outside i32 where the range is known.
    fn check_int(&self, e: &Expr, op: &BinaryOp, b: &Expr) -> Result<(), GraphError> {
        if matches!(op, BinaryOp::Div | BinaryOp::Rem) {
            let zero = match exact_interval(b, self.extents) {
                Some((lo, hi)) => lo <= 0 && hi >= 0,
                // A divisor read from data: only a literal zero is known to be wrong.
                None => matches!(b, Expr::Const(v, _) if *v == 0.0),
            };
            if zero {
                return Err(GraphError::DivByZero(
                    self.graph.stages[self.stage].name.clone(),
                ));
            }
        }
        self.check_range(e)
    }

    fn check_range(&self, e: &Expr) -> Result<(), GraphError> {
        match exact_interval(e, self.extents) {
            Some((lo, hi)) if lo < i32::MIN as i128 || hi > i32::MAX as i128 => {
                Err(GraphError::IntOverflow {
                    stage: self.graph.stages[self.stage].name.clone(),
                    lo: lo.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                    hi: hi.clamp(i64::MIN.into(), i64::MAX.into()) as i64,
                })
            }
            _ => Ok(()),
        }
    }

    /// Type of `e`; `guarded` is true under a select, where loads may be conditional.
    fn check(&self, e: &Expr, guarded: bool) -> Result<DType, GraphError> {
        let stage = || self.graph.stages[self.stage].name.clone();
        Ok(match e {
            Expr::Const(v, d) => {
                if !const_fits(*v, *d) {
                    return Err(GraphError::BadConst {
                        stage: stage(),
                        value: *v,
                        dtype: *d,
                    });
                }
                *d
            }
            Expr::Axis(a) => {
                if *a >= self.extents.len() {
                    return Err(self.type_err(format!("axis {a} does not exist")));
                }
                DType::I32
            }
            Expr::Load(t, idx) => {
                let defined = match *t {
                    TensorRef::Input(i) => i < self.graph.inputs.len(),
                    TensorRef::Stage(i) => i < self.stage,
                };
                if !defined {
                    return Err(GraphError::BadReference {
                        stage: self.graph.stages[self.stage].name.clone(),
                        tensor: *t,
                    });
                }
                let shape = self.graph.shape(*t);
                if idx.len() != shape.len() {
                    return Err(GraphError::Rank {
                        stage: self.graph.stages[self.stage].name.clone(),
                        tensor: self.graph.name(*t).to_string(),
                        got: idx.len(),
                        want: shape.len(),
                    });
                }
                for (d, (i, &n)) in idx.iter().zip(shape).enumerate() {
                    if self.check(i, guarded)? != DType::I32 {
                        return Err(self.type_err(format!(
                            "index {d} of `{}` is not an integer",
                            self.graph.name(*t)
                        )));
                    }
                    if !guarded {
                        let (lo, hi) = interval(i, self.extents);
                        if lo < 0 || hi >= n as i64 {
                            return Err(GraphError::OutOfBounds {
                                stage: self.graph.stages[self.stage].name.clone(),
                                tensor: self.graph.name(*t).to_string(),
                                dim: d,
                                lo,
                                hi,
                                extent: n,
                            });
                        }
                    }
                }
                self.graph.dtype(*t)
            }
            Expr::Unary(op, a) => {
                let t = self.check(a, guarded)?;
                let ok = match op {
                    UnaryOp::Not => t == DType::Bool,
                    UnaryOp::Neg | UnaryOp::Abs => t != DType::Bool,
                    _ => t.is_float(),
                };
                if !ok {
                    return Err(self.type_err(format!("{op:?} does not apply to {t:?}")));
                }
                if t == DType::I32 {
                    self.check_range(e)?;
                }
                t
            }
            Expr::Binary(op, a, b) => {
                let (ta, tb) = (self.check(a, guarded)?, self.check(b, guarded)?);
                if ta != tb {
                    return Err(self.type_err(format!(
                        "{op:?} of {ta:?} and {tb:?}: both sides need the same type (use `as`)"
                    )));
                }
                let logical = matches!(op, BinaryOp::And | BinaryOp::Or);
                if logical != (ta == DType::Bool) {
                    return Err(self.type_err(format!("{op:?} does not apply to {ta:?}")));
                }
                if ta == DType::I32 {
                    self.check_int(e, op, b)?;
                }
                ta
            }
            Expr::Cmp(_, a, b) => {
                let (ta, tb) = (self.check(a, guarded)?, self.check(b, guarded)?);
                if ta != tb || ta == DType::Bool {
                    return Err(self.type_err(format!("cannot compare {ta:?} with {tb:?}")));
                }
                DType::Bool
            }
            Expr::Select(c, a, b) => {
                if self.check(c, guarded)? != DType::Bool {
                    return Err(self.type_err("select condition must be a comparison".into()));
                }
                let (ta, tb) = (self.check(a, true)?, self.check(b, true)?);
                if ta != tb {
                    return Err(
                        self.type_err(format!("select branches have types {ta:?} and {tb:?}"))
                    );
                }
                ta
            }
            Expr::Cast(d, a) => {
                let t = self.check(a, guarded)?;
                if t == DType::Bool || *d == DType::Bool {
                    return Err(self.type_err("cannot cast to or from bool".into()));
                }
                *d
            }
        })
    }
}

/// Conservative integer range of an index expression, given the axis extents: its
/// [`exact_interval`], or a wide range (a quarter of `i64` each way, so sums of two stay
/// representable) where that depends on data.
pub fn interval(e: &Expr, extents: &[usize]) -> (i64, i64) {
    const WIDE: (i64, i64) = (i64::MIN / 4, i64::MAX / 4);
    let clamp = |v: i128| v.clamp(WIDE.0 as i128, WIDE.1 as i128) as i64;
    exact_interval(e, extents).map_or(WIDE, |(lo, hi)| (clamp(lo), clamp(hi)))
}

/// FNV-1a over canonical bytes, twice with different offsets, for a 128-bit key that is stable
/// across Rust versions and platforms (std's hasher is not).
struct KeyHasher(u64, u64);

impl KeyHasher {
    fn new() -> Self {
        KeyHasher(0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142)
    }
    fn u8(&mut self, b: u8) {
        const P: u64 = 0x0000_0100_0000_01b3;
        self.0 = (self.0 ^ b as u64).wrapping_mul(P);
        self.1 = (self.1 ^ (b as u64).rotate_left(3)).wrapping_mul(P);
    }
    fn bytes(&mut self, b: &[u8]) {
        b.iter().for_each(|&x| self.u8(x));
    }
    fn u64(&mut self, v: u64) {
        self.bytes(&v.to_le_bytes());
    }
    fn shape(&mut self, s: &[usize]) {
        self.u64(s.len() as u64);
        s.iter().for_each(|&d| self.u64(d as u64));
    }
    fn expr(&mut self, e: &Expr) {
        match e {
            Expr::Const(v, d) => {
                self.u8(1);
                self.u8(d.tag());
                self.u64(v.to_bits());
            }
            Expr::Axis(a) => {
                self.u8(2);
                self.u64(*a as u64);
            }
            Expr::Load(t, idx) => {
                self.u8(3);
                match t {
                    TensorRef::Input(i) => self.u64(*i as u64),
                    TensorRef::Stage(i) => self.u64(1 << 32 | *i as u64),
                }
                self.u64(idx.len() as u64);
                idx.iter().for_each(|i| self.expr(i));
            }
            Expr::Unary(op, a) => {
                self.u8(4);
                self.u8(*op as u8);
                self.expr(a);
            }
            Expr::Binary(op, a, b) => {
                self.u8(5);
                self.u8(*op as u8);
                self.expr(a);
                self.expr(b);
            }
            Expr::Cmp(op, a, b) => {
                self.u8(6);
                self.u8(*op as u8);
                self.expr(a);
                self.expr(b);
            }
            Expr::Select(c, a, b) => {
                self.u8(7);
                self.expr(c);
                self.expr(a);
                self.expr(b);
            }
            Expr::Cast(d, a) => {
                self.u8(8);
                self.u8(d.tag());
                self.expr(a);
            }
        }
    }
    fn finish(&self) -> String {
        format!("{:016x}{:016x}", self.0, self.1)
    }
}

/// Builds a graph stage by stage; the op library and the DSL both use it.
#[derive(Debug, Default)]
pub struct GraphBuilder {
    graph: Graph,
}

impl GraphBuilder {
    /// An empty graph.
    pub fn new() -> Self {
        Self::default()
    }
    /// Adds a placeholder.
    pub fn input(&mut self, name: &str, shape: &[usize], dtype: DType) -> TensorRef {
        self.placeholder(name, shape, dtype, false)
    }
    /// Adds a weight: a placeholder whose values stay the same over many calls
    /// ([`Placeholder::constant`]).
    pub fn weight(&mut self, name: &str, shape: &[usize], dtype: DType) -> TensorRef {
        self.placeholder(name, shape, dtype, true)
    }
    fn placeholder(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        constant: bool,
    ) -> TensorRef {
        self.graph.inputs.push(Placeholder {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
            constant,
        });
        TensorRef::Input(self.graph.inputs.len() - 1)
    }
    /// Adds an elementwise (no reduction) stage.
    pub fn compute(&mut self, name: &str, shape: &[usize], dtype: DType, body: Expr) -> TensorRef {
        self.push(name, shape, dtype, None, body)
    }
    /// Adds a reduction stage; reduce axes are numbered after the spatial ones.
    pub fn reduce(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        op: ReduceOp,
        extents: &[usize],
        body: Expr,
    ) -> TensorRef {
        let r = Reduction {
            op,
            extents: extents.to_vec(),
        };
        self.push(name, shape, dtype, Some(r), body)
    }
    fn push(
        &mut self,
        name: &str,
        shape: &[usize],
        dtype: DType,
        reduce: Option<Reduction>,
        body: Expr,
    ) -> TensorRef {
        self.graph.stages.push(Stage {
            name: name.to_string(),
            shape: shape.to_vec(),
            reduce,
            body,
            dtype,
        });
        TensorRef::Stage(self.graph.stages.len() - 1)
    }
    /// Shape of a tensor added so far.
    pub fn shape(&self, t: TensorRef) -> Vec<usize> {
        self.graph.shape(t).to_vec()
    }
    /// Element type of a tensor added so far.
    pub fn dtype(&self, t: TensorRef) -> DType {
        self.graph.dtype(t)
    }
    /// The graph so far, for inspection.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }
    /// Validates and returns the graph, in its canonical view: trailing axes that every access
    /// reads contiguously merged where that makes a reduction a product over a long axis
    /// ([`crate::merge::merge_trailing_axes`]; a 1x1 convolution over its flattened pixels).
    /// The view keeps every tensor's elements in order, so buffers and results are unchanged.
    pub fn finish(self) -> Result<Graph, GraphError> {
        self.graph.validate()?;
        Ok(crate::merge::merge_trailing_axes(self.graph))
    }
}

/// `t[idx...]`.
pub fn load(t: TensorRef, idx: impl IntoIterator<Item = Expr>) -> Expr {
    Expr::Load(t, idx.into_iter().collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{MAX_EXPR_DEPTH, MAX_RANK, MAX_STAGES};

    fn copy_graph(shape: &[usize]) -> Graph {
        let mut b = GraphBuilder::new();
        let a = b.input("a", shape, DType::F32);
        let idx = (0..shape.len()).map(Expr::Axis);
        b.compute("out", shape, DType::F32, load(a, idx));
        b.graph().clone()
    }

    #[test]
    fn shapes_over_the_limits_are_typed_errors() {
        let wraps = 1usize << 32;
        assert!(matches!(
            copy_graph(&[wraps, wraps]).validate(),
            Err(GraphError::ExtentLimit { .. })
        ));
        assert!(matches!(
            copy_graph(&[1 << 30, 1 << 30]).validate(),
            Err(GraphError::TooManyElements { .. })
        ));
        assert!(matches!(
            copy_graph(&[]).validate(),
            Err(GraphError::EmptyShape(_))
        ));
        assert!(matches!(
            copy_graph(&[4, 0]).validate(),
            Err(GraphError::ZeroExtent(_))
        ));
        assert!(matches!(
            copy_graph(&[1; MAX_RANK + 1]).validate(),
            Err(GraphError::RankLimit { .. })
        ));
        assert_eq!(copy_graph(&[1; MAX_RANK]).validate(), Ok(()));
        assert_eq!(copy_graph(&[1 << 17, 1 << 17]).validate(), Ok(()));
    }

    #[test]
    fn reductions_are_checked() {
        let reduce = |extents: &[usize]| {
            let mut b = GraphBuilder::new();
            let a = b.input("a", &[4], DType::F32);
            b.reduce(
                "r",
                &[4],
                DType::F32,
                ReduceOp::Sum,
                extents,
                load(a, [Expr::Axis(0)]),
            );
            b.graph().validate()
        };
        assert_eq!(reduce(&[]), Err(GraphError::EmptyReduction("r".into())));
        assert!(matches!(
            reduce(&[1 << 30, 1 << 30]),
            Err(GraphError::DomainLimit { .. })
        ));
        assert!(matches!(reduce(&[0]), Err(GraphError::ZeroExtent(_))));
        assert_eq!(reduce(&[1 << 20, 1 << 20]), Ok(()));
    }

    #[test]
    fn constants_and_integer_arithmetic_are_checked() {
        let body = |e: Expr, dtype: DType| {
            let mut b = GraphBuilder::new();
            b.input("a", &[4], dtype);
            b.compute("s", &[4], dtype, e);
            b.graph().validate()
        };
        let bad = |e, d| matches!(body(e, d), Err(GraphError::BadConst { .. }));
        assert!(bad(Expr::lit(1e39, DType::F32), DType::F32));
        assert!(bad(Expr::lit(f64::NAN, DType::F64), DType::F64));
        assert!(bad(Expr::lit(f64::INFINITY, DType::F64), DType::F64));
        assert!(bad(Expr::lit(2.5, DType::I32), DType::I32));
        assert!(bad(Expr::lit(3e9, DType::I32), DType::I32));
        assert_eq!(body(Expr::lit(3.4e38, DType::F32), DType::F32), Ok(()));
        let big = Expr::Axis(0) * Expr::int(1 << 30) * Expr::int(4);
        assert!(matches!(
            body(big, DType::I32),
            Err(GraphError::IntOverflow { .. })
        ));
        let div = Expr::int(7) / Expr::Axis(0);
        assert_eq!(
            body(div, DType::I32),
            Err(GraphError::DivByZero("s".into()))
        );
        let rem = Expr::int(7) % (Expr::Axis(0) + Expr::int(1));
        assert_eq!(body(rem, DType::I32), Ok(()));
    }

    #[test]
    fn deep_and_wide_bodies_are_bounded_without_recursion() {
        let mut e = Expr::f32(1.0);
        for _ in 0..100_000 {
            e = e + Expr::f32(1.0);
        }
        let mut b = GraphBuilder::new();
        b.input("a", &[4], DType::F32);
        b.compute("s", &[4], DType::F32, e);
        let err = b.graph().validate();
        assert!(matches!(err, Err(GraphError::ExprLimit { .. })), "{err:?}");
        // Dropping a 100k-deep Box chain recurses; leak it rather than overflow the test stack.
        std::mem::forget(b);

        let mut e = Expr::f32(1.0);
        for _ in 0..MAX_EXPR_DEPTH - 1 {
            e = e + Expr::f32(1.0);
        }
        let mut b = GraphBuilder::new();
        b.input("a", &[4], DType::F32);
        b.compute("s", &[4], DType::F32, e);
        assert_eq!(b.graph().validate(), Ok(()));
    }

    #[test]
    fn stage_count_is_bounded() {
        let mut b = GraphBuilder::new();
        let a = b.input("a", &[1], DType::F32);
        for _ in 0..=MAX_STAGES {
            b.compute("s", &[1], DType::F32, load(a, [Expr::Axis(0)]));
        }
        assert_eq!(
            b.graph().validate(),
            Err(GraphError::TooManyStages(MAX_STAGES + 1))
        );
    }
}
