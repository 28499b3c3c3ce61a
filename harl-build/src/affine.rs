//! Affine index forms: `sum(coef * var) + constant` over integer variables (loop variables
//! of the loop IR, or a stage's axes), for the bounds of a shared-memory box and the sampling
//! of a strided read (`crate::layout::sample_factors`).

use harl_te::{BinaryOp, DType, Expr, UnaryOp};
use std::collections::BTreeMap;

/// `sum(coef * var) + constant`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Affine {
    /// Each variable's coefficient (none zero).
    pub terms: BTreeMap<usize, i64>,
    /// The constant term.
    pub constant: i64,
}

impl Affine {
    /// `self + sign * other`; `None` on overflow.
    pub fn add(mut self, other: Affine, sign: i64) -> Option<Affine> {
        for (v, c) in other.terms {
            let t = self.terms.entry(v).or_insert(0);
            *t = t.checked_add(c.checked_mul(sign)?)?;
        }
        self.constant = self
            .constant
            .checked_add(other.constant.checked_mul(sign)?)?;
        self.terms.retain(|_, c| *c != 0);
        Some(self)
    }

    /// `k * self`; `None` on overflow.
    pub fn scale(mut self, k: i64) -> Option<Affine> {
        for c in self.terms.values_mut() {
            *c = c.checked_mul(k)?;
        }
        self.constant = self.constant.checked_mul(k)?;
        self.terms.retain(|_, c| *c != 0);
        Some(self)
    }

    /// The form as an expression (`0` when empty).
    pub fn to_expr(&self) -> Expr {
        self.terms
            .iter()
            .map(|(&v, &c)| {
                if c == 1 {
                    Expr::Axis(v)
                } else {
                    Expr::Axis(v) * Expr::int(c)
                }
            })
            .chain((self.constant != 0).then(|| Expr::int(self.constant)))
            .reduce(|a, b| a + b)
            .unwrap_or_else(|| Expr::int(0))
    }
}

/// `e` as an affine form of loop variables, if it is one.
pub fn affine(e: &Expr) -> Option<Affine> {
    match e {
        Expr::Const(v, d) if *d != DType::Bool && v.fract() == 0.0 => Some(Affine {
            terms: BTreeMap::new(),
            constant: *v as i64,
        }),
        Expr::Axis(v) => Some(Affine {
            terms: BTreeMap::from([(*v, 1)]),
            constant: 0,
        }),
        Expr::Binary(BinaryOp::Add, a, b) => affine(a)?.add(affine(b)?, 1),
        Expr::Binary(BinaryOp::Sub, a, b) => affine(a)?.add(affine(b)?, -1),
        Expr::Binary(BinaryOp::Mul, a, b) => {
            let (x, y) = (affine(a)?, affine(b)?);
            match (x.terms.is_empty(), y.terms.is_empty()) {
                (true, _) => y.scale(x.constant),
                (_, true) => x.scale(y.constant),
                _ => None,
            }
        }
        Expr::Unary(UnaryOp::Neg, a) => affine(a)?.scale(-1),
        _ => None,
    }
}
