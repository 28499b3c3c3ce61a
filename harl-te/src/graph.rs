//! Te graphs: placeholders and compute stages, their validation and their workload key.

use crate::expr::{BinaryOp, DType, Expr, TensorRef, UnaryOp};

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

    /// Checks references, ranks, types, and that every unguarded load stays in bounds.
    pub fn validate(&self) -> Result<(), GraphError> {
        if self.stages.is_empty() {
            return Err(GraphError::Empty);
        }
        for p in &self.inputs {
            if p.shape.contains(&0) {
                return Err(GraphError::ZeroExtent(p.name.clone()));
            }
        }
        for (si, stage) in self.stages.iter().enumerate() {
            let ext = stage.axis_extents();
            if ext.contains(&0) {
                return Err(GraphError::ZeroExtent(stage.name.clone()));
            }
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
        h.finish()
    }
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

    /// Type of `e`; `guarded` is true under a select, where loads may be conditional.
    fn check(&self, e: &Expr, guarded: bool) -> Result<DType, GraphError> {
        Ok(match e {
            Expr::Const(_, d) => *d,
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

/// Conservative integer range of an index expression, given the axis extents.
pub fn interval(e: &Expr, extents: &[usize]) -> (i64, i64) {
    const WIDE: (i64, i64) = (i64::MIN / 4, i64::MAX / 4);
    match e {
        Expr::Const(v, _) => (*v as i64, *v as i64),
        Expr::Axis(a) => (0, extents.get(*a).map_or(0, |&n| n as i64 - 1)),
        Expr::Binary(op, a, b) => {
            let (a0, a1) = interval(a, extents);
            let (b0, b1) = interval(b, extents);
            match op {
                BinaryOp::Add => (a0.saturating_add(b0), a1.saturating_add(b1)),
                BinaryOp::Sub => (a0.saturating_sub(b1), a1.saturating_sub(b0)),
                BinaryOp::Mul => {
                    let c = [
                        a0.saturating_mul(b0),
                        a0.saturating_mul(b1),
                        a1.saturating_mul(b0),
                        a1.saturating_mul(b1),
                    ];
                    (*c.iter().min().unwrap_or(&0), *c.iter().max().unwrap_or(&0))
                }
                BinaryOp::Div if b0 == b1 && b0 > 0 => (a0 / b0, a1 / b0),
                BinaryOp::Rem if b0 == b1 && b0 > 0 => {
                    if a0 >= 0 {
                        (0, (b0 - 1).min(a1))
                    } else {
                        (-(b0 - 1), b0 - 1)
                    }
                }
                BinaryOp::Min => (a0.min(b0), a1.min(b1)),
                BinaryOp::Max => (a0.max(b0), a1.max(b1)),
                _ => WIDE,
            }
        }
        Expr::Unary(UnaryOp::Neg, a) => {
            let (a0, a1) = interval(a, extents);
            (-a1, -a0)
        }
        Expr::Select(_, a, b) => {
            let (a0, a1) = interval(a, extents);
            let (b0, b1) = interval(b, extents);
            (a0.min(b0), a1.max(b1))
        }
        _ => WIDE,
    }
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
        self.graph.inputs.push(Placeholder {
            name: name.to_string(),
            shape: shape.to_vec(),
            dtype,
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
    /// Validates and returns the graph.
    pub fn finish(self) -> Result<Graph, GraphError> {
        self.graph.validate()?;
        Ok(self.graph)
    }
}

/// `t[idx...]`.
pub fn load(t: TensorRef, idx: impl IntoIterator<Item = Expr>) -> Expr {
    Expr::Load(t, idx.into_iter().collect())
}
