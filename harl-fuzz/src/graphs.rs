//! The fixed graphs the cache-line and steps targets schedule. Built once per process: the
//! fuzzer calls a target millions of times and the graphs never change.

use std::sync::OnceLock;

use harl_build::codegen::KernelMeta;
use harl_te::ops::{self, workloads as w};
use harl_te::{load, BinaryOp, DType, Expr, Graph, GraphBuilder};

/// A graph and the kernel name it is emitted under.
pub(crate) type Named = (&'static str, Graph);

/// The graphs every cache line is lowered against: one of each kind of stage structure a record
/// may meet (a plain reduction, a padded convolution, a multi-stage reduction chain, a grouped
/// convolution, an elementwise chain), small so that lowering and codegen stay fast.
pub(crate) fn cache_graphs() -> &'static [Named] {
    static GRAPHS: OnceLock<Vec<Named>> = OnceLock::new();
    GRAPHS.get_or_init(|| {
        vec![
            ("matmul", w::matmul(16, 32, 16).expect("matmul")),
            (
                "conv2d",
                w::conv2d(1, 4, 8, 8, 8, 3, 3, 1, 1, 1, 1).expect("conv2d"),
            ),
            ("softmax", w::softmax(4, 32).expect("softmax")),
            (
                "depthwise",
                w::depthwise_conv2d(1, 8, 10, 10, 3, 3, 2, 1, 1).expect("depthwise"),
            ),
            ("chain", elementwise_chain()),
        ]
    })
}

/// The graphs the steps target picks from (by index, modulo the length): the cache graphs plus
/// the rest of the op library, at sizes with prime, odd and power-of-two extents so that splits
/// meet remainders.
pub(crate) fn step_graphs() -> &'static [Named] {
    static GRAPHS: OnceLock<Vec<Named>> = OnceLock::new();
    GRAPHS.get_or_init(|| {
        let mut all = cache_graphs().to_vec();
        all.extend([
            ("matmul_odd", w::matmul(7, 13, 5).expect("matmul")),
            (
                "dense_bias_relu",
                w::dense_bias_relu(8, 16, 24).expect("dense"),
            ),
            ("batch_matmul", w::batch_matmul(2, 4, 8, 4).expect("bmm")),
            (
                "conv1d",
                w::conv1d(1, 4, 17, 6, 3, 2, 1, 1, 2).expect("conv1d"),
            ),
            (
                "conv3d",
                w::conv3d(1, 2, 4, 4, 4, 2, 3, 3, 3, 1, 1, 1, 1).expect("conv3d"),
            ),
            (
                "conv2d_transpose",
                w::conv2d_transpose(1, 2, 5, 5, 3, 3, 3, 2, 1, 1).expect("conv2d_transpose"),
            ),
            ("layer_norm", w::layer_norm(3, 16).expect("layer_norm")),
            ("int_mix", int_mix()),
            ("matmul_1", w::matmul(1, 1, 1).expect("matmul")),
        ]);
        all
    })
}

/// The names `Builder` would give a registered graph's parameters (they are identifiers here).
pub(crate) fn meta(name: &str, graph: &Graph) -> KernelMeta {
    KernelMeta {
        name: name.to_string(),
        params: graph.inputs.iter().map(|p| p.name.clone()).collect(),
        output: "out".into(),
    }
}

/// `sigmoid(gelu(x + b) * 0.5)` with a broadcast bias: several inlinable elementwise stages.
fn elementwise_chain() -> Graph {
    let mut g = GraphBuilder::new();
    let x = g.input("x", &[6, 40], DType::F32);
    let b = g.input("b", &[40], DType::F32);
    let s = ops::add(&mut g, x, b).expect("add");
    let s = ops::gelu(&mut g, s).expect("gelu");
    let s = ops::scale(&mut g, s, 0.5).expect("scale");
    ops::sigmoid(&mut g, s).expect("sigmoid");
    g.finish().expect("chain")
}

/// An i32 reduction over `x % 3` followed by a cast: integer arithmetic, a remainder, a sum
/// and a dtype change, which the float-only op library does not cover.
fn int_mix() -> Graph {
    let mut g = GraphBuilder::new();
    let x = g.input("x", &[5, 9], DType::I32);
    let body = load(x, [Expr::axis(0), Expr::axis(1)]).binary(BinaryOp::Rem, Expr::int(3));
    let r = g.reduce(
        "rowsum",
        &[5],
        DType::I32,
        harl_te::ReduceOp::Sum,
        &[9],
        body,
    );
    ops::cast(&mut g, r, DType::F32).expect("cast");
    g.finish().expect("int_mix")
}
