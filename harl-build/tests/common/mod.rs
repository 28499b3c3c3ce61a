//! Shared test helpers: small graphs, deterministic data, random legal schedules.
#![allow(dead_code)]

use harl_build::lower::lower;
use harl_build::schedule::{Schedule, Step};
use harl_te::{load, DType, Expr, Graph, GraphBuilder, ReduceOp};

/// xorshift64*, enough for test data and schedule sampling.
pub struct Rng(pub u64);
impl Rng {
    pub fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    pub fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
    }
}

pub fn data(graph: &Graph, seed: u64) -> Vec<Vec<f64>> {
    let mut rng = Rng(seed | 1);
    graph
        .inputs
        .iter()
        .map(|p| {
            let n: usize = p.shape.iter().product();
            match p.dtype {
                DType::I32 => (0..n).map(|_| (rng.unit() * 50.0).round()).collect(),
                _ => (0..n).map(|_| (rng.unit() as f32) as f64).collect(),
            }
        })
        .collect()
}

/// C = A x B, plus an optional bias+relu epilogue stage.
/// An image's global pool over its `h x w` pixels (`op` Sum: an average pool's scaled sum, as
/// the ONNX importer writes it; Max: a global max pool).
pub fn global_pool(c: usize, h: usize, w: usize, op: ReduceOp) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[1, c, h, w], DType::F32);
    let ax = Expr::axis;
    let read = load(x, [ax(0), ax(1), ax(4), ax(5)]);
    let body = match op {
        ReduceOp::Sum => read * Expr::f32(1.0 / (h * w) as f32),
        _ => read,
    };
    b.reduce("pool", &[1, c, 1, 1], DType::F32, op, &[h, w], body);
    b.finish().expect("valid graph")
}

pub fn matmul(m: usize, k: usize, n: usize, epilogue: bool) -> Graph {
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[m, k], DType::F32);
    let w = b.input("w", &[k, n], DType::F32);
    let body = load(a, [Expr::axis(0), Expr::axis(2)]) * load(w, [Expr::axis(2), Expr::axis(1)]);
    let mm = b.reduce("mm", &[m, n], DType::F32, ReduceOp::Sum, &[k], body);
    if epilogue {
        let bias = b.input("bias", &[n], DType::F32);
        let v = load(mm, [Expr::axis(0), Expr::axis(1)]) + load(bias, [Expr::axis(1)]);
        b.compute("relu", &[m, n], DType::F32, v.max(Expr::f32(0.0)));
    }
    b.finish().expect("valid graph")
}

pub fn assert_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= tol * (1.0 + w.abs()),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

/// Grows a schedule step by step, keeping only steps that lower: random but legal by
/// construction. Structure first (split, reorder, fuse, inline), then attachment and the
/// accumulator, then annotations, as a sketch would be filled in.
pub fn random_schedule(graph: &Graph, seed: u64, attempts: usize) -> Schedule {
    let mut rng = Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
    let mut sched = Schedule::default();
    let n = graph.stages.len();
    let try_push = |sched: &mut Schedule, step: Step| {
        sched.steps.push(step);
        if lower(graph, sched).is_err() {
            sched.steps.pop();
        }
    };
    // Sometimes factor a reduction first (it adds a stage).
    if rng.below(3) == 0 {
        let stage = rng.below(n);
        try_push(
            &mut sched,
            Step::Rfactor {
                stage,
                factor: 2 + rng.below(3),
            },
        );
    }
    let n = lower(graph, &sched).map_or(n, |p| p.graph.stages.len());
    for _ in 0..attempts {
        let stage = rng.below(n);
        let at = rng.below(8);
        let step = match rng.below(6) {
            0..=2 => {
                let k = 1 + rng.below(2);
                let factors = (0..k).map(|_| 1 + rng.below(9)).collect();
                Step::Split { stage, at, factors }
            }
            3 => {
                let len = 2 + rng.below(7);
                let mut order: Vec<usize> = (0..len).collect();
                for i in (1..len).rev() {
                    order.swap(i, rng.below(i + 1));
                }
                Step::Reorder { stage, order }
            }
            4 => Step::Fuse { stage, at },
            _ => Step::ComputeInline { stage },
        };
        try_push(&mut sched, step);
    }
    for _ in 0..attempts / 2 {
        let step = if rng.below(2) == 0 {
            // Consumers attach to earlier stages, near the outside of their nest: over the
            // tile the target finished there, or (within) over their own rest of its rows.
            let stage = 1 + rng.below(n.max(2) - 1);
            let (stage, target, at) = (stage.min(n - 1), rng.below(stage), rng.below(3));
            if rng.below(3) == 0 {
                Step::ComputeWithin { stage, target, at }
            } else {
                Step::ComputeAt { stage, target, at }
            }
        } else {
            Step::CacheWrite {
                stage: rng.below(n),
                at: rng.below(8),
            }
        };
        try_push(&mut sched, step);
    }
    for stage in 0..n {
        if rng.below(2) == 0 {
            try_push(&mut sched, Step::Parallel { stage, at: 0 });
        }
        if rng.below(2) == 0 {
            try_push(
                &mut sched,
                Step::Unroll {
                    stage,
                    at: rng.below(8),
                },
            );
        }
        if rng.below(2) == 0 {
            try_push(
                &mut sched,
                Step::Vectorize {
                    stage,
                    at: rng.below(8),
                },
            );
        }
    }
    sched
}

/// An f64 matmul with an epilogue that uses every float math function.
pub fn f64_math() -> Graph {
    use harl_te::UnaryOp;
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[6, 10], DType::F64);
    let w = b.input("w", &[10, 12], DType::F64);
    let body = load(a, [Expr::axis(0), Expr::axis(2)]) * load(w, [Expr::axis(2), Expr::axis(1)]);
    let mm = b.reduce("mm", &[6, 12], DType::F64, ReduceOp::Sum, &[10], body);
    let x = || load(mm, [Expr::axis(0), Expr::axis(1)]);
    let c = |v: f64| Expr::lit(v, DType::F64);
    let gelu = c(0.5) * x() * (c(1.0) + (x() / c(std::f64::consts::SQRT_2)).unary(UnaryOp::Erf));
    let rest = x().unary(UnaryOp::Tanh)
        + (-x().unary(UnaryOp::Abs)).exp()
        + x().unary(UnaryOp::Abs).unary(UnaryOp::Sqrt)
        + (c(1.0) + x().unary(UnaryOp::Abs)).unary(UnaryOp::Log);
    b.compute("act", &[6, 12], DType::F64, gelu + rest);
    b.finish().expect("valid f64 graph")
}

/// i32 arithmetic (wrapping ops, truncating division, remainder, select, max) and a sum.
pub fn i32_arith() -> Graph {
    use harl_te::CmpOp;
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[5, 9], DType::I32);
    let c = b.input("c", &[9], DType::I32);
    let av = || load(a, [Expr::axis(0), Expr::axis(1)]);
    let cv = || load(c, [Expr::axis(1)]);
    let k = |v: i64| Expr::int(v);
    let mixed = (av() * k(3) + cv()) / k(2) % k(5);
    let body = Expr::select(av().cmp(CmpOp::Gt, k(0)), mixed, -av()).max(cv() - Expr::axis(1));
    let ew = b.compute("ew", &[5, 9], DType::I32, body);
    let sum = load(ew, [Expr::axis(0), Expr::axis(1)]);
    b.reduce("rowsum", &[5], DType::I32, ReduceOp::Sum, &[9], sum);
    b.finish().expect("valid i32 graph")
}

/// `out[i] = op_j x[i, j]` over a `[rows, cols]` input: the smallest max or min reduction, for
/// checking that a wrong identity is caught.
pub fn row_reduce(rows: usize, cols: usize, dtype: DType, op: ReduceOp) -> Graph {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[rows, cols], dtype);
    let body = load(x, [Expr::axis(0), Expr::axis(1)]);
    b.reduce("r", &[rows], dtype, op, &[cols], body);
    b.finish().expect("valid row reduction")
}

/// `out[i] = sum_j a[i, j] * c[j]` in i32: integer arithmetic that must come out exact.
pub fn i32_matvec(rows: usize, cols: usize) -> Graph {
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[rows, cols], DType::I32);
    let c = b.input("c", &[cols], DType::I32);
    let body = load(a, [Expr::axis(0), Expr::axis(1)]) * load(c, [Expr::axis(1)]);
    b.reduce("mv", &[rows], DType::I32, ReduceOp::Sum, &[cols], body);
    b.finish().expect("valid i32 graph")
}

/// A depthwise 3x3 convolution (padding 1) of `c` channels of `hw` x `hw`, with a bias and
/// ReLU6 (MobileNet-V2's), its filter and bias weights.
pub fn depthwise_bias_relu6(c: usize, hw: usize, stride: usize) -> Graph {
    conv3x3_bias_relu6(c, hw, c, stride, c)
}

/// A 3x3 convolution (padding 1, `f` filters of weights) with bias and ReLU6: on a short row
/// its tile takes the filter layout, written back through transposes with the epilogue.
pub fn conv_bias_relu6(c: usize, hw: usize, f: usize, stride: usize) -> Graph {
    conv3x3_bias_relu6(c, hw, f, stride, 1)
}

/// A 3x3 convolution of `groups` groups, padding 1, weights and bias as graph weights, then
/// ReLU6.
fn conv3x3_bias_relu6(c: usize, hw: usize, f: usize, stride: usize, groups: usize) -> Graph {
    use harl_te::ops::{self, Conv2dParams};
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[1, c, hw, hw], DType::F32);
    let w = b.weight("w", &[f, c / groups, 3, 3], DType::F32);
    let bias = b.weight("bias", &[f, 1, 1], DType::F32);
    let p = Conv2dParams {
        stride: (stride, stride),
        pad: (1, 1),
        dilation: (1, 1),
        groups,
    };
    let y = ops::conv2d(&mut b, x, w, p).expect("conv");
    let y = ops::add(&mut b, y, bias).expect("bias");
    ops::unary(
        &mut b,
        y,
        |e| e.max(Expr::f32(0.0)).min(Expr::f32(6.0)),
        "relu6",
    )
    .expect("relu6");
    b.finish().expect("valid graph")
}

/// `gelu(x [m, k] @ w [k, n] + bias [n])` with `w` and `bias` as graph weights: BERT's FFN
/// layer in small.
pub fn dense_bias_gelu(m: usize, k: usize, n: usize) -> Graph {
    use harl_te::ops::{self, Activation};
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[m, k], DType::F32);
    let w = b.weight("w", &[k, n], DType::F32);
    let bias = b.weight("bias", &[n], DType::F32);
    ops::dense(&mut b, x, w, Some(bias), Activation::Gelu).expect("dense");
    b.finish().expect("valid dense graph")
}
