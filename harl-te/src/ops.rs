//! The op library: common tensor operators built on te.
//!
//! Every op takes the [`GraphBuilder`] and [`TensorRef`]s of tensors already added to it, appends
//! one or more stages, and returns the output tensor, so ops compose. All tensors are row-major with
//! static shapes. A bad shape, dtype or parameter is an [`OpError`], never a panic.
//!
//! ```
//! use harl_te::ops::{self, Activation};
//! use harl_te::{interp, DType, GraphBuilder};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut b = GraphBuilder::new();
//! let x = b.input("x", &[2, 3], DType::F32);
//! let w = b.input("w", &[3, 4], DType::F32);
//! let bias = b.input("bias", &[4], DType::F32);
//! // `ops::dense` fuses bias and activation into one epilogue stage; the long way:
//! let mm = ops::matmul(&mut b, x, w, false, false)?;
//! let biased = ops::bias_add(&mut b, mm, bias)?;
//! let y = ops::relu(&mut b, biased)?;
//! let _ = ops::dense(&mut b, x, w, Some(bias), Activation::Relu)?;
//! let g = b.finish()?;
//! assert_eq!(g.shape(y), &[2, 4]);
//! let out = interp::run(&g, &[&[1.0; 6], &[0.5; 12], &[-1.0; 4]])?;
//! assert_eq!(out, vec![0.5; 8]);
//! # Ok(())
//! # }
//! ```
//!
//! Stage names are only for messages and generated code; when a name is already taken in the
//! builder (two `matmul`s in one graph), a suffix `_1`, `_2`, ... is added.

use crate::expr::{BinaryOp, CmpOp, DType, Expr, TensorRef, UnaryOp};
use crate::graph::{interval, load, GraphBuilder, GraphError, ReduceOp};

/// Why an op could not be built.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum OpError {
    /// A tensor reference that the builder does not hold.
    #[error("{op}: argument `{arg}` is {tensor:?}, which this graph builder does not hold")]
    UnknownTensor {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// The reference given.
        tensor: TensorRef,
    },
    /// A tensor with a zero extent.
    #[error("{op}: argument `{arg}` has shape {shape:?}, which has a zero extent")]
    EmptyTensor {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// A tensor of the wrong rank.
    #[error("{op}: argument `{arg}` must be {expected}, but has shape {shape:?}")]
    Rank {
        /// The op.
        op: &'static str,
        /// The argument.
        arg: &'static str,
        /// The expected rank and layout, e.g. `2-D [M, K]`.
        expected: &'static str,
        /// Its shape.
        shape: Vec<usize>,
    },
    /// Two tensors whose shapes do not fit together.
    #[error("{op}: {reason}: `{lhs}` has shape {lhs_shape:?}, `{rhs}` has shape {rhs_shape:?}")]
    ShapeMismatch {
        /// The op.
        op: &'static str,
        /// What does not fit.
        reason: String,
        /// First argument.
        lhs: &'static str,
        /// Its shape.
        lhs_shape: Vec<usize>,
        /// Second argument.
        rhs: &'static str,
        /// Its shape.
        rhs_shape: Vec<usize>,
    },
    /// Two tensors of different element types.
    #[error("{op}: `{lhs}` is {lhs_dtype:?} but `{rhs}` is {rhs_dtype:?}; cast one first")]
    DTypeMismatch {
        /// The op.
        op: &'static str,
        /// First argument.
        lhs: &'static str,
        /// Its type.
        lhs_dtype: DType,
        /// Second argument.
        rhs: &'static str,
        /// Its type.
        rhs_dtype: DType,
    },
    /// An element type the op does not support.
    #[error("{op}: element type {dtype:?} is not supported (expected {expected})")]
    UnsupportedDType {
        /// The op.
        op: &'static str,
        /// The type given.
        dtype: DType,
        /// What the op accepts.
        expected: &'static str,
    },
    /// An axis outside the tensor.
    #[error("{op}: axis {axis} is out of range for a tensor of shape {shape:?}")]
    Axis {
        /// The op.
        op: &'static str,
        /// The axis given.
        axis: isize,
        /// The tensor's shape.
        shape: Vec<usize>,
    },
    /// A bad parameter (stride 0, groups not dividing the channels, sizes beyond i32 indexing...).
    #[error("{op}: {msg}")]
    InvalidParam {
        /// The op.
        op: &'static str,
        /// What is wrong.
        msg: String,
    },
    /// The finished graph did not validate (a workload constructor).
    #[error("the built graph is invalid: {0}")]
    Graph(#[from] GraphError),
}

/// Result of an op: the output tensor.
pub type OpResult = Result<TensorRef, OpError>;

/// The activation of a [`dense`] layer's epilogue.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Activation {
    /// Identity.
    #[default]
    None,
    /// `max(x, 0)`.
    Relu,
    /// `0.5 * x * (1 + erf(x / sqrt 2))`; floats only.
    Gelu,
    /// `tanh(x)`; floats only.
    Tanh,
}

/// Parameters of [`conv1d`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv1dParams {
    /// Step between output positions (at least 1).
    pub stride: usize,
    /// Zeros added on both sides of the input.
    pub pad: usize,
    /// Spacing between kernel taps (at least 1; 1 is a dense kernel).
    pub dilation: usize,
    /// Channel groups; must divide both C and F. `groups == C` is depthwise.
    pub groups: usize,
}

impl Default for Conv1dParams {
    fn default() -> Self {
        Conv1dParams {
            stride: 1,
            pad: 0,
            dilation: 1,
            groups: 1,
        }
    }
}

/// Parameters of [`conv2d`] and [`conv2d_transpose`], as (height, width) pairs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv2dParams {
    /// Step between output positions (each at least 1).
    pub stride: (usize, usize),
    /// Zeros added on both sides (for the transpose: PyTorch's `padding`, cropped from the output).
    pub pad: (usize, usize),
    /// Spacing between kernel taps (each at least 1).
    pub dilation: (usize, usize),
    /// Channel groups; must divide C (and F for [`conv2d`]). `groups == C` is depthwise.
    pub groups: usize,
}

impl Default for Conv2dParams {
    fn default() -> Self {
        Conv2dParams {
            stride: (1, 1),
            pad: (0, 0),
            dilation: (1, 1),
            groups: 1,
        }
    }
}

/// Parameters of [`conv3d`], as (depth, height, width) triples.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Conv3dParams {
    /// Step between output positions (each at least 1).
    pub stride: (usize, usize, usize),
    /// Zeros added on both sides.
    pub pad: (usize, usize, usize),
    /// Spacing between kernel taps (each at least 1).
    pub dilation: (usize, usize, usize),
    /// Channel groups; must divide both C and F.
    pub groups: usize,
}

impl Default for Conv3dParams {
    fn default() -> Self {
        Conv3dParams {
            stride: (1, 1, 1),
            pad: (0, 0, 0),
            dilation: (1, 1, 1),
            groups: 1,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Helpers

/// Shape and dtype of `t`, checking that the builder holds it and that it has no zero extent.
fn info(
    b: &GraphBuilder,
    op: &'static str,
    arg: &'static str,
    t: TensorRef,
) -> Result<(Vec<usize>, DType), OpError> {
    let g = b.graph();
    let held = match t {
        TensorRef::Input(i) => i < g.inputs.len(),
        TensorRef::Stage(i) => i < g.stages.len(),
    };
    if !held {
        return Err(OpError::UnknownTensor { op, arg, tensor: t });
    }
    let shape = b.shape(t);
    if shape.contains(&0) {
        return Err(OpError::EmptyTensor { op, arg, shape });
    }
    Ok((shape, b.dtype(t)))
}

fn numeric(op: &'static str, dtype: DType) -> Result<(), OpError> {
    match dtype {
        DType::F32 | DType::F64 | DType::I32 => Ok(()),
        DType::Bool => Err(OpError::UnsupportedDType {
            op,
            dtype,
            expected: "f32, f64 or i32",
        }),
    }
}

fn float(op: &'static str, dtype: DType) -> Result<(), OpError> {
    if dtype.is_float() {
        Ok(())
    } else {
        Err(OpError::UnsupportedDType {
            op,
            dtype,
            expected: "f32 or f64",
        })
    }
}

fn same_dtype(
    op: &'static str,
    lhs: &'static str,
    lhs_dtype: DType,
    rhs: &'static str,
    rhs_dtype: DType,
) -> Result<(), OpError> {
    if lhs_dtype == rhs_dtype {
        Ok(())
    } else {
        Err(OpError::DTypeMismatch {
            op,
            lhs,
            lhs_dtype,
            rhs,
            rhs_dtype,
        })
    }
}

fn rank(
    op: &'static str,
    arg: &'static str,
    shape: &[usize],
    want: usize,
    expected: &'static str,
) -> Result<(), OpError> {
    if shape.len() == want {
        Ok(())
    } else {
        Err(OpError::Rank {
            op,
            arg,
            expected,
            shape: shape.to_vec(),
        })
    }
}

fn mismatch(
    op: &'static str,
    reason: String,
    lhs: &'static str,
    lhs_shape: &[usize],
    rhs: &'static str,
    rhs_shape: &[usize],
) -> OpError {
    OpError::ShapeMismatch {
        op,
        reason,
        lhs,
        lhs_shape: lhs_shape.to_vec(),
        rhs,
        rhs_shape: rhs_shape.to_vec(),
    }
}

/// `v` as an index constant, if i32 index arithmetic can hold it.
fn index_const(op: &'static str, what: &str, v: i128) -> Result<i64, OpError> {
    if (0..=i32::MAX as i128).contains(&v) {
        Ok(v as i64)
    } else {
        Err(OpError::InvalidParam {
            op,
            msg: format!("{what} = {v} does not fit i32 index arithmetic"),
        })
    }
}

/// `base`, or `base_1`, `base_2`, ... if a tensor of the builder already has that name.
fn fresh_name(b: &GraphBuilder, base: &str) -> String {
    let g = b.graph();
    let taken =
        |n: &str| g.stages.iter().any(|s| s.name == n) || g.inputs.iter().any(|p| p.name == n);
    if !taken(base) {
        return base.to_string();
    }
    let mut i = 1usize;
    loop {
        let name = format!("{base}_{i}");
        if !taken(&name) {
            return name;
        }
        i += 1;
    }
}

fn ax(n: usize) -> Expr {
    Expr::Axis(n)
}

fn axes(range: std::ops::Range<usize>) -> Vec<Expr> {
    range.map(Expr::Axis).collect()
}

/// `e + k`, written as `e - |k|` for negative `k` and as `e` for zero.
fn offset(e: Expr, k: i64) -> Expr {
    match k.cmp(&0) {
        std::cmp::Ordering::Equal => e,
        std::cmp::Ordering::Greater => e + Expr::int(k),
        std::cmp::Ordering::Less => e - Expr::int(-k),
    }
}

/// `e * k`, written as `e` for one.
fn times(e: Expr, k: i64) -> Expr {
    if k == 1 {
        e
    } else {
        e * Expr::int(k)
    }
}

/// `e / k`, written as `e` for one.
fn divided(e: Expr, k: i64) -> Expr {
    if k == 1 {
        e
    } else {
        e / Expr::int(k)
    }
}

fn and_all(conds: Vec<Expr>) -> Option<Expr> {
    conds.into_iter().reduce(Expr::and)
}

fn zero(dtype: DType) -> Expr {
    Expr::lit(0.0, dtype)
}

/// Normalises a possibly negative (from the end) axis.
fn norm_axis(op: &'static str, axis: isize, shape: &[usize]) -> Result<usize, OpError> {
    let r = shape.len() as isize;
    let a = if axis < 0 { axis + r } else { axis };
    if (0..r).contains(&a) {
        Ok(a as usize)
    } else {
        Err(OpError::Axis {
            op,
            axis,
            shape: shape.to_vec(),
        })
    }
}

/// Index plumbing for a reduction over axis `a` of `shape`.
struct AxisReduction {
    /// Shape of the reduced tensor: `shape` without axis `a` (`[1]` for a 1-D input).
    shape: Vec<usize>,
    /// Indices into the input from a stage over the reduced shape plus one reduce axis.
    input_from_reduced: Vec<Expr>,
    /// Indices into the reduced tensor from a stage over the reduced shape.
    reduced_from_reduced: Vec<Expr>,
    /// Indices into the reduced tensor from an elementwise stage over the input's shape.
    reduced_from_full: Vec<Expr>,
}

fn axis_reduction(shape: &[usize], a: usize) -> AxisReduction {
    let r = shape.len();
    let mut red: Vec<usize> = (0..r).filter(|&d| d != a).map(|d| shape[d]).collect();
    let scalar = red.is_empty();
    if scalar {
        red.push(1);
    }
    let nr = red.len();
    let input_from_reduced = (0..r)
        .map(|d| match d.cmp(&a) {
            std::cmp::Ordering::Less => ax(d),
            std::cmp::Ordering::Equal => ax(nr),
            std::cmp::Ordering::Greater => ax(d - 1),
        })
        .collect();
    let reduced_from_full = if scalar {
        vec![Expr::int(0)]
    } else {
        (0..r).filter(|&d| d != a).map(ax).collect()
    };
    AxisReduction {
        shape: red,
        input_from_reduced,
        reduced_from_reduced: axes(0..nr),
        reduced_from_full,
    }
}

fn activate(op: &'static str, e: Expr, act: Activation, dtype: DType) -> Result<Expr, OpError> {
    Ok(match act {
        Activation::None => e,
        Activation::Relu => e.max(zero(dtype)),
        Activation::Gelu => {
            float(op, dtype)?;
            gelu_expr(e, dtype)
        }
        Activation::Tanh => {
            float(op, dtype)?;
            e.unary(UnaryOp::Tanh)
        }
    })
}

fn gelu_expr(e: Expr, dtype: DType) -> Expr {
    let erf = (e.clone() * Expr::lit(std::f64::consts::FRAC_1_SQRT_2, dtype)).unary(UnaryOp::Erf);
    Expr::lit(0.5, dtype) * e * (Expr::lit(1.0, dtype) + erf)
}

/// An elementwise stage `out[i] = f(x[i])` of type `out_dtype`.
fn map_stage(
    b: &mut GraphBuilder,
    name: &str,
    x: TensorRef,
    shape: &[usize],
    out_dtype: DType,
    f: impl FnOnce(Expr) -> Expr,
) -> TensorRef {
    let body = f(load(x, axes(0..shape.len())));
    let name = fresh_name(b, name);
    b.compute(&name, shape, out_dtype, body)
}

// ---------------------------------------------------------------------------------------------
// Matrix products

fn matmul_impl(
    b: &mut GraphBuilder,
    op: &'static str,
    stage: &str,
    (a, a_arg): (TensorRef, &'static str),
    w: TensorRef,
    (trans_a, trans_b): (bool, bool),
    batched: bool,
) -> OpResult {
    let (sa, da) = info(b, op, a_arg, a)?;
    let (sw, dw) = info(b, op, "w", w)?;
    let nb = usize::from(batched);
    let ea = match (batched, trans_a) {
        (false, false) => "2-D [M, K]",
        (false, true) => "2-D [K, M]",
        (true, false) => "3-D [B, M, K]",
        (true, true) => "3-D [B, K, M]",
    };
    let ew = match (batched, trans_b) {
        (false, false) => "2-D [K, N]",
        (false, true) => "2-D [N, K]",
        (true, false) => "3-D [B, K, N]",
        (true, true) => "3-D [B, N, K]",
    };
    rank(op, a_arg, &sa, nb + 2, ea)?;
    rank(op, "w", &sw, nb + 2, ew)?;
    same_dtype(op, a_arg, da, "w", dw)?;
    numeric(op, da)?;
    if batched && sa[0] != sw[0] {
        return Err(mismatch(
            op,
            format!("batch sizes differ ({} vs {})", sa[0], sw[0]),
            a_arg,
            &sa,
            "w",
            &sw,
        ));
    }
    let (m, ka) = if trans_a {
        (sa[nb + 1], sa[nb])
    } else {
        (sa[nb], sa[nb + 1])
    };
    let (kw, n) = if trans_b {
        (sw[nb + 1], sw[nb])
    } else {
        (sw[nb], sw[nb + 1])
    };
    if ka != kw {
        return Err(mismatch(
            op,
            format!(
                "inner dimensions differ (K = {ka} vs {kw}; trans_a = {trans_a}, trans_b = {trans_b})"
            ),
            a_arg,
            &sa,
            "w",
            &sw,
        ));
    }
    // Axes: [batch,] i, j, then the reduce axis k.
    let (i, j, k) = (ax(nb), ax(nb + 1), ax(nb + 2));
    let mut ia = axes(0..nb);
    let mut iw = axes(0..nb);
    if trans_a {
        ia.extend([k.clone(), i]);
    } else {
        ia.extend([i, k.clone()]);
    }
    if trans_b {
        iw.extend([j, k]);
    } else {
        iw.extend([k, j]);
    }
    let mut shape: Vec<usize> = sa[..nb].to_vec();
    shape.extend([m, n]);
    let name = fresh_name(b, stage);
    Ok(b.reduce(
        &name,
        &shape,
        da,
        ReduceOp::Sum,
        &[ka],
        load(a, ia) * load(w, iw),
    ))
}

/// Matrix product: `a: [M, K]` (or `[K, M]` if `trans_a`) times `w: [K, N]` (or `[N, K]` if `trans_b`)
/// gives `[M, N]`, as one reduce stage named `matmul` (axes i, j, then reduce axis k).
pub fn matmul(
    b: &mut GraphBuilder,
    a: TensorRef,
    w: TensorRef,
    trans_a: bool,
    trans_b: bool,
) -> OpResult {
    matmul_impl(
        b,
        "matmul",
        "matmul",
        (a, "a"),
        w,
        (trans_a, trans_b),
        false,
    )
}

/// Batched matrix product: `a: [B, M, K]` (or `[B, K, M]` if `trans_a`) times `w: [B, K, N]` (or
/// `[B, N, K]` if `trans_b`) gives `[B, M, N]`, as one reduce stage named `batch_matmul`.
pub fn batch_matmul(
    b: &mut GraphBuilder,
    a: TensorRef,
    w: TensorRef,
    trans_a: bool,
    trans_b: bool,
) -> OpResult {
    matmul_impl(
        b,
        "batch_matmul",
        "batch_matmul",
        (a, "a"),
        w,
        (trans_a, trans_b),
        true,
    )
}

/// A fully connected layer: `act(x @ w + bias)`.
///
/// `x` is `[M, K]`; `w` is `[K, N]` (in features by out features, i.e. *not* PyTorch's `[N, K]`
/// `Linear.weight`; transpose that or use [`matmul`] with `trans_b`); `bias`, if any, is `[N]`.
/// Builds a `matmul` reduce stage and then, unless there is neither bias nor activation, ONE
/// elementwise epilogue stage `dense_epilogue` that reads the matmul output at exactly `[i, j]`,
/// so that schedules can fuse it into the reduction.
pub fn dense(
    b: &mut GraphBuilder,
    x: TensorRef,
    w: TensorRef,
    bias: Option<TensorRef>,
    act: Activation,
) -> OpResult {
    const OP: &str = "dense";
    let (sx, dx) = info(b, OP, "x", x)?;
    let (sw, dw) = info(b, OP, "w", w)?;
    rank(OP, "x", &sx, 2, "2-D [M, K]")?;
    rank(OP, "w", &sw, 2, "2-D [K, N]")?;
    same_dtype(OP, "x", dx, "w", dw)?;
    numeric(OP, dx)?;
    // Check the activation's type before adding any stage.
    activate(OP, zero(dx), act, dx)?;
    if let Some(bias) = bias {
        let (sb, db) = info(b, OP, "bias", bias)?;
        same_dtype(OP, "x", dx, "bias", db)?;
        if sb != [sw[1]] {
            return Err(mismatch(
                OP,
                format!("bias must be 1-D [N] with N = {}", sw[1]),
                "w",
                &sw,
                "bias",
                &sb,
            ));
        }
    }
    let mm = matmul_impl(b, OP, "matmul", (x, "x"), w, (false, false), false)?;
    if bias.is_none() && act == Activation::None {
        return Ok(mm);
    }
    let mut v = load(mm, [ax(0), ax(1)]);
    if let Some(bias) = bias {
        v = v + load(bias, [ax(1)]);
    }
    let body = activate(OP, v, act, dx)?;
    let name = fresh_name(b, "dense_epilogue");
    Ok(b.compute(&name, &[sx[0], sw[1]], dx, body))
}

// ---------------------------------------------------------------------------------------------
// Elementwise

fn binary_name(op: BinaryOp) -> &'static str {
    match op {
        BinaryOp::Add => "add",
        BinaryOp::Sub => "sub",
        BinaryOp::Mul => "mul",
        BinaryOp::Div => "div",
        BinaryOp::Rem => "rem",
        BinaryOp::Min => "minimum",
        BinaryOp::Max => "maximum",
        BinaryOp::And => "and",
        BinaryOp::Or => "or",
    }
}

/// Elementwise `op(x, y)` with numpy-style broadcasting: shapes are aligned on the right and an
/// extent of 1 (or a missing leading dimension) stretches to the other side's extent.
///
/// Both sides need the same element type (f32, f64 or i32); `And`/`Or` are rejected since tensors
/// never hold booleans. Integer `Div`/`Rem` follow Rust (truncating). One stage, named after `op`.
pub fn broadcast_binary(
    b: &mut GraphBuilder,
    op: BinaryOp,
    x: TensorRef,
    y: TensorRef,
) -> OpResult {
    broadcast_impl(b, "broadcast_binary", binary_name(op), op, x, y)
}

fn broadcast_impl(
    b: &mut GraphBuilder,
    opname: &'static str,
    stage: &str,
    op: BinaryOp,
    x: TensorRef,
    y: TensorRef,
) -> OpResult {
    let (sx, dx) = info(b, opname, "x", x)?;
    let (sy, dy) = info(b, opname, "y", y)?;
    if matches!(op, BinaryOp::And | BinaryOp::Or) {
        return Err(OpError::InvalidParam {
            op: opname,
            msg: format!("{op:?} needs booleans, which tensors cannot hold"),
        });
    }
    same_dtype(opname, "x", dx, "y", dy)?;
    numeric(opname, dx)?;
    let r = sx.len().max(sy.len());
    let dim = |s: &[usize], d: usize| {
        let lead = r - s.len();
        if d < lead {
            1
        } else {
            s[d - lead]
        }
    };
    let mut shape = Vec::with_capacity(r);
    for d in 0..r {
        let (ex, ey) = (dim(&sx, d), dim(&sy, d));
        shape.push(if ex == ey || ey == 1 {
            ex
        } else if ex == 1 {
            ey
        } else {
            return Err(mismatch(
                opname,
                format!(
                    "cannot broadcast: extents {ex} and {ey} differ at output axis {d} (right-aligned)"
                ),
                "x",
                &sx,
                "y",
                &sy,
            ));
        });
    }
    let index = |s: &[usize]| -> Vec<Expr> {
        let lead = r - s.len();
        s.iter()
            .enumerate()
            .map(|(d, &e)| {
                if e == 1 && shape[d + lead] != 1 {
                    Expr::int(0)
                } else {
                    ax(d + lead)
                }
            })
            .collect()
    };
    let body = load(x, index(&sx)).binary(op, load(y, index(&sy)));
    let name = fresh_name(b, stage);
    Ok(b.compute(&name, &shape, dx, body))
}

/// `x + y`, broadcasting (see [`broadcast_binary`]).
pub fn add(b: &mut GraphBuilder, x: TensorRef, y: TensorRef) -> OpResult {
    broadcast_impl(b, "add", "add", BinaryOp::Add, x, y)
}

/// `x - y`, broadcasting (see [`broadcast_binary`]).
pub fn sub(b: &mut GraphBuilder, x: TensorRef, y: TensorRef) -> OpResult {
    broadcast_impl(b, "sub", "sub", BinaryOp::Sub, x, y)
}

/// `x * y`, broadcasting (see [`broadcast_binary`]).
pub fn mul(b: &mut GraphBuilder, x: TensorRef, y: TensorRef) -> OpResult {
    broadcast_impl(b, "mul", "mul", BinaryOp::Mul, x, y)
}

/// `x / y`, broadcasting (see [`broadcast_binary`]).
pub fn div(b: &mut GraphBuilder, x: TensorRef, y: TensorRef) -> OpResult {
    broadcast_impl(b, "div", "div", BinaryOp::Div, x, y)
}

/// `x + bias` where `bias` is 1-D and matches the last axis of `x` (rank at least 1).
pub fn bias_add(b: &mut GraphBuilder, x: TensorRef, bias: TensorRef) -> OpResult {
    const OP: &str = "bias_add";
    let (sx, _) = info(b, OP, "x", x)?;
    let (sb, _) = info(b, OP, "bias", bias)?;
    if sx.is_empty() {
        return Err(OpError::Rank {
            op: OP,
            arg: "x",
            expected: "at least 1-D [..., N]",
            shape: sx,
        });
    }
    rank(OP, "bias", &sb, 1, "1-D [N]")?;
    if sb[0] != sx[sx.len() - 1] {
        return Err(mismatch(
            OP,
            "the bias length must equal the last extent of x".into(),
            "x",
            &sx,
            "bias",
            &sb,
        ));
    }
    broadcast_impl(b, OP, OP, BinaryOp::Add, x, bias)
}

/// A generic elementwise map `out[i] = f(x[i])`, as one stage named `name` of x's shape and type.
///
/// `f` receives the load `x[i]`; it may use it more than once. If `f` changes the type, the
/// graph fails validation (use [`cast`] for conversions).
pub fn unary(b: &mut GraphBuilder, x: TensorRef, f: impl Fn(Expr) -> Expr, name: &str) -> OpResult {
    let (sx, dx) = info(b, "unary", "x", x)?;
    numeric("unary", dx)?;
    Ok(map_stage(b, name, x, &sx, dx, f))
}

fn unary_op(
    b: &mut GraphBuilder,
    op: &'static str,
    floats_only: bool,
    x: TensorRef,
    f: impl FnOnce(Expr, DType) -> Expr,
) -> OpResult {
    let (sx, dx) = info(b, op, "x", x)?;
    if floats_only {
        float(op, dx)?;
    } else {
        numeric(op, dx)?;
    }
    Ok(map_stage(b, op, x, &sx, dx, |e| f(e, dx)))
}

/// `max(x, 0)`, elementwise (f32, f64, i32).
pub fn relu(b: &mut GraphBuilder, x: TensorRef) -> OpResult {
    unary_op(b, "relu", false, x, |e, d| e.max(zero(d)))
}

/// GELU in its exact erf form, `0.5 * x * (1 + erf(x / sqrt 2))`, elementwise (floats).
pub fn gelu(b: &mut GraphBuilder, x: TensorRef) -> OpResult {
    unary_op(b, "gelu", true, x, gelu_expr)
}

/// `tanh(x)`, elementwise (floats).
pub fn tanh(b: &mut GraphBuilder, x: TensorRef) -> OpResult {
    unary_op(b, "tanh", true, x, |e, _| e.unary(UnaryOp::Tanh))
}

/// `1 / (1 + exp(-x))`, elementwise (floats).
pub fn sigmoid(b: &mut GraphBuilder, x: TensorRef) -> OpResult {
    unary_op(b, "sigmoid", true, x, |e, d| {
        Expr::lit(1.0, d) / (Expr::lit(1.0, d) + (-e).exp())
    })
}

/// `exp(x)`, elementwise (floats).
pub fn exp(b: &mut GraphBuilder, x: TensorRef) -> OpResult {
    unary_op(b, "exp", true, x, |e, _| e.exp())
}

/// `-x`, elementwise (f32, f64, i32).
pub fn neg(b: &mut GraphBuilder, x: TensorRef) -> OpResult {
    unary_op(b, "neg", false, x, |e, _| -e)
}

/// `x * c`, elementwise; for i32 tensors `c` must be an integer within i32.
pub fn scale(b: &mut GraphBuilder, x: TensorRef, c: f64) -> OpResult {
    const OP: &str = "scale";
    let (_, dx) = info(b, OP, "x", x)?;
    if dx == DType::I32 && (c.fract() != 0.0 || !(i32::MIN as f64..=i32::MAX as f64).contains(&c)) {
        return Err(OpError::InvalidParam {
            op: OP,
            msg: format!("factor {c} is not an i32, but x is i32"),
        });
    }
    unary_op(b, OP, false, x, |e, d| e * Expr::lit(c, d))
}

/// `x as dtype`, elementwise, with Rust's `as` semantics (f32, f64, i32 both ways).
pub fn cast(b: &mut GraphBuilder, x: TensorRef, dtype: DType) -> OpResult {
    const OP: &str = "cast";
    let (sx, dx) = info(b, OP, "x", x)?;
    numeric(OP, dx)?;
    numeric(OP, dtype)?;
    Ok(map_stage(b, OP, x, &sx, dtype, |e| e.cast(dtype)))
}

// ---------------------------------------------------------------------------------------------
// Convolutions

struct ConvSpec<'a> {
    op: &'static str,
    x_layout: &'static str,
    w_layout: &'static str,
    stride: &'a [usize],
    pad: &'a [usize],
    dilation: &'a [usize],
    groups: usize,
}

impl ConvSpec<'_> {
    fn check_params(&self) -> Result<(), OpError> {
        let bad = |msg: String| Err(OpError::InvalidParam { op: self.op, msg });
        if self.stride.contains(&0) {
            return bad(format!("stride {:?} must be at least 1", self.stride));
        }
        if self.dilation.contains(&0) {
            return bad(format!("dilation {:?} must be at least 1", self.dilation));
        }
        if self.groups == 0 {
            return bad("groups must be at least 1".into());
        }
        Ok(())
    }
}

/// The zero-padded copy of NC... tensor `x`, as a `pad` stage guarded by a select.
fn pad_stage(
    b: &mut GraphBuilder,
    x: TensorRef,
    sx: &[usize],
    dtype: DType,
    pad: &[usize],
    padded: &[i64],
) -> TensorRef {
    let mut shape = sx[..2].to_vec();
    shape.extend(padded.iter().map(|&p| p as usize));
    let mut idx = vec![ax(0), ax(1)];
    let mut conds = Vec::new();
    for (i, &p) in pad.iter().enumerate() {
        let a = 2 + i;
        let p = p as i64;
        if p > 0 {
            conds.push(ax(a).cmp(CmpOp::Ge, Expr::int(p)));
            conds.push(ax(a).cmp(CmpOp::Lt, Expr::int(p + sx[a] as i64)));
        }
        idx.push(offset(ax(a), -p));
    }
    padded_stage(b, x, idx, conds, &shape, dtype)
}

/// The `pad` stage of `shape`: `x` at `idx` where every one of `conds` holds, zero elsewhere.
fn padded_stage(
    b: &mut GraphBuilder,
    x: TensorRef,
    idx: Vec<Expr>,
    conds: Vec<Expr>,
    shape: &[usize],
    dtype: DType,
) -> TensorRef {
    let body = match and_all(conds) {
        Some(c) => Expr::select(c, load(x, idx), zero(dtype)),
        None => load(x, idx),
    };
    let name = fresh_name(b, "pad");
    b.compute(&name, shape, dtype, body)
}

/// The zero-padded input of a convolution strided by `s` along its last axis, that axis split
/// into its `s` phases: `[N, C, .., s, ceil(Wp / s)]`, phase `q` element `j` holding padded
/// column `j * s + q` (zero past the padded width). Each tap of the convolution then reads
/// one phase contiguously along the output row, instead of every `s`-th element of the row
/// (a gather in every tap's vector load: MobileNet-V2's stride-2 depthwise convolutions).
fn phase_pad_stage(
    b: &mut GraphBuilder,
    x: TensorRef,
    sx: &[usize],
    dtype: DType,
    pad: &[usize],
    padded: &[i64],
    s: usize,
) -> TensorRef {
    let d = pad.len();
    let mut shape = sx[..2].to_vec();
    shape.extend(padded[..d - 1].iter().map(|&p| p as usize));
    let wp = padded[d - 1] as usize;
    shape.push(s);
    shape.push(wp.div_ceil(s));
    let mut idx = vec![ax(0), ax(1)];
    let mut conds = Vec::new();
    for (i, &p) in pad.iter().enumerate() {
        let p = p as i64;
        let (col, len) = if i == d - 1 {
            // The padded column: element `j` (axis d + 2) of phase `q` (axis d + 1).
            (times(ax(d + 2), s as i64) + ax(d + 1), sx[2 + i] as i64)
        } else {
            (ax(2 + i), sx[2 + i] as i64)
        };
        if p > 0 || i == d - 1 {
            conds.push(col.clone().cmp(CmpOp::Ge, Expr::int(p)));
            conds.push(col.clone().cmp(CmpOp::Lt, Expr::int(p + len)));
        }
        idx.push(offset(col, -p));
    }
    padded_stage(b, x, idx, conds, &shape, dtype)
}

/// The index of the input channel: group of output channel `f` times C/groups, plus `rc`.
fn input_channel(groups: usize, f: Expr, fg: i64, cg: i64, rc: Expr) -> Expr {
    if groups == 1 {
        rc
    } else {
        let base = times(divided(f, fg), cg);
        if cg == 1 {
            base
        } else {
            base + rc
        }
    }
}

fn conv_nd(b: &mut GraphBuilder, x: TensorRef, w: TensorRef, spec: ConvSpec<'_>) -> OpResult {
    let op = spec.op;
    let d = spec.stride.len();
    let (sx, dx) = info(b, op, "x", x)?;
    let (sw, dw) = info(b, op, "w", w)?;
    rank(op, "x", &sx, d + 2, spec.x_layout)?;
    rank(op, "w", &sw, d + 2, spec.w_layout)?;
    same_dtype(op, "x", dx, "w", dw)?;
    numeric(op, dx)?;
    spec.check_params()?;
    let (c, f, g) = (sx[1], sw[0], spec.groups);
    if c % g != 0 || f % g != 0 {
        return Err(mismatch(
            op,
            format!(
                "groups = {g} must divide both the input channels C = {c} and the filters F = {f}"
            ),
            "x",
            &sx,
            "w",
            &sw,
        ));
    }
    let (cg, fg) = (c / g, f / g);
    if sw[1] != cg {
        return Err(mismatch(
            op,
            format!("w's dimension 1 must be C / groups = {c} / {g} = {cg}"),
            "x",
            &sx,
            "w",
            &sw,
        ));
    }
    let mut padded = Vec::with_capacity(d);
    let mut out = Vec::with_capacity(d);
    for i in 0..d {
        let (len, k) = (sx[2 + i] as i128, sw[2 + i] as i128);
        let (s, p, dil) = (
            spec.stride[i] as i128,
            spec.pad[i] as i128,
            spec.dilation[i] as i128,
        );
        let pl = index_const(op, "padded input extent", len + 2 * p)?;
        let span = dil * (k - 1) + 1;
        if span > pl as i128 {
            return Err(mismatch(
                op,
                format!(
                    "the dilated kernel spans {span} elements along spatial axis {i}, more than the padded input's {pl}"
                ),
                "x",
                &sx,
                "w",
                &sw,
            ));
        }
        padded.push(pl);
        out.push(((pl as i128 - span) / s + 1) as usize);
    }
    // A depthwise convolution strided along its last axis reads its padded input in phases
    // (see `phase_pad_stage`).
    let last = d - 1;
    let phases = (cg == 1
        && g == c
        && g > 1
        && spec.pad.iter().any(|&p| p > 0)
        && spec.stride[last] > 1
        && spec.dilation[last] == 1)
        .then_some(spec.stride[last]);
    let src = match phases {
        Some(s) => phase_pad_stage(b, x, &sx, dx, spec.pad, &padded, s),
        None if spec.pad.iter().any(|&p| p > 0) => pad_stage(b, x, &sx, dx, spec.pad, &padded),
        None => x,
    };
    // Axes: n, f, o_0..o_d, then reduce axes rc, k_0..k_d.
    let ns = d + 2;
    let rc = ns;
    let cin = input_channel(g, ax(1), fg as i64, cg as i64, ax(rc));
    let mut ix = vec![ax(0), cin];
    let mut iw = vec![ax(1), ax(rc)];
    for i in 0..d {
        let o = times(ax(2 + i), spec.stride[i] as i64);
        let k = times(ax(ns + 1 + i), spec.dilation[i] as i64);
        match phases {
            // Column `o * s + k` of the padded row is phase `k % s`, element `o + k / s`.
            Some(s) if i == last => {
                let s = s as i64;
                ix.push(ax(ns + 1 + i) % Expr::int(s));
                ix.push(ax(2 + i) + divided(ax(ns + 1 + i), s));
            }
            _ => ix.push(o + k),
        }
        iw.push(ax(ns + 1 + i));
    }
    let mut shape = vec![sx[0], f];
    shape.extend(&out);
    let mut extents = vec![cg];
    extents.extend(&sw[2..]);
    let name = fresh_name(b, op);
    Ok(b.reduce(
        &name,
        &shape,
        dx,
        ReduceOp::Sum,
        &extents,
        load(src, ix) * load(w, iw),
    ))
}

/// 1-D convolution (cross-correlation, as in deep-learning frameworks): `x: [N, C, L]`,
/// `w: [F, C/groups, K]` gives `[N, F, Lout]` with
/// `Lout = (L + 2 pad - dilation (K - 1) - 1) / stride + 1`.
///
/// With `pad > 0` a `pad` stage first builds the zero-padded input; the `conv1d` reduce stage has
/// reduce axes (rc, rk). Output channel f belongs to group `f / (F / groups)`.
pub fn conv1d(b: &mut GraphBuilder, x: TensorRef, w: TensorRef, p: Conv1dParams) -> OpResult {
    conv_nd(
        b,
        x,
        w,
        ConvSpec {
            op: "conv1d",
            x_layout: "3-D [N, C, L]",
            w_layout: "3-D [F, C/groups, K]",
            stride: &[p.stride],
            pad: &[p.pad],
            dilation: &[p.dilation],
            groups: p.groups,
        },
    )
}

/// 2-D convolution, NCHW: `x: [N, C, H, W]`, `w: [F, C/groups, KH, KW]` gives `[N, F, Ho, Wo]` with
/// `Ho = (H + 2 pad.0 - dilation.0 (KH - 1) - 1) / stride.0 + 1` (likewise Wo).
///
/// With any pad > 0, a `pad` stage `[N, C, H + 2 pad.0, W + 2 pad.1]` first builds the zero-padded
/// input with a select; the `conv2d` reduce stage then reads it unguarded, with reduce axes
/// (rc, ry, rx). Output channel f belongs to group `f / (F / groups)` and reads input channel
/// `group * (C / groups) + rc`; `groups == C` is a depthwise convolution.
pub fn conv2d(b: &mut GraphBuilder, x: TensorRef, w: TensorRef, p: Conv2dParams) -> OpResult {
    conv_nd(
        b,
        x,
        w,
        ConvSpec {
            op: "conv2d",
            x_layout: "4-D [N, C, H, W]",
            w_layout: "4-D [F, C/groups, KH, KW]",
            stride: &[p.stride.0, p.stride.1],
            pad: &[p.pad.0, p.pad.1],
            dilation: &[p.dilation.0, p.dilation.1],
            groups: p.groups,
        },
    )
}

/// 3-D convolution, NCDHW: `x: [N, C, D, H, W]`, `w: [F, C/groups, KD, KH, KW]` gives
/// `[N, F, Do, Ho, Wo]`; as [`conv2d`] in one more dimension (reduce axes rc, rz, ry, rx).
pub fn conv3d(b: &mut GraphBuilder, x: TensorRef, w: TensorRef, p: Conv3dParams) -> OpResult {
    conv_nd(
        b,
        x,
        w,
        ConvSpec {
            op: "conv3d",
            x_layout: "5-D [N, C, D, H, W]",
            w_layout: "5-D [F, C/groups, KD, KH, KW]",
            stride: &[p.stride.0, p.stride.1, p.stride.2],
            pad: &[p.pad.0, p.pad.1, p.pad.2],
            dilation: &[p.dilation.0, p.dilation.1, p.dilation.2],
            groups: p.groups,
        },
    )
}

/// Transposed 2-D convolution (the gradient of [`conv2d`] with respect to its input), PyTorch's
/// layout: `x: [N, C, H, W]`, `w: [C, F/groups, KH, KW]` gives `[N, F, Ho, Wo]` with
/// `Ho = (H - 1) stride.0 - 2 pad.0 + dilation.0 (KH - 1) + 1` (no output padding).
///
/// Built as one gather-form reduce stage `conv2d_transpose` with reduce axes (rc, ry, rx):
/// `out[n, f, oh, ow] = sum x[n, c, ih, iw] * w[c, f, ry, rx]` where
/// `ih * stride.0 = oh + pad.0 - ry * dilation.0` (likewise iw); terms with no such in-bounds
/// `ih` are skipped by a select that checks non-negativity, bounds and divisibility.
pub fn conv2d_transpose(
    b: &mut GraphBuilder,
    x: TensorRef,
    w: TensorRef,
    p: Conv2dParams,
) -> OpResult {
    conv_transpose_nd(
        b,
        x,
        w,
        ConvSpec {
            op: "conv2d_transpose",
            x_layout: "4-D [N, C, H, W]",
            w_layout: "4-D [C, F/groups, KH, KW]",
            stride: &[p.stride.0, p.stride.1],
            pad: &[p.pad.0, p.pad.1],
            dilation: &[p.dilation.0, p.dilation.1],
            groups: p.groups,
        },
    )
}

fn conv_transpose_nd(
    b: &mut GraphBuilder,
    x: TensorRef,
    w: TensorRef,
    spec: ConvSpec<'_>,
) -> OpResult {
    let op = spec.op;
    let d = spec.stride.len();
    let (sx, dx) = info(b, op, "x", x)?;
    let (sw, dw) = info(b, op, "w", w)?;
    rank(op, "x", &sx, d + 2, spec.x_layout)?;
    rank(op, "w", &sw, d + 2, spec.w_layout)?;
    same_dtype(op, "x", dx, "w", dw)?;
    numeric(op, dx)?;
    spec.check_params()?;
    let (c, g) = (sx[1], spec.groups);
    if sw[0] != c {
        return Err(mismatch(
            op,
            format!("w's dimension 0 must be the input channels C = {c}"),
            "x",
            &sx,
            "w",
            &sw,
        ));
    }
    if c % g != 0 {
        return Err(mismatch(
            op,
            format!("groups = {g} must divide the input channels C = {c}"),
            "x",
            &sx,
            "w",
            &sw,
        ));
    }
    let (cg, fg) = (c / g, sw[1]);
    let f = fg.checked_mul(g).ok_or_else(|| OpError::InvalidParam {
        op,
        msg: "output channel count overflows".into(),
    })?;
    let mut out = Vec::with_capacity(d);
    let mut lims = Vec::with_capacity(d);
    for i in 0..d {
        let (len, k) = (sx[2 + i] as i128, sw[2 + i] as i128);
        let (s, p, dil) = (
            spec.stride[i] as i128,
            spec.pad[i] as i128,
            spec.dilation[i] as i128,
        );
        let o = (len - 1) * s - 2 * p + dil * (k - 1) + 1;
        if o < 1 {
            return Err(mismatch(
                op,
                format!(
                    "the output extent along spatial axis {i} would be {o}; reduce the padding"
                ),
                "x",
                &sx,
                "w",
                &sw,
            ));
        }
        index_const(op, "output extent plus padding", o + p)?;
        index_const(op, "kernel span", dil * (k - 1))?;
        lims.push(index_const(op, "input extent times stride", len * s)?);
        out.push(o as usize);
    }
    let mut shape = vec![sx[0], f];
    shape.extend(&out);
    let mut extents = vec![cg];
    extents.extend(&sw[2..]);
    let all_extents: Vec<usize> = shape.iter().chain(&extents).copied().collect();
    // Axes: n, f, o_0..o_d, then reduce axes rc, k_0..k_d.
    let ns = d + 2;
    let rc = ns;
    let cin = input_channel(g, ax(1), fg as i64, cg as i64, ax(rc));
    let wf = if g == 1 {
        ax(1)
    } else if fg == 1 {
        Expr::int(0)
    } else {
        ax(1) % Expr::int(fg as i64)
    };
    let mut ix = vec![ax(0), cin.clone()];
    let mut iw = vec![cin, wf];
    let mut conds = Vec::new();
    for (i, &lim) in lims.iter().enumerate() {
        let s = spec.stride[i] as i64;
        // t = o + pad - k * dilation; the input position is t / stride when that is exact.
        let t =
            offset(ax(2 + i), spec.pad[i] as i64) - times(ax(ns + 1 + i), spec.dilation[i] as i64);
        let (lo, hi) = interval(&t, &all_extents);
        if lo < 0 {
            conds.push(t.clone().cmp(CmpOp::Ge, Expr::int(0)));
        }
        if hi >= lim {
            conds.push(t.clone().cmp(CmpOp::Lt, Expr::int(lim)));
        }
        if s > 1 {
            conds.push((t.clone() % Expr::int(s)).cmp(CmpOp::Eq, Expr::int(0)));
        }
        ix.push(divided(t, s));
        iw.push(ax(ns + 1 + i));
    }
    let xv = match and_all(conds) {
        Some(cond) => Expr::select(cond, load(x, ix), zero(dx)),
        None => load(x, ix),
    };
    let name = fresh_name(b, op);
    Ok(b.reduce(&name, &shape, dx, ReduceOp::Sum, &extents, xv * load(w, iw)))
}

// ---------------------------------------------------------------------------------------------
// Normalisations

/// Softmax along `axis` (negative counts from the end; -1 is the last axis), floats only.
///
/// Numerically stable: `softmax_max` (max-reduce of x along the axis), `softmax_exp`
/// (`exp(x - max)`), `softmax_sum` (its sum along the axis), `softmax_inv` (`1 / sum`) and the
/// elementwise `softmax` stage `exp(x - max) * inv` of x's shape. The reduced stages have x's
/// shape without the axis (`[1]` for 1-D x). One division a row, not one an element: a vector
/// division costs as much as the rest of an element's work together.
pub fn softmax(b: &mut GraphBuilder, x: TensorRef, axis: isize) -> OpResult {
    const OP: &str = "softmax";
    let (sx, dx) = info(b, OP, "x", x)?;
    float(OP, dx)?;
    let a = norm_axis(OP, axis, &sx)?;
    let l = sx[a];
    let r = axis_reduction(&sx, a);
    let name = fresh_name(b, "softmax_max");
    let m = b.reduce(
        &name,
        &r.shape,
        dx,
        ReduceOp::Max,
        &[l],
        load(x, r.input_from_reduced.clone()),
    );
    // The exponentials are a stage of their own: the sum and the quotient both read them, and
    // computing each once halves the work of a transcendental-bound kernel.
    let full = axes(0..sx.len());
    let shifted = (load(x, full.clone()) - load(m, r.reduced_from_full.clone())).exp();
    let name = fresh_name(b, "softmax_exp");
    let e = b.compute(&name, &sx, dx, shifted);
    let name = fresh_name(b, "softmax_sum");
    let s = b.reduce(
        &name,
        &r.shape,
        dx,
        ReduceOp::Sum,
        &[l],
        load(e, r.input_from_reduced.clone()),
    );
    let name = fresh_name(b, "softmax_inv");
    let inv = b.compute(
        &name,
        &r.shape,
        dx,
        Expr::lit(1.0, dx) / load(s, r.reduced_from_reduced.clone()),
    );
    let body = load(e, full) * load(inv, r.reduced_from_full);
    let name = fresh_name(b, OP);
    Ok(b.compute(&name, &sx, dx, body))
}

/// Layer normalisation over the last axis, floats only:
/// `(x - mean) / sqrt(var + eps) * gamma + beta` with the biased (population) variance.
///
/// `x` is `[..., L]`; `gamma` and `beta` are `[L]`. Three stages: `layer_norm_mean` and
/// `layer_norm_var` (sum-reductions over the last axis, two-pass for stability; shape of x
/// without its last axis, `[1]` for 1-D x) and the elementwise `layer_norm`.
pub fn layer_norm(
    b: &mut GraphBuilder,
    x: TensorRef,
    gamma: TensorRef,
    beta: TensorRef,
    eps: f64,
) -> OpResult {
    const OP: &str = "layer_norm";
    let (sx, dx) = info(b, OP, "x", x)?;
    let (sg, dg) = info(b, OP, "gamma", gamma)?;
    let (sb, db) = info(b, OP, "beta", beta)?;
    float(OP, dx)?;
    same_dtype(OP, "x", dx, "gamma", dg)?;
    same_dtype(OP, "x", dx, "beta", db)?;
    let Some(&l) = sx.last() else {
        return Err(OpError::Rank {
            op: OP,
            arg: "x",
            expected: "at least 1-D [..., L]",
            shape: sx,
        });
    };
    for (arg, s) in [("gamma", &sg), ("beta", &sb)] {
        if s[..] != [l] {
            return Err(mismatch(
                OP,
                format!("`{arg}` must be 1-D [L] with L = {l}, the last extent of x"),
                "x",
                &sx,
                arg,
                s,
            ));
        }
    }
    if !(eps >= 0.0 && eps.is_finite()) {
        return Err(OpError::InvalidParam {
            op: OP,
            msg: format!("eps = {eps} must be finite and non-negative"),
        });
    }
    let a = sx.len() - 1;
    let r = axis_reduction(&sx, a);
    let inv_l = Expr::lit(1.0 / l as f64, dx);
    let name = fresh_name(b, "layer_norm_mean");
    let mean = b.reduce(
        &name,
        &r.shape,
        dx,
        ReduceOp::Sum,
        &[l],
        load(x, r.input_from_reduced.clone()) * inv_l.clone(),
    );
    let dev = load(x, r.input_from_reduced.clone()) - load(mean, r.reduced_from_reduced.clone());
    let name = fresh_name(b, "layer_norm_var");
    let var = b.reduce(
        &name,
        &r.shape,
        dx,
        ReduceOp::Sum,
        &[l],
        dev.clone() * dev * inv_l,
    );
    let norm = (load(x, axes(0..sx.len())) - load(mean, r.reduced_from_full.clone()))
        / (load(var, r.reduced_from_full) + Expr::lit(eps, dx)).unary(UnaryOp::Sqrt);
    let body = norm * load(gamma, [ax(a)]) + load(beta, [ax(a)]);
    let name = fresh_name(b, OP);
    Ok(b.compute(&name, &sx, dx, body))
}

/// Ready-made, validated f32 graphs of common workloads, for the benchmark suite.
///
/// Each returns an error, never panics, on sizes the op rejects.
pub mod workloads {
    use super::{Activation, Conv1dParams, Conv2dParams, Conv3dParams, OpError};
    use crate::expr::DType;
    use crate::graph::{Graph, GraphBuilder};

    const F: DType = DType::F32;

    /// `a: [m, k]` times `b: [k, n]`.
    pub fn matmul(m: usize, k: usize, n: usize) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let a = g.input("a", &[m, k], F);
        let b = g.input("b", &[k, n], F);
        super::matmul(&mut g, a, b, false, false)?;
        Ok(g.finish()?)
    }

    /// `relu(x [m, k] @ w [k, n] + bias [n])`: a matmul and one fused epilogue stage.
    pub fn dense_bias_relu(m: usize, k: usize, n: usize) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("x", &[m, k], F);
        let w = g.input("w", &[k, n], F);
        let bias = g.input("bias", &[n], F);
        super::dense(&mut g, x, w, Some(bias), Activation::Relu)?;
        Ok(g.finish()?)
    }

    /// `a: [b, m, k]` times `w: [b, k, n]`.
    pub fn batch_matmul(b: usize, m: usize, k: usize, n: usize) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let a = g.input("a", &[b, m, k], F);
        let w = g.input("b", &[b, k, n], F);
        super::batch_matmul(&mut g, a, w, false, false)?;
        Ok(g.finish()?)
    }

    /// [`super::conv1d`] of data `[n, c, l]` with weights `[f, c/groups, k]`.
    #[allow(clippy::too_many_arguments)]
    pub fn conv1d(
        n: usize,
        c: usize,
        l: usize,
        f: usize,
        k: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("data", &[n, c, l], F);
        let w = g.input("weight", &[f, c / groups.max(1), k], F);
        let p = Conv1dParams {
            stride,
            pad,
            dilation,
            groups,
        };
        super::conv1d(&mut g, x, w, p)?;
        Ok(g.finish()?)
    }

    /// [`super::conv2d`] of data `[n, c, h, w]` with weights `[f, c/groups, kh, kw]`; stride, pad
    /// and dilation apply to both spatial axes.
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d(
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        f: usize,
        kh: usize,
        kw: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("data", &[n, c, h, w], F);
        let wt = g.input("weight", &[f, c / groups.max(1), kh, kw], F);
        let p = Conv2dParams {
            stride: (stride, stride),
            pad: (pad, pad),
            dilation: (dilation, dilation),
            groups,
        };
        super::conv2d(&mut g, x, wt, p)?;
        Ok(g.finish()?)
    }

    /// Depthwise [`super::conv2d`] (groups = c, one filter per channel): data `[n, c, h, w]`,
    /// weights `[c, 1, kh, kw]`.
    #[allow(clippy::too_many_arguments)]
    pub fn depthwise_conv2d(
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        kh: usize,
        kw: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
    ) -> Result<Graph, OpError> {
        conv2d(n, c, h, w, c, kh, kw, stride, pad, dilation, c)
    }

    /// [`super::conv3d`] of data `[n, c, d, h, w]` with weights `[f, c/groups, kd, kh, kw]`; stride,
    /// pad and dilation apply to all three spatial axes.
    #[allow(clippy::too_many_arguments)]
    pub fn conv3d(
        n: usize,
        c: usize,
        d: usize,
        h: usize,
        w: usize,
        f: usize,
        kd: usize,
        kh: usize,
        kw: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
        groups: usize,
    ) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("data", &[n, c, d, h, w], F);
        let wt = g.input("weight", &[f, c / groups.max(1), kd, kh, kw], F);
        let p = Conv3dParams {
            stride: (stride, stride, stride),
            pad: (pad, pad, pad),
            dilation: (dilation, dilation, dilation),
            groups,
        };
        super::conv3d(&mut g, x, wt, p)?;
        Ok(g.finish()?)
    }

    /// [`super::conv2d_transpose`] of data `[n, c, h, w]` with weights `[c, f, kh, kw]` (groups 1);
    /// stride, pad and dilation apply to both spatial axes.
    #[allow(clippy::too_many_arguments)]
    pub fn conv2d_transpose(
        n: usize,
        c: usize,
        h: usize,
        w: usize,
        f: usize,
        kh: usize,
        kw: usize,
        stride: usize,
        pad: usize,
        dilation: usize,
    ) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("data", &[n, c, h, w], F);
        let wt = g.input("weight", &[c, f, kh, kw], F);
        let p = Conv2dParams {
            stride: (stride, stride),
            pad: (pad, pad),
            dilation: (dilation, dilation),
            groups: 1,
        };
        super::conv2d_transpose(&mut g, x, wt, p)?;
        Ok(g.finish()?)
    }

    /// Softmax over the last axis of x `[rows, cols]`.
    pub fn softmax(rows: usize, cols: usize) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("x", &[rows, cols], F);
        super::softmax(&mut g, x, -1)?;
        Ok(g.finish()?)
    }

    /// Layer norm over the last axis of x `[rows, cols]` with gamma, beta `[cols]` and eps 1e-5.
    pub fn layer_norm(rows: usize, cols: usize) -> Result<Graph, OpError> {
        let mut g = GraphBuilder::new();
        let x = g.input("x", &[rows, cols], F);
        let gamma = g.input("gamma", &[cols], F);
        let beta = g.input("beta", &[cols], F);
        super::layer_norm(&mut g, x, gamma, beta, 1e-5)?;
        Ok(g.finish()?)
    }
}
