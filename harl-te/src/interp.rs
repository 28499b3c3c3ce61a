//! The reference interpreter: a naive, obviously-correct evaluation of a te graph.
//!
//! Every kernel harl emits is tested against it. Floats are evaluated in f64 and rounded to the
//! stage's type on store; i32 arithmetic wraps as Rust's release builds do.

use crate::expr::{BinaryOp, CmpOp, DType, Expr, TensorRef, UnaryOp};
use crate::graph::{Graph, ReduceOp};
use std::cell::RefCell;
use std::collections::HashMap;

/// Why the interpreter stopped.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum InterpError {
    /// Input count or length does not match the graph.
    #[error("input {index} has {got} elements, expected {want}")]
    InputLength {
        /// Which input.
        index: usize,
        /// Elements given.
        got: usize,
        /// Elements expected.
        want: usize,
    },
    /// Wrong number of inputs.
    #[error("{got} inputs given, the graph has {want}")]
    InputCount {
        /// Given.
        got: usize,
        /// Expected.
        want: usize,
    },
    /// The graph does not validate.
    #[error("invalid graph: {0}")]
    Graph(#[from] crate::graph::GraphError),
    /// A point asked of [`eval_points`] is not an element of the output.
    #[error("point {index} is outside the output's {size} elements")]
    PointOutOfRange {
        /// The flat index asked for.
        index: usize,
        /// Elements of the output.
        size: usize,
    },
    /// Integer division by zero.
    #[error("stage `{0}` divided an integer by zero")]
    DivByZero(String),
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Value {
    F(f64),
    I(i64),
    B(bool),
}

impl Value {
    fn f(self) -> f64 {
        match self {
            Value::F(v) => v,
            Value::I(v) => v as f64,
            Value::B(b) => b as i64 as f64,
        }
    }
    fn i(self) -> i64 {
        match self {
            Value::F(v) => v as i64,
            Value::I(v) => v,
            Value::B(b) => b as i64,
        }
    }
}

/// Rounds `v` to what a tensor of `dtype` stores.
pub fn round_to(v: f64, dtype: DType) -> f64 {
    match dtype {
        DType::F32 => v as f32 as f64,
        DType::F64 => v,
        DType::I32 => v as i64 as i32 as f64,
        DType::Bool => (v != 0.0) as i64 as f64,
    }
}

/// Evaluates the graph and returns the buffer of every stage (the output is the last).
pub fn run_all(graph: &Graph, inputs: &[&[f64]]) -> Result<Vec<Vec<f64>>, InterpError> {
    check_inputs(graph, inputs)?;
    let mut stages: Vec<Vec<f64>> = Vec::with_capacity(graph.stages.len());
    for (si, stage) in graph.stages.iter().enumerate() {
        let extents = stage.axis_extents();
        let mut out = vec![0.0; stage.size()];
        let mut axes = vec![0i64; extents.len()];
        let ev = Eval {
            graph,
            inputs,
            stages: Buffers(&stages),
            stage: si,
        };
        for (flat, slot) in out.iter_mut().enumerate() {
            *slot = ev.element(flat, &extents, &mut axes)?;
        }
        stages.push(out);
    }
    Ok(stages)
}

/// Evaluates the graph and returns its output.
pub fn run(graph: &Graph, inputs: &[&[f64]]) -> Result<Vec<f64>, InterpError> {
    Ok(run_all(graph, inputs)?.pop().unwrap_or_default())
}

/// The output (last stage) at the given flat, row-major indices, with exactly [`run`]'s values.
///
/// Evaluation is demand-driven: each requested element is computed on its own (its whole
/// reduction), and an earlier stage is evaluated only at the elements that requested ones read,
/// each at most once (memoised). Checking a 1024x1024x1024 matmul at 256 points costs
/// 256 x 1024 multiply-adds instead of 1024^3.
pub fn eval_points(
    graph: &Graph,
    inputs: &[&[f64]],
    points: &[usize],
) -> Result<Vec<f64>, InterpError> {
    check_inputs(graph, inputs)?;
    let last = graph.stages.len() - 1;
    let size = graph.stages[last].size();
    if let Some(&index) = points.iter().find(|&&p| p >= size) {
        return Err(InterpError::PointOutOfRange { index, size });
    }
    let lazy = Lazy {
        graph,
        inputs,
        memo: RefCell::new(vec![HashMap::new(); graph.stages.len()]),
    };
    points.iter().map(|&p| lazy.value(last, p)).collect()
}

/// Validates the graph and the inputs' count and lengths.
fn check_inputs(graph: &Graph, inputs: &[&[f64]]) -> Result<(), InterpError> {
    graph.validate()?;
    if inputs.len() != graph.inputs.len() {
        return Err(InterpError::InputCount {
            got: inputs.len(),
            want: graph.inputs.len(),
        });
    }
    for (index, (buf, p)) in inputs.iter().zip(&graph.inputs).enumerate() {
        let want: usize = p.shape.iter().product();
        if buf.len() != want {
            return Err(InterpError::InputLength {
                index,
                got: buf.len(),
                want,
            });
        }
    }
    Ok(())
}

/// Where loads of earlier stages find their values.
trait StageValues {
    /// Element `flat` of stage `stage`.
    fn value(&self, stage: usize, flat: usize) -> Result<f64, InterpError>;
}

impl<T: StageValues + ?Sized> StageValues for &T {
    fn value(&self, stage: usize, flat: usize) -> Result<f64, InterpError> {
        (**self).value(stage, flat)
    }
}

/// Stages computed in full, in order ([`run_all`]).
struct Buffers<'a>(&'a [Vec<f64>]);

impl StageValues for Buffers<'_> {
    fn value(&self, stage: usize, flat: usize) -> Result<f64, InterpError> {
        Ok(self.0[stage][flat])
    }
}

/// Stages computed on demand, element by element, memoised ([`eval_points`]).
struct Lazy<'a> {
    graph: &'a Graph,
    inputs: &'a [&'a [f64]],
    memo: RefCell<Vec<HashMap<usize, f64>>>,
}

impl StageValues for Lazy<'_> {
    fn value(&self, stage: usize, flat: usize) -> Result<f64, InterpError> {
        if let Some(&v) = self.memo.borrow()[stage].get(&flat) {
            return Ok(v);
        }
        // No borrow is held here: computing the element loads (only) earlier stages, which
        // recurse into this function.
        let st = &self.graph.stages[stage];
        let extents = st.axis_extents();
        let mut axes = vec![0i64; extents.len()];
        let ev = Eval {
            graph: self.graph,
            inputs: self.inputs,
            stages: self,
            stage,
        };
        let v = ev.element(flat, &extents, &mut axes)?;
        self.memo.borrow_mut()[stage].insert(flat, v);
        Ok(v)
    }
}

fn unflatten(mut flat: usize, extents: &[usize], out: &mut [i64]) {
    for d in (0..extents.len()).rev() {
        out[d] = (flat % extents[d]) as i64;
        flat /= extents[d];
    }
}

struct Eval<'a, S> {
    graph: &'a Graph,
    inputs: &'a [&'a [f64]],
    stages: S,
    stage: usize,
}

impl<S: StageValues> Eval<'_, S> {
    /// Element `flat` of this stage (its whole reduction), rounded to the stage's type.
    /// `extents` are the stage's axis extents; `axes` is scratch of the same length.
    fn element(
        &self,
        flat: usize,
        extents: &[usize],
        axes: &mut [i64],
    ) -> Result<f64, InterpError> {
        let stage = &self.graph.stages[self.stage];
        let ns = stage.n_spatial();
        unflatten(flat, &extents[..ns], &mut axes[..ns]);
        let v = match &stage.reduce {
            None => self.eval(&stage.body, axes)?.f(),
            Some(r) => {
                let mut acc = r.op.identity(stage.dtype);
                let count: usize = r.extents.iter().product();
                for ri in 0..count {
                    unflatten(ri, &r.extents, &mut axes[ns..]);
                    let x = self.eval(&stage.body, axes)?.f();
                    acc = match r.op {
                        ReduceOp::Sum => round_to(acc + x, stage.dtype),
                        ReduceOp::Max => acc.max(x),
                        ReduceOp::Min => acc.min(x),
                    };
                }
                acc
            }
        };
        Ok(round_to(v, stage.dtype))
    }

    fn eval(&self, e: &Expr, axes: &[i64]) -> Result<Value, InterpError> {
        Ok(match e {
            Expr::Const(v, d) => match d {
                DType::I32 => Value::I(*v as i64),
                DType::Bool => Value::B(*v != 0.0),
                _ => Value::F(*v),
            },
            Expr::Axis(a) => Value::I(axes[*a]),
            Expr::Load(t, idx) => {
                let shape = self.graph.shape(*t);
                let mut flat = 0usize;
                let mut inside = true;
                for (i, &n) in idx.iter().zip(shape) {
                    let v = self.eval(i, axes)?.i();
                    inside &= v >= 0 && v < n as i64;
                    flat = flat.wrapping_mul(n).wrapping_add(v as usize);
                }
                // Validation admits a load that can leave its tensor only under a select (a
                // padding guard); out of bounds it reads zero, as the emitted code does, even
                // where the guard does not keep it inside.
                if !inside {
                    return Ok(match self.graph.dtype(*t) {
                        DType::I32 => Value::I(0),
                        DType::Bool => Value::B(false),
                        _ => Value::F(0.0),
                    });
                }
                let x = match t {
                    TensorRef::Input(i) => self.inputs[*i][flat],
                    TensorRef::Stage(i) => self.stages.value(*i, flat)?,
                };
                match self.graph.dtype(*t) {
                    DType::I32 => Value::I(x as i64),
                    DType::Bool => Value::B(x != 0.0),
                    _ => Value::F(x),
                }
            }
            Expr::Unary(op, a) => {
                let v = self.eval(a, axes)?;
                match (op, v) {
                    (UnaryOp::Not, Value::B(b)) => Value::B(!b),
                    (UnaryOp::Neg, Value::I(i)) => Value::I(wrap(-i)),
                    (UnaryOp::Abs, Value::I(i)) => Value::I(wrap(i.abs())),
                    (op, v) => Value::F(unary_f(*op, v.f())),
                }
            }
            Expr::Binary(op @ (BinaryOp::And | BinaryOp::Or), a, b) => {
                // Short-circuit, as the emitted Rust does.
                let x = self.eval(a, axes)? == Value::B(true);
                if x == (*op == BinaryOp::Or) {
                    Value::B(x)
                } else {
                    Value::B(self.eval(b, axes)? == Value::B(true))
                }
            }
            Expr::Binary(op, a, b) => {
                let (x, y) = (self.eval(a, axes)?, self.eval(b, axes)?);
                match (x, y) {
                    (Value::I(x), Value::I(y)) => Value::I(wrap(self.int_op(*op, x, y)?)),
                    (Value::B(x), Value::B(y)) => Value::B(match op {
                        BinaryOp::Or => x || y,
                        _ => x && y,
                    }),
                    (x, y) => Value::F(float_op(*op, x.f(), y.f())),
                }
            }
            Expr::Cmp(op, a, b) => {
                let (x, y) = (self.eval(a, axes)?, self.eval(b, axes)?);
                let (x, y) = (x.f(), y.f());
                Value::B(match op {
                    CmpOp::Eq => x == y,
                    CmpOp::Ne => x != y,
                    CmpOp::Lt => x < y,
                    CmpOp::Le => x <= y,
                    CmpOp::Gt => x > y,
                    CmpOp::Ge => x >= y,
                })
            }
            Expr::Select(c, a, b) => match self.eval(c, axes)? {
                Value::B(true) => self.eval(a, axes)?,
                _ => self.eval(b, axes)?,
            },
            Expr::Cast(d, a) => {
                let v = self.eval(a, axes)?;
                match d {
                    DType::I32 => Value::I(v.f() as i32 as i64),
                    DType::F32 => Value::F(v.f() as f32 as f64),
                    DType::F64 => Value::F(v.f()),
                    DType::Bool => Value::B(v.f() != 0.0),
                }
            }
        })
    }

    fn int_op(&self, op: BinaryOp, x: i64, y: i64) -> Result<i64, InterpError> {
        let zero = || InterpError::DivByZero(self.graph.stages[self.stage].name.clone());
        Ok(match op {
            BinaryOp::Add => x + y,
            BinaryOp::Sub => x - y,
            BinaryOp::Mul => x.wrapping_mul(y),
            BinaryOp::Div => x.checked_div(y).ok_or_else(zero)?,
            BinaryOp::Rem => x.checked_rem(y).ok_or_else(zero)?,
            BinaryOp::Min => x.min(y),
            BinaryOp::Max => x.max(y),
            BinaryOp::And | BinaryOp::Or => 0,
        })
    }
}

fn wrap(v: i64) -> i64 {
    v as i32 as i64
}

/// The float semantics of a unary op, shared with codegen's tests.
pub fn unary_f(op: UnaryOp, x: f64) -> f64 {
    match op {
        UnaryOp::Neg => -x,
        UnaryOp::Abs => x.abs(),
        UnaryOp::Exp => x.exp(),
        UnaryOp::Log => x.ln(),
        UnaryOp::Sqrt => x.sqrt(),
        UnaryOp::Tanh => x.tanh(),
        UnaryOp::Erf => erf(x),
        UnaryOp::Not => (x == 0.0) as i64 as f64,
    }
}

fn float_op(op: BinaryOp, x: f64, y: f64) -> f64 {
    match op {
        BinaryOp::Add => x + y,
        BinaryOp::Sub => x - y,
        BinaryOp::Mul => x * y,
        BinaryOp::Div => x / y,
        BinaryOp::Rem => x % y,
        BinaryOp::Min => x.min(y),
        BinaryOp::Max => x.max(y),
        BinaryOp::And | BinaryOp::Or => 0.0,
    }
}

/// The error function: Numerical Recipes' Chebyshev fit of erfc, |error| < 1.2e-7, below f32
/// resolution. The runtime's `harl::runtime::erf` is the same formula, so kernels match the oracle.
pub fn erf(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ops::workloads as w;

    #[test]
    fn a_guarded_load_that_leaves_its_tensor_reads_zero_like_the_emitted_code() {
        use crate::{load, CmpOp, Expr, GraphBuilder};
        // out[i] = i >= 1 ? a[i] : 0 over 0..8, with `a` of 3 elements: the guard does not
        // keep i in 0..3, and a[3..8] read zero.
        let mut b = GraphBuilder::new();
        let a = b.input("a", &[3], DType::F32);
        let guard = Expr::axis(0).cmp(CmpOp::Ge, Expr::int(1));
        let body = Expr::select(guard, load(a, [Expr::axis(0)]), Expr::f32(0.0));
        b.compute("pad", &[8], DType::F32, body);
        let g = b.finish().expect("a guarded load validates");
        let got = run(&g, &[&[5.0, 6.0, 7.0]]).expect("runs");
        assert_eq!(got, [0.0, 6.0, 7.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
    }

    /// Deterministic inputs in [-1, 1) (small integers for i32).
    fn inputs(graph: &Graph, seed: u64) -> Vec<Vec<f64>> {
        let mut s = seed | 1;
        let mut next = move || {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            (s >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
        };
        graph
            .inputs
            .iter()
            .map(|p| {
                let n: usize = p.shape.iter().product();
                (0..n)
                    .map(|_| match p.dtype {
                        DType::I32 => (next() * 8.0).round(),
                        _ => next() as f32 as f64,
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn eval_points_equals_run_everywhere() {
        let graphs = [
            w::matmul(5, 7, 3).expect("matmul"),
            w::dense_bias_relu(4, 9, 6).expect("dense"),
            w::conv2d(1, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1).expect("conv2d with pad"),
            w::conv2d(1, 4, 7, 7, 4, 3, 3, 2, 1, 1, 4).expect("depthwise, strided"),
            w::conv2d_transpose(1, 3, 3, 3, 2, 4, 4, 2, 1, 1).expect("conv2d_transpose"),
            w::softmax(3, 20).expect("softmax"),
            w::layer_norm(3, 16).expect("layer_norm"),
        ];
        for (gi, g) in graphs.iter().enumerate() {
            let data = inputs(g, gi as u64 + 3);
            let refs: Vec<&[f64]> = data.iter().map(Vec::as_slice).collect();
            let full = run(g, &refs).expect("run");
            let all: Vec<usize> = (0..full.len()).collect();
            let got = eval_points(g, &refs, &all).expect("eval_points");
            // Bit-for-bit: same element computation, same rounding.
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                full.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "graph {gi}"
            );
            // A few points, repeated and out of order, alone.
            let some = [full.len() - 1, 0, full.len() / 2, 0];
            let got = eval_points(g, &refs, &some).expect("eval_points");
            for (p, v) in some.iter().zip(got) {
                assert_eq!(v.to_bits(), full[*p].to_bits(), "graph {gi} point {p}");
            }
        }
    }

    #[test]
    fn eval_points_touches_only_what_the_points_read() {
        // 1024^3 would take seconds in full; a handful of points must be quick.
        let g = w::matmul(1024, 1024, 1024).expect("matmul");
        let n = 1024 * 1024;
        let a: Vec<f64> = (0..n).map(|i| (i % 7) as f64 * 0.125).collect();
        let b: Vec<f64> = (0..n).map(|i| (i % 5) as f64 * 0.25).collect();
        let t = std::time::Instant::now();
        let got = eval_points(&g, &[&a, &b], &[0, 1025, n - 1]).expect("eval_points");
        assert!(t.elapsed().as_secs_f64() < 2.0);
        let dot = |i: usize, j: usize| -> f64 {
            (0..1024).fold(0.0, |acc, k| {
                round_to(acc + a[i * 1024 + k] * b[k * 1024 + j], DType::F32)
            })
        };
        assert_eq!(got, vec![dot(0, 0), dot(1, 1), dot(1023, 1023)]);
    }

    #[test]
    fn eval_points_rejects_bad_points_and_inputs() {
        let g = w::matmul(2, 3, 4).expect("matmul");
        let (a, b) = (vec![0.0; 6], vec![0.0; 12]);
        assert_eq!(
            eval_points(&g, &[&a, &b], &[8]),
            Err(InterpError::PointOutOfRange { index: 8, size: 8 })
        );
        assert!(matches!(
            eval_points(&g, &[&a], &[0]),
            Err(InterpError::InputCount { .. })
        ));
        assert_eq!(eval_points(&g, &[&a, &b], &[]), Ok(vec![]));
    }
}
