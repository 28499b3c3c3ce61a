//! Bound inference for shared-memory staging ([`crate::schedule::Step::SharedRead`]).
//!
//! At the staging point the loop variables split in two: the *fixed* ones (the block index,
//! the loops enclosing the staging loop, and their parts) have one value for the whole block
//! during one iteration, the *varying* ones (the thread index and its parts, and every variable
//! bound inside the staging loop) range over their extents. Every index of a staged input must
//! be affine in the variables; its fixed part then gives the origin of the box, the range of its
//! varying part the extent. Fixed parts must agree between the reads of one dimension (a read
//! at a block-dependent offset of another read would need a box per offset).

use crate::affine::{affine, Affine};
use crate::loop_ir::{SharedBox, Stmt};
use harl_te::graph::interval;
use harl_te::{Expr, TensorRef};
use std::collections::HashSet;

/// Shared memory a block may use for staged inputs (the static limit of every CUDA device).
pub const MAX_SHARED_BYTES: usize = 48 * 1024;

/// The variables `stmts` bind (loop and let variables), added to `out`.
pub fn bound_vars(stmts: &[Stmt], out: &mut HashSet<usize>) {
    for s in stmts {
        match s {
            Stmt::For { var, body, .. } => {
                out.insert(*var);
                bound_vars(body, out);
            }
            Stmt::Let { var, .. } => {
                out.insert(*var);
            }
            Stmt::If { body, .. } | Stmt::Shared { body, .. } => bound_vars(body, out),
            _ => {}
        }
    }
}

/// Every expression of `stmts`, passed to `f`.
fn visit_exprs(stmts: &[Stmt], f: &mut dyn FnMut(&Expr)) {
    for s in stmts {
        match s {
            Stmt::For { body, .. } => visit_exprs(body, f),
            Stmt::Let { value, .. } => f(value),
            Stmt::If { cond, body } => {
                f(cond);
                visit_exprs(body, f);
            }
            Stmt::Shared { boxes, body } => {
                boxes.iter().flat_map(|b| &b.origin).for_each(&mut *f);
                visit_exprs(body, f);
            }
            Stmt::Store { index, value, .. } => {
                index.iter().for_each(&mut *f);
                f(value);
            }
            Stmt::AccUpdate { index, value, .. } => {
                f(index);
                f(value);
            }
            Stmt::AccStore {
                index,
                dest,
                epilogue,
                ..
            } => {
                f(index);
                dest.iter().for_each(&mut *f);
                if let Some(e) = epilogue {
                    f(&e.value);
                }
            }
            Stmt::AccDecl { .. } => {}
        }
    }
}

/// The box of graph input `input` that `body` reads, when the variables in `varying` range over
/// their extents and all others are fixed (see the module docs).
pub fn footprint(
    body: &[Stmt],
    input: usize,
    varying: &HashSet<usize>,
    var_extents: &[usize],
) -> Result<SharedBox, String> {
    let mut reads: Vec<Vec<Expr>> = Vec::new();
    visit_exprs(body, &mut |e| {
        e.visit(&mut |x| {
            if let Expr::Load(TensorRef::Input(i), idx) = x {
                if *i == input {
                    reads.push(idx.clone());
                }
            }
        })
    });
    let Some(first) = reads.first() else {
        return Err(format!("input {input} is not read inside the staging loop"));
    };
    let dims = first.len();
    if dims == 0 {
        return Err(format!(
            "input {input} is a scalar; there is nothing to stage"
        ));
    }
    let mut fixed: Vec<Option<Affine>> = vec![None; dims];
    let mut range = vec![(i64::MAX, i64::MIN); dims];
    for idx in &reads {
        for (d, e) in idx.iter().enumerate() {
            let a = affine(e).ok_or_else(|| {
                format!("input {input} is read at a non-affine index, which cannot be staged")
            })?;
            let (mut fix, mut var) = (Affine::default(), Affine::default());
            var.constant = a.constant;
            for (v, c) in a.terms {
                let part = if varying.contains(&v) {
                    &mut var
                } else {
                    &mut fix
                };
                part.terms.insert(v, c);
            }
            match &fixed[d] {
                Some(f) if *f != fix => {
                    return Err(format!(
                        "input {input} is read at block-dependent offsets that differ between reads"
                    ))
                }
                Some(_) => {}
                None => fixed[d] = Some(fix),
            }
            let (lo, hi) = interval(&var.to_expr(), var_extents);
            range[d] = (range[d].0.min(lo), range[d].1.max(hi));
        }
    }
    let mut origin = Vec::with_capacity(dims);
    let mut extents = Vec::with_capacity(dims);
    for (f, (lo, hi)) in fixed.into_iter().zip(range) {
        let f = f.unwrap_or_default();
        let shifted = Affine {
            constant: f.constant + lo,
            terms: f.terms,
        };
        origin.push(shifted.to_expr());
        extents.push(usize::try_from(hi - lo + 1).map_err(|_| "empty read range".to_string())?);
    }
    Ok(SharedBox {
        input,
        origin,
        extents,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ReduceOp;

    fn load(idx: Vec<Expr>) -> Expr {
        Expr::Load(TensorRef::Input(0), idx)
    }

    #[test]
    fn a_gemm_tile_box_spans_the_threads_and_inner_loops() {
        // A[b*32 + t*4 + i, r0*8 + r1]: b, r0 fixed; t (8), i (4), r1 (8) varying.
        let (b, t, r0, r1, i) = (0, 1, 2, 3, 4);
        let extents = [16, 8, 4, 8, 4];
        let row = Expr::Axis(b) * Expr::int(32) + Expr::Axis(t) * Expr::int(4) + Expr::Axis(i);
        let col = Expr::Axis(r0) * Expr::int(8) + Expr::Axis(r1);
        let body = vec![Stmt::AccUpdate {
            index: Expr::Axis(i),
            op: ReduceOp::Sum,
            value: load(vec![row, col]),
        }];
        let varying = HashSet::from([t, r1, i]);
        let bx = footprint(&body, 0, &varying, &extents).expect("affine");
        assert_eq!(bx.extents, vec![32, 8]);
        assert_eq!(
            bx.origin,
            vec![Expr::Axis(b) * Expr::int(32), Expr::Axis(r0) * Expr::int(8)]
        );
    }

    #[test]
    fn offsets_widen_the_box_and_move_its_origin() {
        // x[y + ry - 1] and x[y + ry + 1] with y = b*4 + t: the box starts one before.
        let (b, t, ry) = (0, 1, 2);
        let extents = [8, 4, 3];
        let at =
            |k: i64| Expr::Axis(b) * Expr::int(4) + Expr::Axis(t) + Expr::Axis(ry) + Expr::int(k);
        let body = vec![Stmt::AccUpdate {
            index: Expr::int(0),
            op: ReduceOp::Sum,
            value: load(vec![at(-1)]) + load(vec![at(1)]),
        }];
        let bx = footprint(&body, 0, &HashSet::from([t, ry]), &extents).expect("affine");
        assert_eq!(bx.extents, vec![8]);
        assert_eq!(
            bx.origin,
            vec![Expr::Axis(b) * Expr::int(4) + Expr::int(-1)]
        );
    }

    #[test]
    fn non_affine_and_disagreeing_reads_are_errors() {
        let body = vec![Stmt::AccUpdate {
            index: Expr::int(0),
            op: ReduceOp::Sum,
            value: load(vec![Expr::Axis(0) * Expr::Axis(1)]),
        }];
        assert!(footprint(&body, 0, &HashSet::from([1]), &[4, 4]).is_err());
        let body = vec![Stmt::AccUpdate {
            index: Expr::int(0),
            op: ReduceOp::Sum,
            value: load(vec![Expr::Axis(0)]) + load(vec![Expr::Axis(0) * Expr::int(2)]),
        }];
        assert!(footprint(&body, 0, &HashSet::new(), &[4]).is_err());
        assert!(footprint(&[], 0, &HashSet::new(), &[]).is_err());
        // A scalar input: nothing to stage (an empty box would print `sh0[]`).
        let body = vec![Stmt::AccUpdate {
            index: Expr::int(0),
            op: ReduceOp::Sum,
            value: load(vec![]),
        }];
        assert!(footprint(&body, 0, &HashSet::new(), &[]).is_err());
    }
}
