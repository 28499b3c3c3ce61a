//! Division and remainder of index expressions by a constant, resolved where the loop bounds
//! allow: with `x = P*q + r`, `q` and `r` sums of loop variables and `0 <= r < P` over the
//! loops' ranges, `x / P` is `q` and `x % P` is `r`.
//!
//! A panel layout (`cache_read` with a panel) reads its copy at `[f / P, .., f % P]`; with `f`
//! split as `fo*P + fi`, this makes the index `[fo, .., fi]`, contiguous in `fi`, which is what
//! codegen's vector loops need (an index it cannot prove affine stays scalar).

use crate::loop_ir::Program;
use harl_te::graph::interval;
use harl_te::{BinaryOp, Expr};

/// Simplifies every expression of `p`'s nests.
pub fn program(p: &mut Program) {
    let extents = p.var_extents.clone();
    for nest in &mut p.nests {
        for s in &mut nest.body {
            s.map_exprs(&|e| expr(e, &extents));
        }
    }
}

/// `e` with each `x / P` and `x % P` (constant `P > 0`) that the bounds resolve replaced, and
/// each sum of `(x / P) * P` and `x % P` recombined into `x`; loop variable `v` ranges over
/// `0..extents[v]`.
pub fn expr(e: &Expr, extents: &[usize]) -> Expr {
    recombine(resolve(e, extents))
}

fn resolve(e: &Expr, extents: &[usize]) -> Expr {
    e.map(&mut |node| {
        let Expr::Binary(op @ (BinaryOp::Div | BinaryOp::Rem), x, p) = &node else {
            return node;
        };
        let Some(p) = p.eval_int(&[]).filter(|&p| p > 0) else {
            return node;
        };
        match split(x, p, extents) {
            Some((q, _)) if *op == BinaryOp::Div => q,
            Some((_, r)) => r,
            None => node,
        }
    })
}

/// Sums with `k*P * (x / P)` and `k * (x % P)` as terms have `k * x` in their place (Rust's
/// `/` and `%` truncate together, so `(x / P) * P + x % P == x` for every `x`): a fused loop
/// `v` binds its parts as `v / n` and `v % n`, and an index over contiguous axes recombines
/// them into `v`, which a vector loop can walk.
fn recombine(e: Expr) -> Expr {
    e.map(&mut |node| {
        if !matches!(node, Expr::Binary(BinaryOp::Add, ..)) {
            return node;
        }
        let mut terms = Vec::new();
        let Some(constant) = affine(&node, 1, &mut terms) else {
            return node;
        };
        let mut changed = false;
        while let Some((quotient, remainder, x, k)) = parts_pair(&terms) {
            terms.remove(quotient.max(remainder));
            terms.remove(quotient.min(remainder));
            if atom(&x, k, &mut terms).is_none() {
                return node;
            }
            changed = true;
        }
        if changed {
            sum(&terms, constant)
        } else {
            node
        }
    })
}

/// Positions of a `(x / P, k*P)` and an `(x % P, k)` term, with `x` and `k`.
fn parts_pair(terms: &[(Expr, i64)]) -> Option<(usize, usize, Expr, i64)> {
    for (j, (r, k)) in terms.iter().enumerate() {
        let Expr::Binary(BinaryOp::Rem, x, p) = r else {
            continue;
        };
        let Some(p) = p.eval_int(&[]).filter(|&p| p > 0) else {
            continue;
        };
        let quotient = terms.iter().position(|(q, c)| {
            matches!(q, Expr::Binary(BinaryOp::Div, y, d) if y == x && d.eval_int(&[]) == Some(p))
                && k.checked_mul(p) == Some(*c)
        });
        if let Some(i) = quotient {
            return Some((i, j, (**x).clone(), *k));
        }
    }
    None
}

/// `x` as `p*q + r` with `0 <= r < p` everywhere in the loops' ranges (`x >= 0` then too, so
/// Rust's truncating division is the floor).
fn split(x: &Expr, p: i64, extents: &[usize]) -> Option<(Expr, Expr)> {
    let mut terms = Vec::new();
    let constant = affine(x, 1, &mut terms)?;
    let (mut q, mut r) = (Vec::new(), Vec::new());
    for (atom, c) in terms {
        if c % p == 0 {
            q.push((atom, c / p));
        } else {
            r.push((atom, c));
        }
    }
    // The constant's multiple of `p` goes to the quotient only when the rest stays in range.
    let (cq, cr) = (constant.div_euclid(p), constant.rem_euclid(p));
    let (mut lo, mut hi) = (i128::from(cr), i128::from(cr));
    for (atom, c) in &r {
        let (a, b) = interval(atom, extents);
        let (a, b) = (
            i128::from(a) * i128::from(*c),
            i128::from(b) * i128::from(*c),
        );
        lo += a.min(b);
        hi += a.max(b);
    }
    let mut qlo = i128::from(cq);
    for (atom, c) in &q {
        let (a, b) = interval(atom, extents);
        qlo += (i128::from(a) * i128::from(*c)).min(i128::from(b) * i128::from(*c));
    }
    if lo < 0 || hi >= i128::from(p) || qlo < 0 {
        return None;
    }
    Some((sum(&q, cq), sum(&r, cr)))
}

/// `x*scale` as a constant plus `(atom, coefficient)` terms: sums, differences and products with
/// constants are taken apart; anything else is an atom.
fn affine(x: &Expr, scale: i64, terms: &mut Vec<(Expr, i64)>) -> Option<i64> {
    if let Some(c) = x.eval_int(&[]) {
        return c.checked_mul(scale);
    }
    match x {
        Expr::Binary(BinaryOp::Add, a, b) => {
            affine(a, scale, terms)?.checked_add(affine(b, scale, terms)?)
        }
        Expr::Binary(BinaryOp::Sub, a, b) => {
            affine(a, scale, terms)?.checked_add(affine(b, scale.checked_neg()?, terms)?)
        }
        Expr::Binary(BinaryOp::Mul, a, b) => match (a.eval_int(&[]), b.eval_int(&[])) {
            (Some(c), _) => affine(b, scale.checked_mul(c)?, terms),
            (_, Some(c)) => affine(a, scale.checked_mul(c)?, terms),
            _ => atom(x, scale, terms),
        },
        _ => atom(x, scale, terms),
    }
}

fn atom(x: &Expr, scale: i64, terms: &mut Vec<(Expr, i64)>) -> Option<i64> {
    match terms.iter_mut().find(|(a, _)| a == x) {
        Some((_, c)) => *c = c.checked_add(scale)?,
        None => terms.push((x.clone(), scale)),
    }
    Some(0)
}

fn sum(terms: &[(Expr, i64)], constant: i64) -> Expr {
    let mut out: Option<Expr> = None;
    for (atom, c) in terms.iter().filter(|(_, c)| *c != 0) {
        let t = if *c == 1 {
            atom.clone()
        } else {
            atom.clone().binary(BinaryOp::Mul, Expr::int(*c))
        };
        out = Some(match out {
            Some(o) => o.binary(BinaryOp::Add, t),
            None => t,
        });
    }
    match (out, constant) {
        (Some(o), 0) => o,
        (Some(o), c) => o.binary(BinaryOp::Add, Expr::int(c)),
        (None, c) => Expr::int(c),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn v(n: usize) -> Expr {
        Expr::Axis(n)
    }
    fn c(n: i64) -> Expr {
        Expr::int(n)
    }

    /// Every simplified expression equals the original at every point of the loops' ranges.
    fn check_equal(e: &Expr, extents: &[usize]) -> Expr {
        let s = expr(e, extents);
        let total: usize = extents.iter().product();
        for mut i in 0..total {
            let vals: Vec<i64> = extents
                .iter()
                .map(|&n| {
                    let x = (i % n) as i64;
                    i /= n;
                    x
                })
                .collect();
            assert_eq!(
                e.eval_int(&vals),
                s.eval_int(&vals),
                "{e:?} vs {s:?} at {vals:?}"
            );
        }
        s
    }

    #[test]
    fn a_split_axis_over_its_panel_is_its_parts() {
        // f = fo*32 + f1*16 + f2, fo < 4, f1 < 2, f2 < 16.
        let f = v(0)
            .binary(BinaryOp::Mul, c(32))
            .binary(BinaryOp::Add, v(1).binary(BinaryOp::Mul, c(16)))
            .binary(BinaryOp::Add, v(2));
        let ext = [4, 2, 16];
        let q = check_equal(&f.clone().binary(BinaryOp::Div, c(32)), &ext);
        assert_eq!(q, v(0));
        let r = check_equal(&f.binary(BinaryOp::Rem, c(32)), &ext);
        assert!(!format!("{r:?}").contains("Rem"), "{r:?}");
    }

    #[test]
    fn a_fused_loops_parts_recombine() {
        // v in 0..49 fused from two loops of 7: ((v / 7) % 7) * 7 + (v / 1) % 7 is v, inside
        // a larger index (a channel's offset), and with a coefficient.
        let part = |d: i64, n: i64| v(0).binary(BinaryOp::Div, c(d)).binary(BinaryOp::Rem, c(n));
        let index = v(1)
            .binary(BinaryOp::Mul, c(49))
            .binary(BinaryOp::Add, part(7, 7).binary(BinaryOp::Mul, c(7)))
            .binary(BinaryOp::Add, part(1, 7));
        let s = check_equal(&index, &[49, 3]);
        assert!(
            !format!("{s:?}").contains("Div") && !format!("{s:?}").contains("Rem"),
            "{s:?}"
        );
        let twice = index.clone().binary(BinaryOp::Mul, c(2));
        let s = check_equal(&twice, &[49, 3]);
        assert!(!format!("{s:?}").contains("Rem"), "{s:?}");
        // Parts of different divisors, or of a non-contiguous layout: nothing to recombine.
        let other = part(7, 7)
            .binary(BinaryOp::Mul, c(8))
            .binary(BinaryOp::Add, part(1, 7));
        let s = check_equal(&other, &[49]);
        assert!(format!("{s:?}").contains("Rem"), "{s:?}");
    }

    #[test]
    fn what_the_bounds_do_not_resolve_stays() {
        // f2 < 17 may carry into the next panel: unchanged.
        let f = v(0)
            .binary(BinaryOp::Mul, c(16))
            .binary(BinaryOp::Add, v(1));
        let e = f.binary(BinaryOp::Div, c(16));
        assert_eq!(check_equal(&e, &[3, 17]), e);
        // A negative part: unchanged.
        let e = v(0).binary(BinaryOp::Sub, c(1)).binary(BinaryOp::Rem, c(4));
        assert_eq!(check_equal(&e, &[3]), e);
        // A constant that carries: (v + 5) / 4 with v < 3 is 1 + v/4... resolved when in range.
        let e = v(0).binary(BinaryOp::Add, c(5)).binary(BinaryOp::Div, c(4));
        check_equal(&e, &[3]);
        let e = v(0).binary(BinaryOp::Add, c(5)).binary(BinaryOp::Rem, c(4));
        check_equal(&e, &[4]);
    }
}
