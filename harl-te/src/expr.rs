//! Scalar expressions: the body of a compute stage.
//!
//! An expression refers to the iteration axes of its stage by position (spatial axes first, then
//! reduce axes), never by name, so that two graphs that differ only in names are the same workload.

use std::ops;

/// Element type of a tensor or an expression.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum DType {
    /// 32-bit float.
    F32,
    /// 64-bit float.
    F64,
    /// 32-bit signed integer; also the type of index arithmetic.
    I32,
    /// Result of comparisons; only valid inside expressions, never as a tensor element type.
    Bool,
}

impl DType {
    /// The Rust type name used by codegen.
    pub fn rust_name(self) -> &'static str {
        match self {
            DType::F32 => "f32",
            DType::F64 => "f64",
            DType::I32 => "i32",
            DType::Bool => "bool",
        }
    }

    /// Parses a Rust scalar type name.
    pub fn from_rust_name(name: &str) -> Option<DType> {
        match name {
            "f32" => Some(DType::F32),
            "f64" => Some(DType::F64),
            "i32" => Some(DType::I32),
            "bool" => Some(DType::Bool),
            _ => None,
        }
    }

    /// True for f32 and f64.
    pub fn is_float(self) -> bool {
        matches!(self, DType::F32 | DType::F64)
    }

    pub(crate) fn tag(self) -> u8 {
        self as u8
    }
}

/// A reference to a tensor of a graph: one of its inputs or one of its stages.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum TensorRef {
    /// The n-th placeholder.
    Input(usize),
    /// The n-th compute stage.
    Stage(usize),
}

/// Unary operators and math functions.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum UnaryOp {
    /// `-x`
    Neg,
    /// `!x` on booleans.
    Not,
    /// `|x|`
    Abs,
    /// `e^x`
    Exp,
    /// natural logarithm
    Log,
    /// square root
    Sqrt,
    /// hyperbolic tangent
    Tanh,
    /// the error function
    Erf,
}

/// Binary arithmetic operators.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum BinaryOp {
    /// `a + b`
    Add,
    /// `a - b`
    Sub,
    /// `a * b`
    Mul,
    /// `a / b` (truncating on integers, as Rust)
    Div,
    /// `a % b` (Rust's remainder on integers)
    Rem,
    /// minimum
    Min,
    /// maximum
    Max,
    /// `a && b` on booleans
    And,
    /// `a || b` on booleans
    Or,
}

/// Comparison operators; they yield `Bool`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum CmpOp {
    /// `==`
    Eq,
    /// `!=`
    Ne,
    /// `<`
    Lt,
    /// `<=`
    Le,
    /// `>`
    Gt,
    /// `>=`
    Ge,
}

impl CmpOp {
    /// The operator as Rust and C spell it (`==`, `<`, ...).
    pub fn symbol(self) -> &'static str {
        match self {
            CmpOp::Eq => "==",
            CmpOp::Ne => "!=",
            CmpOp::Lt => "<",
            CmpOp::Le => "<=",
            CmpOp::Gt => ">",
            CmpOp::Ge => ">=",
        }
    }
}

/// A scalar expression.
#[derive(Clone, Debug, PartialEq)]
#[cfg_attr(feature = "serde", derive(serde::Serialize, serde::Deserialize))]
pub enum Expr {
    /// A literal of the given type (integers are held exactly in the f64).
    Const(f64, DType),
    /// The value of iteration axis `n` of the enclosing stage (spatial first, then reduce), an i32.
    Axis(usize),
    /// An element of a tensor; one i32 index per dimension.
    Load(TensorRef, Vec<Expr>),
    /// A unary operation.
    Unary(UnaryOp, Box<Expr>),
    /// A binary operation; both sides have the same type.
    Binary(BinaryOp, Box<Expr>, Box<Expr>),
    /// A comparison.
    Cmp(CmpOp, Box<Expr>, Box<Expr>),
    /// `if cond { a } else { b }`; only the taken side is evaluated, so it guards loads (padding).
    Select(Box<Expr>, Box<Expr>, Box<Expr>),
    /// A numeric conversion, as Rust's `as`.
    Cast(DType, Box<Expr>),
}

impl Expr {
    /// An f32 literal.
    pub fn f32(v: f32) -> Expr {
        Expr::Const(v as f64, DType::F32)
    }
    /// A literal of a given float or int type.
    pub fn lit(v: f64, dtype: DType) -> Expr {
        Expr::Const(v, dtype)
    }
    /// An i32 literal (index arithmetic).
    pub fn int(v: i64) -> Expr {
        Expr::Const(v as f64, DType::I32)
    }
    /// Iteration axis `n`.
    pub fn axis(n: usize) -> Expr {
        Expr::Axis(n)
    }
    /// `f(self)`.
    pub fn unary(self, op: UnaryOp) -> Expr {
        Expr::Unary(op, Box::new(self))
    }
    /// `op(self, rhs)`.
    pub fn binary(self, op: BinaryOp, rhs: Expr) -> Expr {
        Expr::Binary(op, Box::new(self), Box::new(rhs))
    }
    /// `self <op> rhs` as a boolean.
    pub fn cmp(self, op: CmpOp, rhs: Expr) -> Expr {
        Expr::Cmp(op, Box::new(self), Box::new(rhs))
    }
    /// `min(self, rhs)`.
    pub fn min(self, rhs: Expr) -> Expr {
        self.binary(BinaryOp::Min, rhs)
    }
    /// `max(self, rhs)`.
    pub fn max(self, rhs: Expr) -> Expr {
        self.binary(BinaryOp::Max, rhs)
    }
    /// `self && rhs`.
    pub fn and(self, rhs: Expr) -> Expr {
        self.binary(BinaryOp::And, rhs)
    }
    /// `if cond { a } else { b }`.
    pub fn select(cond: Expr, a: Expr, b: Expr) -> Expr {
        Expr::Select(Box::new(cond), Box::new(a), Box::new(b))
    }
    /// `self as dtype`.
    pub fn cast(self, dtype: DType) -> Expr {
        Expr::Cast(dtype, Box::new(self))
    }
    /// `exp(self)`.
    pub fn exp(self) -> Expr {
        self.unary(UnaryOp::Exp)
    }

    /// The value of an integer index expression at the given axis values (`None` if it is not
    /// a plain integer expression, or overflows).
    pub fn eval_int(&self, vals: &[i64]) -> Option<i64> {
        Some(match self {
            Expr::Const(c, _) => *c as i64,
            Expr::Axis(v) => *vals.get(*v)?,
            Expr::Unary(UnaryOp::Neg, a) => a.eval_int(vals)?.checked_neg()?,
            Expr::Binary(op, a, b) => {
                let (x, y) = (a.eval_int(vals)?, b.eval_int(vals)?);
                match op {
                    BinaryOp::Add => x.checked_add(y)?,
                    BinaryOp::Sub => x.checked_sub(y)?,
                    BinaryOp::Mul => x.checked_mul(y)?,
                    BinaryOp::Div => x.checked_div(y)?,
                    BinaryOp::Rem => x.checked_rem(y)?,
                    BinaryOp::Min => x.min(y),
                    BinaryOp::Max => x.max(y),
                    BinaryOp::And | BinaryOp::Or => return None,
                }
            }
            Expr::Cast(DType::I32, a) => a.eval_int(vals)?,
            _ => return None,
        })
    }

    /// How much an index expression of a stage with `n_axes` axes moves when axis `axis` goes
    /// from 0 to 1, the others at 0: its stride along that axis if it is affine in it.
    pub fn stride(&self, axis: usize, n_axes: usize) -> Option<i64> {
        let mut vals = vec![0i64; n_axes];
        let base = self.eval_int(&vals)?;
        *vals.get_mut(axis)? = 1;
        self.eval_int(&vals)?.checked_sub(base)
    }

    /// Calls `f` on every sub-expression, parents before children.
    pub fn visit(&self, f: &mut impl FnMut(&Expr)) {
        f(self);
        match self {
            Expr::Const(..) | Expr::Axis(_) => {}
            Expr::Load(_, idx) => idx.iter().for_each(|e| e.visit(f)),
            Expr::Unary(_, a) | Expr::Cast(_, a) => a.visit(f),
            Expr::Binary(_, a, b) | Expr::Cmp(_, a, b) => {
                a.visit(f);
                b.visit(f);
            }
            Expr::Select(c, a, b) => {
                c.visit(f);
                a.visit(f);
                b.visit(f);
            }
        }
    }

    /// Rebuilds the expression bottom-up, letting `f` replace any node after its children.
    pub fn map(&self, f: &mut impl FnMut(Expr) -> Expr) -> Expr {
        let rebuilt = match self {
            Expr::Const(..) | Expr::Axis(_) => self.clone(),
            Expr::Load(t, idx) => Expr::Load(*t, idx.iter().map(|e| e.map(f)).collect()),
            Expr::Unary(op, a) => Expr::Unary(*op, Box::new(a.map(f))),
            Expr::Cast(d, a) => Expr::Cast(*d, Box::new(a.map(f))),
            Expr::Binary(op, a, b) => Expr::Binary(*op, Box::new(a.map(f)), Box::new(b.map(f))),
            Expr::Cmp(op, a, b) => Expr::Cmp(*op, Box::new(a.map(f)), Box::new(b.map(f))),
            Expr::Select(c, a, b) => {
                Expr::Select(Box::new(c.map(f)), Box::new(a.map(f)), Box::new(b.map(f)))
            }
        };
        f(rebuilt)
    }

    /// Tensors this expression loads from.
    pub fn loads(&self) -> Vec<TensorRef> {
        let mut out = Vec::new();
        self.visit(&mut |e| {
            if let Expr::Load(t, _) = e {
                if !out.contains(t) {
                    out.push(*t);
                }
            }
        });
        out
    }
}

macro_rules! impl_binop {
    ($trait:ident, $method:ident, $op:expr) => {
        impl ops::$trait for Expr {
            type Output = Expr;
            fn $method(self, rhs: Expr) -> Expr {
                self.binary($op, rhs)
            }
        }
    };
}
impl_binop!(Add, add, BinaryOp::Add);
impl_binop!(Sub, sub, BinaryOp::Sub);
impl_binop!(Mul, mul, BinaryOp::Mul);
impl_binop!(Div, div, BinaryOp::Div);
impl_binop!(Rem, rem, BinaryOp::Rem);

impl ops::Neg for Expr {
    type Output = Expr;
    fn neg(self) -> Expr {
        self.unary(UnaryOp::Neg)
    }
}
