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

/// The row chains of `graph` once the stages marked in `inlined` are inlined. A chain starts
/// at either
/// - a reduction over one axis whose spatial axes are the rows (`k` = its spatial rank):
///   softmax's max, layer norm's mean; or
/// - a padding stage (a select) that the next materialised stage, a reduction, reads at its
///   own index along the leading `k` axes (batch and channel of a depthwise convolution):
///   each channel's padded plane is made just before the convolution reads it, while it is
///   in cache, instead of the whole padded copy going through memory first;
///
/// and takes the materialised stages after it while each has those rows as leading axes,
/// reduces (if it does, and is not a padding stage's convolution) over one axis of the rest
/// of the row only, reads an earlier member, and reads members only at its own row.
pub fn row_chains(graph: &Graph, inlined: &[bool]) -> Vec<RowChain> {
    let kept: Vec<usize> = (0..graph.stages.len())
        .filter(|&s| !inlined.get(s).copied().unwrap_or(false))
        .collect();
    let mut chains = Vec::new();
    let mut i = 0;
    while i < kept.len() {
        let first = kept[i];
        let stage = &graph.stages[first];
        let row_reduction = stage.reduce.as_ref().is_some_and(|r| r.extents.len() == 1)
            && walks_rows(&inlined_body(graph, inlined, first), stage.n_spatial());
        let inlined_padding = inlined_padding_rows(graph, inlined, first);
        let start = if row_reduction {
            Some((stage.n_spatial(), false))
        } else if let Some(k) = inlined_padding {
            // The convolution of a padding read in place: it starts the chain, its own
            // consumers join as for any chain.
            Some((k, false))
        } else {
            kept.get(i + 1)
                .and_then(|&c| padded_rows(graph, inlined, first, c))
                .map(|k| (k, true))
        };
        let Some((k, padded)) = start.filter(|&(k, _)| k > 0) else {
            i += 1;
            continue;
        };
        let rows = &stage.shape[..k];
        let mut members = vec![first];
        for &c in &kept[i + 1..] {
            // Only a padding stage's own consumer reduces over more than the rest of a row.
            let plane = padded && members.len() == 1;
            if !joins(graph, inlined, &members, rows, c, plane) {
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
        let enough = members.len() >= 2 || inlined_padding.is_some();
        if enough && n_rows >= MIN_ROWS && row_bytes <= MAX_ROW_BYTES {
            i += members.len();
            chains.push(RowChain { members, k });
        } else {
            i += 1;
        }
    }
    chains
}

/// Whether a reduction's body (spatial axes `0..ns`, reduce axis `ns`) walks each row of
/// what it reads along the reduction: the last index of every load uses no spatial axis, and
/// some load's last index is the reduction. A matmul's or convolution's right operand varies
/// along the output's axes in its last index instead: those are tiled, not fused by rows.
fn walks_rows(body: &Expr, ns: usize) -> bool {
    let mut along = false;
    let mut across = false;
    body.visit(&mut |e| {
        if let Expr::Load(_, idx) = e {
            if let Some(last) = idx.last() {
                last.visit(&mut |x| {
                    if let Expr::Axis(a) = x {
                        along |= *a == ns;
                        across |= *a < ns;
                    }
                });
            }
        }
    });
    along && !across
}

/// The leading axes along which reduction `c` reads padding stage `p` (a stage with a
/// select) at its own index, short of `p`'s whole rank; none if `c` does not read `p` so.
pub(crate) fn padded_rows(graph: &Graph, inlined: &[bool], p: usize, c: usize) -> Option<usize> {
    let (ps, cs) = (&graph.stages[p], &graph.stages[c]);
    let mut select = false;
    ps.body
        .visit(&mut |e| select |= matches!(e, Expr::Select(..)));
    if !select || ps.reduce.is_some() || cs.reduce.is_none() {
        return None;
    }
    let mut k = ps.n_spatial().min(cs.n_spatial());
    while k > 0 && ps.shape[..k] != cs.shape[..k] {
        k -= 1;
    }
    let mut reads = false;
    inlined_body(graph, inlined, c).visit(&mut |e| {
        if let Expr::Load(TensorRef::Stage(t), idx) = e {
            if *t == p {
                reads = true;
                let own = (0..k.min(idx.len()))
                    .take_while(|&a| idx[a] == Expr::Axis(a))
                    .count();
                k = k.min(own);
            }
        }
    });
    // Two axes at least (batch and channel): over the batch alone, a dense convolution would
    // lose its register tiles for little.
    (reads && k >= 2 && k < ps.n_spatial()).then_some(k)
}

/// The rows (leading axes) of reduction `c` when the padding stage it reads is inlined into
/// it (the default reads small padded planes in place, with masked loads): those
/// [`padded_rows`] gives with the padding kept.
pub fn inlined_padding_rows(graph: &Graph, inlined: &[bool], c: usize) -> Option<usize> {
    graph.stages.get(c)?.reduce.as_ref()?;
    let mut read = Vec::new();
    graph.stages[c].body.visit(&mut |e| {
        if let Expr::Load(TensorRef::Stage(p), _) = e {
            if inlined.get(*p).copied().unwrap_or(false) {
                read.push(*p);
            }
        }
    });
    // `padded_rows` takes only a padding stage (one with a select).
    read.into_iter().find_map(|p| {
        let mut kept = inlined.to_vec();
        kept[p] = false;
        padded_rows(graph, &kept, p, c)
    })
}

/// Whether stage `c` can join a chain of `members` over `rows`; `plane`: it may reduce over
/// any axes and keep spatial axes past the rows (a padding stage's convolution).
fn joins(
    graph: &Graph,
    inlined: &[bool],
    members: &[usize],
    rows: &[usize],
    c: usize,
    plane: bool,
) -> bool {
    let cs = &graph.stages[c];
    let k = rows.len();
    if cs.n_spatial() < k || cs.shape[..k] != *rows {
        return false;
    }
    if let Some(r) = &cs.reduce {
        if !plane && (r.extents.len() != 1 || cs.n_spatial() != k) {
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
        // Max, exponentials, sum, reciprocal, product: nothing inlined (the exponentials and
        // the reciprocal are kept).
        let none = vec![false; g.stages.len()];
        assert_eq!(
            row_chains(&g, &none),
            [RowChain {
                members: vec![0, 1, 2, 3, 4],
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
    fn a_depthwise_convolution_runs_within_its_padding_per_channel() {
        // pad [1, 16, 16, 16], depthwise conv [1, 16, 7, 7] (stride 2): rows are (n, c).
        let g = w::depthwise_conv2d(1, 16, 14, 14, 3, 3, 2, 1, 1).expect("depthwise");
        let none = vec![false; g.stages.len()];
        let chains = row_chains(&g, &none);
        assert_eq!(chains.len(), 1, "{chains:?}");
        assert_eq!(chains[0].k, 2);
        assert_eq!(chains[0].members[..2], [0, 1]);
        // A dense convolution reads every channel of its padded input: no chain.
        let g = w::conv2d(1, 16, 14, 14, 16, 3, 3, 1, 1, 1, 1).expect("conv2d");
        let none = vec![false; g.stages.len()];
        assert!(row_chains(&g, &none).is_empty());
    }

    #[test]
    fn matmuls_few_rows_and_wide_rows_are_not_chains() {
        let g = w::matmul(64, 64, 64).expect("matmul");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
        // Nor a dense layer whose bias reads the product at its own index.
        let g = w::dense_bias_relu(64, 64, 64).expect("dense");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
        let g = w::softmax(2, 128).expect("softmax");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
        let g = w::softmax(64, 1 << 16).expect("softmax");
        assert!(row_chains(&g, &vec![false; g.stages.len()]).is_empty());
    }
}
