//! Loop partitioning: a loop whose body tests its own variable against constant bounds (the
//! select of a padding stage, the guard of a non-dividing split) is split into a left border, an
//! interior where every such test is provably true, and a right border. In the interior the
//! test disappears and the guarded load becomes a plain, provably in-bounds one, so the copy of
//! a padded input vectorises like a `memcpy` instead of branching on every element.
//!
//! The pass runs on the lowered [`Program`], so the executor that checks schedules against the
//! interpreter runs exactly what codegen prints. Iteration order is unchanged (left, interior,
//! right), so results are bit-identical. Only serial loops without an unrolled loop inside are
//! split (parallel, vector, unrolled and GPU loops keep their single loop), and only small
//! bodies, so the code grows by a bounded factor.

use crate::loop_ir::{LoopKind, Program, Stmt};
use harl_te::graph::interval;
use harl_te::{BinaryOp, CmpOp, DType, Expr, UnaryOp};

/// Loops whose body has more statements than this are left whole (each split triples it).
const MAX_BODY_STMTS: usize = 64;
/// Loops longer than this are left whole (the interior is found by scanning the iterations).
const MAX_SCAN: usize = 1 << 16;

/// Splits every eligible loop of `program` (see the module docs).
pub fn partition_program(program: &mut Program) {
    let mut vars = std::mem::take(&mut program.var_extents);
    // A nest keeps its one outermost loop (codegen dispatches parallel nests on it); the
    // loops inside it are split.
    for nest in &mut program.nests {
        for s in &mut nest.body {
            match s {
                Stmt::For { body, .. } | Stmt::If { body, .. } => {
                    let inner = std::mem::take(body);
                    *body = partition_stmts(inner, &mut vars);
                }
                _ => {}
            }
        }
    }
    program.var_extents = vars;
}

fn partition_stmts(stmts: Vec<Stmt>, vars: &mut Vec<usize>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(stmts.len());
    for s in stmts {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let body = partition_stmts(body, vars);
                out.extend(partition_loop(var, extent, kind, body, vars));
            }
            Stmt::If { cond, body } => out.push(Stmt::If {
                cond,
                body: partition_stmts(body, vars),
            }),
            Stmt::Shared { boxes, body } => out.push(Stmt::Shared {
                boxes,
                body: partition_stmts(body, vars),
            }),
            other => out.push(other),
        }
    }
    out
}

/// The loop, or its three parts when a test on its variable can be decided in an interior.
fn partition_loop(
    var: usize,
    extent: usize,
    kind: LoopKind,
    body: Vec<Stmt>,
    vars: &mut Vec<usize>,
) -> Vec<Stmt> {
    let whole = |body| {
        vec![Stmt::For {
            var,
            extent,
            kind,
            body,
        }]
    };
    if kind != LoopKind::Serial
        || extent > MAX_SCAN
        || count_stmts(&body) > MAX_BODY_STMTS
        || has_unrolled(&body)
    {
        return whole(body);
    }
    let mut tests = Vec::new();
    for s in &body {
        collect_tests(s, &mut tests);
    }
    let (mut lo, mut hi) = (0usize, extent);
    let mut decided = false;
    for t in &tests {
        if let Some((a, b)) = true_range(t, var, extent, vars) {
            lo = lo.max(a);
            hi = hi.min(b);
            decided = true;
        }
    }
    if !decided || lo >= hi || (lo == 0 && hi == extent) {
        return whole(body);
    }
    [(0, lo), (lo, hi), (hi, extent)]
        .into_iter()
        .filter(|(a, b)| a < b)
        .map(|(a, b)| {
            let part = vars.len();
            vars.push(b - a);
            let shifted = Expr::Axis(part) + Expr::int(a as i64);
            let copy = fresh_copy(&body, var, &shifted, vars);
            Stmt::For {
                var: part,
                extent: b - a,
                kind,
                body: simplify(copy, vars),
            }
        })
        .collect()
}

/// Whether an unrolled loop is inside: copying it three times would triple code the compiler
/// already expands (a transposed convolution's unrolled reduction took minutes to compile).
/// A shared-memory copy counts too: each copy of it would claim its own shared memory.
fn has_unrolled(stmts: &[Stmt]) -> bool {
    stmts.iter().any(|s| match s {
        Stmt::For { kind, body, .. } => *kind == LoopKind::Unrolled || has_unrolled(body),
        Stmt::If { body, .. } => has_unrolled(body),
        Stmt::Shared { .. } => true,
        _ => false,
    })
}

fn count_stmts(stmts: &[Stmt]) -> usize {
    stmts
        .iter()
        .map(|s| match s {
            Stmt::For { body, .. } | Stmt::If { body, .. } | Stmt::Shared { body, .. } => {
                1 + count_stmts(body)
            }
            _ => 1,
        })
        .sum()
}

/// Every comparison conjunct of every select and guard in `s`.
fn collect_tests(s: &Stmt, out: &mut Vec<Expr>) {
    let from_expr = |e: &Expr, out: &mut Vec<Expr>| {
        e.visit(&mut |x| {
            if let Expr::Select(c, _, _) = x {
                conjuncts(c, out);
            }
        })
    };
    match s {
        Stmt::For { body, .. } => body.iter().for_each(|b| collect_tests(b, out)),
        Stmt::If { cond, body } => {
            conjuncts(cond, out);
            from_expr(cond, out);
            body.iter().for_each(|b| collect_tests(b, out));
        }
        Stmt::Let { value, .. } => from_expr(value, out),
        Stmt::Store { index, value, .. } => {
            index.iter().for_each(|e| from_expr(e, out));
            from_expr(value, out);
        }
        Stmt::AccUpdate { index, value, .. } => {
            from_expr(index, out);
            from_expr(value, out);
        }
        Stmt::AccStore {
            index,
            dest,
            epilogue,
            ..
        } => {
            from_expr(index, out);
            dest.iter().for_each(|e| from_expr(e, out));
            if let Some(e) = epilogue {
                from_expr(&e.value, out);
            }
        }
        Stmt::Shared { body, .. } => body.iter().for_each(|b| collect_tests(b, out)),
        Stmt::AccDecl { .. } => {}
    }
}

fn conjuncts(e: &Expr, out: &mut Vec<Expr>) {
    match e {
        Expr::Binary(BinaryOp::And, a, b) => {
            conjuncts(a, out);
            conjuncts(b, out);
        }
        Expr::Cmp(..) => out.push(e.clone()),
        _ => {}
    }
}

/// The iterations `[a, b)` of `var` for which comparison `test` holds whatever the other loop
/// variables are (each over its whole extent, a sound over-approximation); `None` when the test
/// is not affine in `var`, or does not depend on it.
fn true_range(test: &Expr, var: usize, extent: usize, vars: &[usize]) -> Option<(usize, usize)> {
    let Expr::Cmp(op, a, b) = test else {
        return None;
    };
    let d = (**a).clone() - (**b).clone();
    let c = linear_coef(&d, var)?;
    if c == 0 {
        return None;
    }
    let rest = d.map(&mut |e| match e {
        Expr::Axis(v) if v == var => Expr::int(0),
        other => other,
    });
    let (rlo, rhi) = interval(&rest, vars);
    // The test holds for every value of the rest at iteration i.
    let holds = |i: usize| {
        let base = c.saturating_mul(i as i64);
        let (lo, hi) = (base.saturating_add(rlo), base.saturating_add(rhi));
        match op {
            CmpOp::Lt => hi < 0,
            CmpOp::Le => hi <= 0,
            CmpOp::Gt => lo > 0,
            CmpOp::Ge => lo >= 0,
            CmpOp::Eq => lo == 0 && hi == 0,
            CmpOp::Ne => lo > 0 || hi < 0,
        }
    };
    // A linear test holds on an interval of iterations; find it by scanning.
    let first = (0..extent).find(|&i| holds(i))?;
    let end = (first..extent).find(|&i| !holds(i)).unwrap_or(extent);
    Some((first, end))
}

/// The coefficient of `var` in `e` when `e` is affine in it (other variables and loads may
/// appear anywhere that does not multiply `var`); `None` otherwise.
pub(crate) fn linear_coef(e: &Expr, var: usize) -> Option<i64> {
    let mentions = |x: &Expr| {
        let mut found = false;
        x.visit(&mut |y| found |= *y == Expr::Axis(var));
        found
    };
    if !mentions(e) {
        return Some(0);
    }
    match e {
        Expr::Axis(v) if *v == var => Some(1),
        Expr::Binary(BinaryOp::Add, a, b) => linear_coef(a, var)?.checked_add(linear_coef(b, var)?),
        Expr::Binary(BinaryOp::Sub, a, b) => linear_coef(a, var)?.checked_sub(linear_coef(b, var)?),
        Expr::Binary(BinaryOp::Mul, a, b) => match (constant(a), constant(b)) {
            (Some(k), _) => linear_coef(b, var)?.checked_mul(k),
            (_, Some(k)) => linear_coef(a, var)?.checked_mul(k),
            _ => None,
        },
        Expr::Unary(UnaryOp::Neg, a) => linear_coef(a, var)?.checked_neg(),
        _ => None,
    }
}

fn constant(e: &Expr) -> Option<i64> {
    match e {
        Expr::Const(v, d) if *d != DType::Bool && v.fract() == 0.0 => Some(*v as i64),
        _ => None,
    }
}

/// A copy of `body` with `var` replaced by `value` and every variable the copy binds renamed to
/// a fresh one (so no variable is bound twice in the program).
pub(crate) fn fresh_copy(
    body: &[Stmt],
    var: usize,
    value: &Expr,
    vars: &mut Vec<usize>,
) -> Vec<Stmt> {
    let mut map: Vec<(usize, Expr)> = vec![(var, value.clone())];
    copy_stmts(body, &mut map, vars)
}

fn copy_stmts(body: &[Stmt], map: &mut Vec<(usize, Expr)>, vars: &mut Vec<usize>) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(body.len());
    let scope = map.len();
    for s in body {
        out.push(match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => {
                let fresh = rename(*var, map, vars);
                let inner = copy_stmts(body, map, vars);
                map.pop();
                Stmt::For {
                    var: fresh,
                    extent: *extent,
                    kind: *kind,
                    body: inner,
                }
            }
            Stmt::Let { var, value } => {
                let value = subst(value, map);
                // A let stays bound for the rest of its block.
                Stmt::Let {
                    var: rename(*var, map, vars),
                    value,
                }
            }
            Stmt::If { cond, body } => Stmt::If {
                cond: subst(cond, map),
                body: copy_stmts(body, map, vars),
            },
            Stmt::Store {
                stage,
                index,
                value,
                combine,
            } => Stmt::Store {
                stage: *stage,
                index: index.iter().map(|e| subst(e, map)).collect(),
                value: subst(value, map),
                combine: *combine,
            },
            Stmt::Shared { boxes, body } => Stmt::Shared {
                boxes: boxes
                    .iter()
                    .map(|b| crate::loop_ir::SharedBox {
                        input: b.input,
                        origin: b.origin.iter().map(|e| subst(e, map)).collect(),
                        extents: b.extents.clone(),
                    })
                    .collect(),
                body: copy_stmts(body, map, vars),
            },
            Stmt::AccDecl { size, dtype, init } => Stmt::AccDecl {
                size: *size,
                dtype: *dtype,
                init: *init,
            },
            Stmt::AccUpdate { index, op, value } => Stmt::AccUpdate {
                index: subst(index, map),
                op: *op,
                value: subst(value, map),
            },
            Stmt::AccStore {
                index,
                stage,
                dest,
                combine,
                epilogue,
            } => Stmt::AccStore {
                index: subst(index, map),
                stage: *stage,
                dest: dest.iter().map(|e| subst(e, map)).collect(),
                combine: *combine,
                epilogue: epilogue.as_ref().map(|e| crate::loop_ir::Epilogue {
                    stage: e.stage,
                    value: subst(&e.value, map),
                }),
            },
        });
    }
    map.truncate(scope);
    out
}

/// A fresh variable with `var`'s extent, pushed on `map` as `var`'s replacement.
fn rename(var: usize, map: &mut Vec<(usize, Expr)>, vars: &mut Vec<usize>) -> usize {
    let fresh = vars.len();
    vars.push(vars.get(var).copied().unwrap_or(1));
    map.push((var, Expr::Axis(fresh)));
    fresh
}

fn subst(e: &Expr, map: &[(usize, Expr)]) -> Expr {
    e.map(&mut |x| match x {
        Expr::Axis(v) => map
            .iter()
            .rev()
            .find(|(from, _)| *from == v)
            .map_or(Expr::Axis(v), |(_, to)| to.clone()),
        other => other,
    })
}

/// Decides the tests that interval analysis can now prove: a select whose condition holds
/// becomes its first branch, one whose condition fails its second; a guard that holds goes.
fn simplify(stmts: Vec<Stmt>, vars: &[usize]) -> Vec<Stmt> {
    let mut out = Vec::with_capacity(stmts.len());
    let e = |x: Expr| simplify_expr(x, vars);
    for s in stmts {
        match s {
            Stmt::For {
                var,
                extent,
                kind,
                body,
            } => out.push(Stmt::For {
                var,
                extent,
                kind,
                body: simplify(body, vars),
            }),
            Stmt::If { cond, body } => match decide(&cond, vars) {
                Some(true) => out.extend(simplify(body, vars)),
                Some(false) => {}
                None => out.push(Stmt::If {
                    cond,
                    body: simplify(body, vars),
                }),
            },
            Stmt::Let { var, value } => out.push(Stmt::Let {
                var,
                value: e(value),
            }),
            Stmt::Store {
                stage,
                index,
                value,
                combine,
            } => out.push(Stmt::Store {
                stage,
                index,
                value: e(value),
                combine,
            }),
            Stmt::AccUpdate { index, op, value } => out.push(Stmt::AccUpdate {
                index,
                op,
                value: e(value),
            }),
            other => out.push(other),
        }
    }
    out
}

fn simplify_expr(e: Expr, vars: &[usize]) -> Expr {
    e.map(&mut |x| match x {
        Expr::Select(c, a, b) => match decide(&c, vars) {
            Some(true) => *a,
            Some(false) => *b,
            None => Expr::Select(c, a, b),
        },
        other => other,
    })
}

/// `Some(v)` when every conjunct of `cond` is provably true (`v = true`) or one is provably
/// false (`v = false`).
fn decide(cond: &Expr, vars: &[usize]) -> Option<bool> {
    let mut parts = Vec::new();
    conjuncts(cond, &mut parts);
    // Only pure conjunctions of comparisons are decided.
    let mut n_and = 0;
    cond.visit(&mut |x| n_and += usize::from(matches!(x, Expr::Binary(BinaryOp::And, ..))));
    if parts.len() != n_and + 1 {
        return None;
    }
    let mut all_true = true;
    for p in &parts {
        match decide_cmp(p, vars) {
            Some(false) => return Some(false),
            Some(true) => {}
            None => all_true = false,
        }
    }
    all_true.then_some(true)
}

fn decide_cmp(test: &Expr, vars: &[usize]) -> Option<bool> {
    let Expr::Cmp(op, a, b) = test else {
        return None;
    };
    let integral = |x: &Expr| {
        let mut ok = true;
        x.visit(&mut |y| {
            ok &= match y {
                Expr::Const(v, d) => *d != DType::Bool && v.fract() == 0.0,
                Expr::Axis(_) => true,
                Expr::Binary(op, ..) => matches!(
                    op,
                    BinaryOp::Add
                        | BinaryOp::Sub
                        | BinaryOp::Mul
                        | BinaryOp::Div
                        | BinaryOp::Rem
                        | BinaryOp::Min
                        | BinaryOp::Max
                ),
                Expr::Unary(UnaryOp::Neg, _) => true,
                _ => false,
            }
        });
        ok
    };
    if !integral(a) || !integral(b) {
        return None;
    }
    let (lo, hi) = interval(&((**a).clone() - (**b).clone()), vars);
    match op {
        CmpOp::Lt if hi < 0 => Some(true),
        CmpOp::Lt if lo >= 0 => Some(false),
        CmpOp::Le if hi <= 0 => Some(true),
        CmpOp::Le if lo > 0 => Some(false),
        CmpOp::Gt if lo > 0 => Some(true),
        CmpOp::Gt if hi <= 0 => Some(false),
        CmpOp::Ge if lo >= 0 => Some(true),
        CmpOp::Ge if hi < 0 => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::lower;
    use crate::schedule::Schedule;
    use harl_te::ops::workloads;

    fn selects(stmts: &[Stmt]) -> usize {
        let mut n = 0;
        for s in stmts {
            match s {
                Stmt::For { body, .. } | Stmt::If { body, .. } => n += selects(body),
                Stmt::Store { value, .. } => value.visit(&mut |e| {
                    n += usize::from(matches!(e, Expr::Select(..)));
                }),
                _ => {}
            }
        }
        n
    }

    fn count_loops(stmts: &[Stmt]) -> usize {
        stmts
            .iter()
            .map(|s| match s {
                Stmt::For { body, .. } => 1 + count_loops(body),
                Stmt::If { body, .. } => count_loops(body),
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn a_padding_copy_gets_a_select_free_interior() {
        // Pad 1 on a 5x4 image: rows and columns split into border / interior / border.
        let g = workloads::conv2d(1, 2, 5, 4, 3, 3, 3, 1, 1, 1, 1).expect("conv2d");
        let p = lower(&g, &Schedule::naive()).expect("lowers");
        let pad = &p.nests[0];
        // n, c, then h split in 3, each with w split in 3: 2 + 3 * (1 + 3) loops.
        assert_eq!(count_loops(&pad.body), 14);
        // Every part decides the test: the borders store zeros, the interior copies.
        assert_eq!(selects(&pad.body), 0);
        // The convolution itself reads the padded copy unguarded: nothing to split there.
        assert_eq!(selects(&p.nests[1].body), 0);
    }

    #[test]
    fn a_test_on_another_loop_is_not_a_reason_to_split() {
        let test = Expr::Axis(1).cmp(CmpOp::Ge, Expr::int(1));
        assert_eq!(true_range(&test, 0, 8, &[8, 8]), None);
        // 3 * v + w >= 4 for every w in 0..2 once v >= 2 (v = 1 gives 3 + 0 < 4).
        let test = (Expr::Axis(0) * Expr::int(3) + Expr::Axis(1)).cmp(CmpOp::Ge, Expr::int(4));
        assert_eq!(true_range(&test, 0, 8, &[8, 2]), Some((2, 8)));
        // v * w is not affine in v.
        let test = (Expr::Axis(0) * Expr::Axis(1)).cmp(CmpOp::Lt, Expr::int(4));
        assert_eq!(true_range(&test, 0, 8, &[8, 2]), None);
    }

    #[test]
    fn decided_tests_fold_selects_and_guards() {
        let vars = [4, 3];
        let sel = Expr::select(
            Expr::Axis(0)
                .cmp(CmpOp::Lt, Expr::int(4))
                .and(Expr::Axis(1).cmp(CmpOp::Ge, Expr::int(0))),
            Expr::f32(1.0),
            Expr::f32(2.0),
        );
        assert_eq!(simplify_expr(sel, &vars), Expr::f32(1.0));
        let sel = Expr::select(
            Expr::Axis(0).cmp(CmpOp::Ge, Expr::int(4)),
            Expr::f32(1.0),
            Expr::f32(2.0),
        );
        assert_eq!(simplify_expr(sel, &vars), Expr::f32(2.0));
        // Undecided: kept.
        let sel = Expr::select(
            Expr::Axis(0).cmp(CmpOp::Ge, Expr::int(2)),
            Expr::f32(1.0),
            Expr::f32(2.0),
        );
        assert!(matches!(simplify_expr(sel, &vars), Expr::Select(..)));
    }
}
