//! Trailing axes merged where every access reads them as one contiguous run.
//!
//! A 1x1 convolution of stride 1 without padding, `y[n, f, h, w] = sum_c w[f, c] x[n, c, h, w]`,
//! reads `(h, w)` as the two last, contiguous dimensions of every tensor it touches: it is the
//! matrix product `y[n, f, p] = sum_c w[f, c] x[n, c, p]` over the `H * W` pixels `p`. Lowered
//! in four dimensions its vector axis is a 56- or 14-wide row (or the filters, in a layout the
//! write-back transposes); over the flattened pixels it is a long contiguous axis and the
//! register tile, panels and epilogue of a GEMM apply. ONNX import builds that view itself for
//! its pointwise convolutions; [`merge_trailing_axes`] finds it in any graph, so a kernel
//! declared with the op library or the DSL gets the same code.
//!
//! The rewrite is a view: a merged tensor keeps its elements in the same order, so its buffer,
//! the kernel's arguments and the interpreter's results are unchanged; only the loops differ.
//! The merge applies when a reduction with at least [`MIN_ROWS`] rows before the pair and
//! [`MIN_PIXELS`] pixels in it merges (the importer's measured rule for rows: with fewer the
//! register tile down them is short, and the 4-D layout was faster; a short pixel axis is
//! mostly tail), and every stage and tensor that shares those axes merges with it.

use crate::expr::{BinaryOp, DType, Expr, TensorRef};
use crate::graph::{Graph, Stage};

/// The fewest rows (extent of the axis before the merged pair) a reduction must have.
pub const MIN_ROWS: usize = 64;

/// The fewest pixels (the merged pair's length) a reduction must have. ResNet's and
/// MobileNet-V2's 7x7 pointwise convolutions (49 pixels: three vectors and a one-lane tail)
/// ran 5-12% slower merged than in the 4-D layout that vectorises the filters; at 14x14 and
/// above the merged form won or tied (`harl-bench models --only _1x1_,mbv2_pw`).
pub const MIN_PIXELS: usize = 64;

/// `g` with the two trailing axes of each tensor and stage merged wherever the view is exact
/// and it turns a reduction into a product over a long contiguous axis; `g` itself otherwise.
/// The result computes what `g` computes, element for element.
pub fn merge_trailing_axes(g: Graph) -> Graph {
    if !g
        .stages
        .iter()
        .any(|st| st.reduce.is_some() && candidate(st))
    {
        return g;
    }
    let unit = without_unit_reductions(&g);
    let Some(merged) = plan(&unit) else {
        return g;
    };
    match rewrite(&unit, &merged) {
        Some(out) if out.validate().is_ok() => out,
        _ => g,
    }
}

/// `g` with each reduce axis of extent 1 read as 0 (a 1x1 window's taps: `h + ry` is `h`).
fn without_unit_reductions(g: &Graph) -> Graph {
    let mut out = g.clone();
    for st in &mut out.stages {
        let Some(r) = &st.reduce else { continue };
        let ns = st.shape.len();
        let unit: Vec<bool> = r.extents.iter().map(|&e| e == 1).collect();
        if !unit.contains(&true) {
            continue;
        }
        st.body = st.body.map(&mut |e| match e {
            Expr::Axis(a) if a >= ns && unit.get(a - ns) == Some(&true) => Expr::int(0),
            Expr::Binary(BinaryOp::Add, a, b) if is_int(&a, 0) => *b,
            Expr::Binary(BinaryOp::Add | BinaryOp::Sub, a, b) if is_int(&b, 0) => *a,
            Expr::Binary(BinaryOp::Mul, a, b) if is_int(&a, 0) || is_int(&b, 0) => Expr::int(0),
            Expr::Binary(BinaryOp::Mul, a, b) if is_int(&b, 1) => *a,
            Expr::Binary(BinaryOp::Mul, a, b) if is_int(&a, 1) => *b,
            other => other,
        });
    }
    out
}

fn is_int(e: &Expr, v: i64) -> bool {
    matches!(e, Expr::Const(c, DType::I32) if *c == v as f64)
}

/// Tensors as one index space: the inputs, then the stages.
fn id(g: &Graph, t: TensorRef) -> usize {
    match t {
        TensorRef::Input(i) => i,
        TensorRef::Stage(s) => g.inputs.len() + s,
    }
}

/// How a load indexes its tensor's two trailing dimensions.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Access {
    /// The reading stage's own two trailing spatial axes, over the same extents.
    Pair,
    /// Two in-bounds integer constants (a broadcast, as a bias `[F, 1, 1]` is read).
    Fixed(i64, i64),
    /// Anything else.
    Other,
}

fn constant(e: &Expr, extent: usize) -> Option<i64> {
    match e {
        Expr::Const(v, DType::I32) if v.fract() == 0.0 && *v >= 0.0 && (*v as usize) < extent => {
            Some(*v as i64)
        }
        _ => None,
    }
}

fn access(g: &Graph, stage: usize, t: TensorRef, idx: &[Expr]) -> Access {
    let shape = g.shape(t);
    let Some(r) = idx
        .len()
        .checked_sub(2)
        .filter(|_| shape.len() == idx.len())
    else {
        return Access::Other;
    };
    let st = &g.stages[stage].shape;
    if let Some(p) = st.len().checked_sub(2) {
        let pair = matches!((&idx[r], &idx[r + 1]),
            (Expr::Axis(a), Expr::Axis(b)) if *a == p && *b == p + 1);
        if pair && shape[r] == st[p] && shape[r + 1] == st[p + 1] {
            return Access::Pair;
        }
    }
    match (
        constant(&idx[r], shape[r]),
        constant(&idx[r + 1], shape[r + 1]),
    ) {
        (Some(a), Some(b)) => Access::Fixed(a, b),
        _ => Access::Other,
    }
}

/// Which tensors merge (indexed by [`id`]), or `None` when no reduction would.
fn plan(g: &Graph) -> Option<Vec<bool>> {
    let n_in = g.inputs.len();
    let mut merged: Vec<bool> = g
        .inputs
        .iter()
        .map(|p| p.shape.len() >= 2)
        .chain(g.stages.iter().map(candidate))
        .collect();
    let any_reduction = |merged: &[bool]| {
        g.stages
            .iter()
            .enumerate()
            .any(|(s, st)| st.reduce.is_some() && merged[n_in + s])
    };
    if !any_reduction(&merged) {
        return None;
    }
    loop {
        let mut changed = false;
        let mut unmerge = |merged: &mut Vec<bool>, i: usize| {
            if merged[i] {
                merged[i] = false;
                changed = true;
            }
        };
        for (s, stage) in g.stages.iter().enumerate() {
            let me = n_in + s;
            let p = stage.shape.len().checked_sub(2);
            let (mut uses, mut covered) = (0usize, 0usize);
            stage.body.visit(&mut |e| match e {
                Expr::Axis(a) if p.is_some_and(|p| *a == p || *a == p + 1) => uses += 1,
                Expr::Load(t, idx) => {
                    let ti = id(g, *t);
                    match access(g, s, *t, idx) {
                        Access::Pair if merged[ti] && merged[me] => covered += 2,
                        Access::Pair => {
                            unmerge(&mut merged, ti);
                            unmerge(&mut merged, me);
                        }
                        Access::Fixed(..) => {}
                        Access::Other => unmerge(&mut merged, ti),
                    }
                }
                _ => {}
            });
            if uses > covered {
                unmerge(&mut merged, me);
            }
        }
        if !changed {
            break;
        }
    }
    any_reduction(&merged).then_some(merged)
}

/// Whether stage `st` may merge at all: two spatial axes, and for a reduction, rows before
/// them and at least [`MIN_PIXELS`] pixels in the pair, neither of them a unit axis (a global
/// pool's `1 x 1` output gains nothing, and its workload key would change for no reason).
fn candidate(st: &Stage) -> bool {
    let n = st.shape.len();
    match st.reduce {
        None => n >= 2,
        Some(_) => {
            n >= 3
                && st.shape[n - 3] >= MIN_ROWS
                && st.shape[n - 2..].iter().all(|&e| e > 1)
                && st.shape[n - 2].saturating_mul(st.shape[n - 1]) >= MIN_PIXELS
        }
    }
}

/// `shape` with its two trailing extents as one.
fn merge_shape(shape: &[usize]) -> Option<Vec<usize>> {
    let r = shape.len().checked_sub(2)?;
    let mut out = shape[..r].to_vec();
    out.push(shape[r].checked_mul(shape[r + 1])?);
    Some(out)
}

fn rewrite(g: &Graph, merged: &[bool]) -> Option<Graph> {
    let mut out = g.clone();
    for (i, ph) in out.inputs.iter_mut().enumerate() {
        if merged[i] {
            ph.shape = merge_shape(&ph.shape)?;
        }
    }
    for s in 0..g.stages.len() {
        let me = merged[g.inputs.len() + s];
        let body = rewrite_expr(g, merged, s, me, &g.stages[s].body)?;
        let st = &mut out.stages[s];
        st.body = body;
        if me {
            st.shape = merge_shape(&st.shape)?;
        }
    }
    Some(out)
}

/// Stage `s`'s expression `e` in the merged view: merged tensors read through one trailing
/// index, and, when the stage itself merges, its axes after the pair one lower.
fn rewrite_expr(g: &Graph, merged: &[bool], s: usize, me: bool, e: &Expr) -> Option<Expr> {
    let p = g.stages[s].shape.len().saturating_sub(2);
    let rw = |e: &Expr| rewrite_expr(g, merged, s, me, e);
    Some(match e {
        Expr::Axis(a) if me && *a > p => {
            // The plan merged this stage only if every use of `p + 1` sits in a merged load.
            if *a == p + 1 {
                return None;
            }
            Expr::Axis(a - 1)
        }
        Expr::Const(..) | Expr::Axis(_) => e.clone(),
        Expr::Load(t, idx) if merged[id(g, *t)] => {
            let r = idx.len().checked_sub(2)?;
            let mut out: Vec<Expr> = idx[..r].iter().map(rw).collect::<Option<_>>()?;
            out.push(match access(g, s, *t, idx) {
                Access::Pair => Expr::Axis(p),
                Access::Fixed(a, b) => {
                    let w = i64::try_from(g.shape(*t)[r + 1]).ok()?;
                    Expr::int(a.checked_mul(w)?.checked_add(b)?)
                }
                Access::Other => return None,
            });
            Expr::Load(*t, out)
        }
        Expr::Load(t, idx) => Expr::Load(*t, idx.iter().map(rw).collect::<Option<_>>()?),
        Expr::Unary(op, a) => Expr::Unary(*op, Box::new(rw(a)?)),
        Expr::Cast(d, a) => Expr::Cast(*d, Box::new(rw(a)?)),
        Expr::Binary(op, a, b) => Expr::Binary(*op, Box::new(rw(a)?), Box::new(rw(b)?)),
        Expr::Cmp(op, a, b) => Expr::Cmp(*op, Box::new(rw(a)?), Box::new(rw(b)?)),
        Expr::Select(c, a, b) => Expr::Select(Box::new(rw(c)?), Box::new(rw(a)?), Box::new(rw(b)?)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::{GraphBuilder, ReduceOp};
    use crate::interp;
    use crate::ops::{self, Conv2dParams};
    use proptest::prelude::*;

    /// A convolution with a bias, optionally a residual add, then ReLU, as a network has it:
    /// the graph as built, before any merge.
    pub(super) fn conv(
        c: usize,
        hw: usize,
        f: usize,
        k: usize,
        stride: usize,
        pad: usize,
        residual: bool,
    ) -> Graph {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[1, c, hw, hw], DType::F32);
        let w = b.weight("w", &[f, c, k, k], DType::F32);
        let bias = b.weight("bias", &[f, 1, 1], DType::F32);
        let p = Conv2dParams {
            stride: (stride, stride),
            pad: (pad, pad),
            dilation: (1, 1),
            groups: 1,
        };
        let y = ops::conv2d(&mut b, x, w, p).expect("conv2d");
        let mut y = ops::add(&mut b, y, bias).expect("bias");
        if residual {
            let out = b.shape(y);
            let r = b.input("residual", &out, DType::F32);
            y = ops::add(&mut b, y, r).expect("residual");
        }
        ops::relu(&mut b, y).expect("relu");
        b.graph().clone()
    }

    fn outputs(g: &Graph, seed: u64) -> Vec<f64> {
        let mut s = seed | 1;
        let inputs: Vec<Vec<f64>> = g
            .inputs
            .iter()
            .map(|p| {
                (0..p.shape.iter().product::<usize>())
                    .map(|_| {
                        s ^= s << 13;
                        s ^= s >> 7;
                        s ^= s << 17;
                        (s % 2001) as f64 / 1000.0 - 1.0
                    })
                    .collect()
            })
            .collect();
        let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
        interp::run(g, &refs).expect("interpreter runs")
    }

    #[test]
    fn a_pointwise_convolution_becomes_a_product_over_pixels() {
        let g = conv(8, 8, 64, 1, 1, 0, true);
        let m = merge_trailing_axes(g.clone());
        let conv = m
            .stages
            .iter()
            .find(|s| s.reduce.is_some())
            .expect("the reduction");
        assert_eq!(conv.shape, vec![1, 64, 64]);
        assert_eq!(
            m.inputs[0].shape,
            vec![1, 8, 64],
            "x is read as [n, c, pixels]"
        );
        assert_eq!(
            m.inputs[2].shape,
            vec![64, 1],
            "the bias keeps its broadcast"
        );
        assert_eq!(
            m.stages.last().map(|s| s.shape.clone()),
            Some(vec![1, 64, 64])
        );
        assert_ne!(m.workload_key(), g.workload_key());
        assert_eq!(outputs(&m, 7), outputs(&g, 7));
    }

    #[test]
    fn graphs_without_a_contiguous_pair_or_with_few_rows_stay_as_built() {
        for g in [
            conv(8, 8, 64, 3, 1, 1, false), // padded taps
            conv(8, 8, 64, 1, 2, 0, false), // strided pixels
            conv(8, 8, 32, 1, 1, 0, true),  // 32 filters: a short register tile
            conv(8, 7, 64, 1, 1, 0, true),  // 49 pixels: mostly tail
            ops::workloads::matmul(64, 32, 48).expect("matmul"),
            ops::workloads::softmax(64, 80).expect("softmax"),
        ] {
            assert_eq!(merge_trailing_axes(g.clone()), g);
        }
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[64, 8, 8], DType::F32);
        ops::relu(&mut b, x).expect("relu");
        let g = b.graph().clone();
        assert_eq!(merge_trailing_axes(g.clone()), g, "no reduction, no merge");
    }

    #[test]
    fn a_global_pool_keeps_its_unit_pixels() {
        // As the importer builds GlobalAveragePool: a sum over H x W into [n, c, 1, 1].
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[1, 128, 7, 7], DType::F32);
        let ax = Expr::axis;
        let body = Expr::Load(x, vec![ax(0), ax(1), ax(4), ax(5)]) * Expr::f32(1.0 / 49.0);
        b.reduce(
            "pool",
            &[1, 128, 1, 1],
            DType::F32,
            ReduceOp::Sum,
            &[7, 7],
            body,
        );
        let g = b.graph().clone();
        assert_eq!(merge_trailing_axes(g.clone()), g);
    }

    #[test]
    fn finish_merges_and_the_interpreter_agrees() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[2, 4, 8, 9], DType::F32);
        let w = b.weight("w", &[64, 4, 1, 1], DType::F32);
        let p = Conv2dParams {
            stride: (1, 1),
            pad: (0, 0),
            dilation: (1, 1),
            groups: 1,
        };
        ops::conv2d(&mut b, x, w, p).expect("conv2d");
        let built = b.graph().clone();
        let finished = b.finish().expect("finish");
        assert_eq!(finished.stages[0].shape, vec![2, 64, 72]);
        assert_eq!(outputs(&finished, 3), outputs(&built, 3));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(48))]
        /// Over convolutions of every kind the merge touches or must leave: it merges exactly
        /// the pointwise, unstrided, unpadded ones with enough filters, and the merged graph
        /// computes what the graph as built computes.
        #[test]
        fn merged_graphs_compute_what_they_were_built_to(
            c in 1usize..5,
            hw in prop::sample::select(vec![1usize, 3, 7, 8, 9]),
            f in prop::sample::select(vec![8usize, 63, 64, 70]),
            k in 1usize..3,
            stride in 1usize..3,
            pad in 0usize..2,
            residual in any::<bool>(),
        ) {
            prop_assume!(hw + 2 * pad >= k);
            let g = conv(c, hw, f, k, stride, pad, residual);
            let m = merge_trailing_axes(g.clone());
            let expect = k == 1 && stride == 1 && pad == 0 && f >= MIN_ROWS && hw > 1 && hw * hw >= MIN_PIXELS;
            prop_assert_eq!(m != g, expect);
            prop_assert_eq!(outputs(&m, 11), outputs(&g, 11));
        }
    }
}
