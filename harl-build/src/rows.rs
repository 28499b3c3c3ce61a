//! Row chains: consecutive stages that can all run inside one loop over shared leading axes
//! ([`crate::schedule::Step::ComputeWithin`]).
//!
//! Softmax (max, exponentials, sum, quotient) and layer norm (mean, variance, normalised
//! output) are reductions over a row followed by stages that read those results at the same
//! row. Run as separate nests, every stage streams the whole tensor through memory again; run
//! row by row inside one parallel loop, a row's intermediates are still in L1 when the next
//! stage reads them, and the kernel makes one pass.

use crate::lower::substitute_axes;
use harl_te::{Expr, Graph, TensorRef};

/// Largest slice (bytes, all members together) a chain keeps per row: well inside L2, so a
/// row's intermediates stay cached between its stages.
pub const MAX_ROW_BYTES: usize = 256 << 10;

/// Fewest rows a chain needs: one row per parallel task, so a kernel with fewer rows than
/// this keeps its stages apart (each parallel over its own elements).
pub const MIN_ROWS: usize = 8;

/// Stages (graph indices, in order) to compute row by row inside the first one's loops over
/// their `k` leading axes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RowChain {
    /// The member stages; the first is a reduction over the rest of each row.
    pub members: Vec<usize>,
    /// How many leading axes form a row's index.
    pub k: usize,
}

/// The row chains of `graph` once the stages marked in `inlined` are inlined: each starts at
/// a reduction whose spatial axes are the rows (`k` = its spatial rank) and takes the
/// materialised stages after it while each has those rows as leading axes, reduces (if it
/// does) over one axis of the rest of the row only, reads an earlier member, and reads
/// members only at its own row.
pub fn row_chains(graph: &Graph, inlined: &[bool]) -> Vec<RowChain> {
    let kept: Vec<usize> = (0..graph.stages.len())
        .filter(|&s| !inlined.get(s).copied().unwrap_or(false))
        .collect();
    let mut chains = Vec::new();
    let mut i = 0;
    while i < kept.len() {
        let first = kept[i];
        let stage = &graph.stages[first];
        let k = stage.n_spatial();
        let row_reduction = stage.reduce.as_ref().is_some_and(|r| r.extents.len() == 1);
        if !row_reduction || k == 0 {
            i += 1;
            continue;
        }
        let rows = &stage.shape[..k];
        let mut members = vec![first];
        for &c in &kept[i + 1..] {
            if !joins(graph, inlined, &members, rows, c) {
                break;
            }
            members.push(c);
        }
        let n_rows: usize = rows.iter().product();
        let row_bytes: usize = members
            .iter()
            .map(|&m| {
                let st = &graph.stages[m];
                st.size() / n_rows.max(1) * crate::default_schedule::elem_bytes(st.dtype)
            })
            .sum();
        if members.len() >= 2 && n_rows >= MIN_ROWS && row_bytes <= MAX_ROW_BYTES {
            i += members.len();
            chains.push(RowChain { members, k });
        } else {
            i += 1;
        }
    }
    chains
}

/// Whether stage `c` can join a chain of `members` over `rows`.
fn joins(graph: &Graph, inlined: &[bool], members: &[usize], rows: &[usize], c: usize) -> bool {
    let cs = &graph.stages[c];
    let k = rows.len();
    if cs.n_spatial() < k || cs.shape[..k] != *rows {
        return false;
    }
    if let Some(r) = &cs.reduce {
        if r.extents.len() != 1 || cs.n_spatial() != k {
            return false;
        }
    }
    let body = inlined_body(graph, inlined, c);
    let mut reads_member = false;
    let mut ok = true;
    body.visit(&mut |e| {
        if let Expr::Load(TensorRef::Stage(t), idx) = e {
            if members.contains(t) {
                reads_member = true;
                ok &= idx.len() >= k && (0..k).all(|a| idx[a] == Expr::Axis(a));
            } else if *t > members[0] {
                ok = false;
            }
        }
    });
    ok && reads_member
}

/// Stage `c`'s body with the inlined stages it reads substituted, as lowering will see it.
fn inlined_body(graph: &Graph, inlined: &[bool], c: usize) -> Expr {
    let mut body = graph.stages[c].body.clone();
    // Each round substitutes one level; inlined stages read only earlier stages, so this
    // ends within the graph's depth.
    for _ in 0..graph.stages.len() {
        let mut changed = false;
        body = body.map(&mut |e| match e {
            Expr::Load(TensorRef::Stage(t), idx) if inlined.get(t).copied().unwrap_or(false) => {
                changed = true;
                substitute_axes(&graph.stages[t].body, &idx)
            }
            other => other,
        });
        if !changed {
            break;
        }
    }
    body
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_te::ops::workloads as w;

    #[test]
    fn softmax_and_layer_norm_are_one_chain() {
        let g = w::softmax(64, 128).expect("softmax");
        // Max, exponentials, sum, quotient: nothing inlined (the exponentials are kept).
        let none = vec![false; g.stages.len()];
        assert_eq!(
            row_chains(&g, &none),
            [RowChain {
                members: vec![0, 1, 2, 3],
                k: 1
            }]
        );
        let g = w::layer_norm(32, 768).expect("layer_norm");
        let none = vec![false; g.stages.len()];
        let chains = row_chains(&g, &none);
        assert_eq!(chains.len(), 1);
        assert_eq!(chains[0].members.len(), g.stages.len());
    }

    #[test]
    fn matmuls_few_rows_and_wide_rows_are_not_chains() {
        let g = w::matmul(64, 64, 64).expect("matmul");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
        let g = w::softmax(2, 128).expect("softmax");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
        let g = w::softmax(64, 1 << 16).expect("softmax");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
    }
}
