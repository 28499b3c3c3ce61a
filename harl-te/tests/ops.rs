//! The op library against hand-written nested-loop references, run through the interpreter.

use harl_te::interp;
use harl_te::ops::{
    self, workloads, Activation, Conv1dParams, Conv2dParams, Conv3dParams, OpError,
};
use harl_te::{BinaryOp, DType, Expr, Graph, GraphBuilder, TensorRef};
use proptest::prelude::*;

/// A scalar reference function.
type F1 = fn(f64) -> f64;
/// A binary scalar reference function.
type F2 = fn(f64, f64) -> f64;

/// A tiny deterministic LCG; values in [-1, 1).
struct Lcg(u64);

impl Lcg {
    fn next(&mut self) -> f64 {
        self.0 = self
            .0
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        ((self.0 >> 11) as f64 / (1u64 << 53) as f64) * 2.0 - 1.0
    }
    fn vec(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next()).collect()
    }
    /// Values rounded to f32, as an f32 tensor holds them.
    fn vec32(&mut self, n: usize) -> Vec<f64> {
        (0..n).map(|_| self.next() as f32 as f64).collect()
    }
}

fn close(got: &[f64], want: &[f64], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: length");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g - w).abs() <= 1e-4 * w.abs().max(1.0),
            "{what}: element {i}: got {g}, want {w}"
        );
    }
}

fn run(g: &Graph, inputs: &[&[f64]]) -> Vec<f64> {
    g.validate().expect("graph validates");
    interp::run(g, inputs).expect("interpreter runs")
}

// ---------------------------------------------------------------------------------------------
// Matrix products

fn ref_matmul(a: &[f64], w: &[f64], m: usize, k: usize, n: usize, ta: bool, tb: bool) -> Vec<f64> {
    let mut out = vec![0.0; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut s = 0.0;
            for kk in 0..k {
                let av = if ta { a[kk * m + i] } else { a[i * k + kk] };
                let wv = if tb { w[j * k + kk] } else { w[kk * n + j] };
                s += av * wv;
            }
            out[i * n + j] = s;
        }
    }
    out
}

#[test]
fn matmul_all_transposes() {
    let (m, k, n) = (3, 5, 4);
    let mut r = Lcg(1);
    for dtype in [DType::F32, DType::F64] {
        for ta in [false, true] {
            for tb in [false, true] {
                let mut b = GraphBuilder::new();
                let sa = if ta { [k, m] } else { [m, k] };
                let sw = if tb { [n, k] } else { [k, n] };
                let a = b.input("a", &sa, dtype);
                let w = b.input("w", &sw, dtype);
                let y = ops::matmul(&mut b, a, w, ta, tb).unwrap();
                let g = b.finish().unwrap();
                assert_eq!(g.shape(y), &[m, n]);
                assert_eq!(g.stages.len(), 1);
                assert_eq!(g.stages[0].name, "matmul");
                let (av, wv) = (r.vec32(m * k), r.vec32(k * n));
                close(
                    &run(&g, &[&av, &wv]),
                    &ref_matmul(&av, &wv, m, k, n, ta, tb),
                    &format!("matmul {dtype:?} ta={ta} tb={tb}"),
                );
            }
        }
    }
}

#[test]
fn matmul_i32() {
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[2, 3], DType::I32);
    let w = b.input("w", &[3, 2], DType::I32);
    ops::matmul(&mut b, a, w, false, false).unwrap();
    let g = b.finish().unwrap();
    let av = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
    let wv = [1.0, -1.0, 2.0, 0.0, -3.0, 7.0];
    assert_eq!(
        run(&g, &[&av, &wv]),
        ref_matmul(&av, &wv, 2, 3, 2, false, false)
    );
}

#[test]
fn batch_matmul_matches() {
    let (bs, m, k, n) = (2, 3, 4, 5);
    let mut r = Lcg(2);
    for (ta, tb) in [(false, false), (true, true), (false, true)] {
        let mut b = GraphBuilder::new();
        let sa = if ta { [bs, k, m] } else { [bs, m, k] };
        let sw = if tb { [bs, n, k] } else { [bs, k, n] };
        let a = b.input("a", &sa, DType::F32);
        let w = b.input("w", &sw, DType::F32);
        let y = ops::batch_matmul(&mut b, a, w, ta, tb).unwrap();
        let g = b.finish().unwrap();
        assert_eq!(g.shape(y), &[bs, m, n]);
        let (av, wv) = (r.vec32(bs * m * k), r.vec32(bs * k * n));
        let mut want = Vec::new();
        for bi in 0..bs {
            want.extend(ref_matmul(
                &av[bi * m * k..(bi + 1) * m * k],
                &wv[bi * k * n..(bi + 1) * k * n],
                m,
                k,
                n,
                ta,
                tb,
            ));
        }
        close(&run(&g, &[&av, &wv]), &want, "batch_matmul");
    }
}

fn gelu_ref(x: f64) -> f64 {
    0.5 * x * (1.0 + interp::erf(x / std::f64::consts::SQRT_2))
}

#[test]
fn dense_epilogue_is_one_fused_stage() {
    let (m, k, n) = (3, 4, 5);
    let mut r = Lcg(3);
    let acts: [(Activation, F1); 4] = [
        (Activation::None, |v| v),
        (Activation::Relu, |v| v.max(0.0)),
        (Activation::Gelu, gelu_ref),
        (Activation::Tanh, f64::tanh),
    ];
    for (act, f) in acts {
        for with_bias in [true, false] {
            let mut b = GraphBuilder::new();
            let x = b.input("x", &[m, k], DType::F64);
            let w = b.input("w", &[k, n], DType::F64);
            let bias = b.input("bias", &[n], DType::F64);
            let y = ops::dense(&mut b, x, w, with_bias.then_some(bias), act).unwrap();
            let g = b.finish().unwrap();
            assert_eq!(g.shape(y), &[m, n]);
            let want_stages = if !with_bias && act == Activation::None {
                1
            } else {
                2
            };
            assert_eq!(g.stages.len(), want_stages, "{act:?} bias={with_bias}");
            if want_stages == 2 {
                assert!(g.stages[1].reduce.is_none());
                // Every read of the matmul is at exactly [i, j].
                g.stages[1].body.visit(&mut |e| {
                    if let Expr::Load(TensorRef::Stage(0), idx) = e {
                        assert_eq!(idx, &vec![Expr::Axis(0), Expr::Axis(1)]);
                    }
                });
            }
            let (xv, wv, bv) = (r.vec(m * k), r.vec(k * n), r.vec(n));
            let mm = ref_matmul(&xv, &wv, m, k, n, false, false);
            let want: Vec<f64> = mm
                .iter()
                .enumerate()
                .map(|(i, &v)| f(v + if with_bias { bv[i % n] } else { 0.0 }))
                .collect();
            close(&run(&g, &[&xv, &wv, &bv]), &want, &format!("dense {act:?}"));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Elementwise

/// Numpy-style broadcast reference via strides.
fn ref_broadcast(
    op: F2,
    x: &[f64],
    sx: &[usize],
    y: &[f64],
    sy: &[usize],
    out: &[usize],
) -> Vec<f64> {
    let r = out.len();
    let idx_of = |s: &[usize], coord: &[usize]| {
        let lead = r - s.len();
        let mut flat = 0;
        for (d, &e) in s.iter().enumerate() {
            let c = if e == 1 { 0 } else { coord[d + lead] };
            flat = flat * e + c;
        }
        flat
    };
    let total: usize = out.iter().product();
    let mut coord = vec![0; r];
    (0..total)
        .map(|mut f| {
            for d in (0..r).rev() {
                coord[d] = f % out[d];
                f /= out[d];
            }
            op(x[idx_of(sx, &coord)], y[idx_of(sy, &coord)])
        })
        .collect()
}

#[test]
fn broadcast_binary_shapes() {
    let mut r = Lcg(4);
    let cases: [(&[usize], &[usize], &[usize]); 5] = [
        (&[2, 3], &[2, 3], &[2, 3]),
        (&[2, 3], &[3], &[2, 3]),
        (&[4, 1, 3], &[2, 1], &[4, 2, 3]),
        (&[1], &[2, 2], &[2, 2]),
        (&[3, 1], &[1, 4], &[3, 4]),
    ];
    let ops_: [(BinaryOp, F2); 5] = [
        (BinaryOp::Add, |a, b| a + b),
        (BinaryOp::Sub, |a, b| a - b),
        (BinaryOp::Mul, |a, b| a * b),
        (BinaryOp::Max, f64::max),
        (BinaryOp::Min, f64::min),
    ];
    for (sx, sy, so) in cases {
        for (op, f) in ops_ {
            let mut b = GraphBuilder::new();
            let x = b.input("x", sx, DType::F32);
            let y = b.input("y", sy, DType::F32);
            let z = ops::broadcast_binary(&mut b, op, x, y).unwrap();
            let g = b.finish().unwrap();
            assert_eq!(g.shape(z), so);
            let xv = r.vec32(sx.iter().product());
            let yv = r.vec32(sy.iter().product());
            close(
                &run(&g, &[&xv, &yv]),
                &ref_broadcast(f, &xv, sx, &yv, sy, so),
                &format!("{op:?} {sx:?} {sy:?}"),
            );
        }
    }
}

#[test]
fn elementwise_wrappers_and_i32() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[2, 3], DType::I32);
    let y = b.input("y", &[3], DType::I32);
    let s = ops::add(&mut b, x, y).unwrap();
    let d = ops::div(&mut b, s, y).unwrap();
    let m = ops::mul(&mut b, d, x).unwrap();
    let n = ops::sub(&mut b, m, x).unwrap();
    let r = ops::relu(&mut b, n).unwrap();
    let ng = ops::neg(&mut b, r).unwrap();
    let sc = ops::scale(&mut b, ng, 3.0).unwrap();
    let c = ops::cast(&mut b, sc, DType::F32).unwrap();
    let g = b.finish().unwrap();
    assert_eq!(g.dtype(c), DType::F32);
    let xv = [1.0, -7.0, 5.0, 10.0, 3.0, -4.0];
    let yv = [2.0, -3.0, 4.0];
    let want: Vec<f64> = xv
        .iter()
        .enumerate()
        .map(|(i, &xi)| {
            let (xi, yi) = (xi as i32, yv[i % 3] as i32);
            let v = ((xi + yi) / yi) * xi - xi;
            (-(v.max(0)) * 3) as f64
        })
        .collect();
    assert_eq!(run(&g, &[&xv, &yv]), want);
    // Names stay unique.
    let mut names: Vec<&str> = g.stages.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), g.stages.len());
}

#[test]
fn unary_ops_match() {
    let mut r = Lcg(5);
    type Build = fn(&mut GraphBuilder, TensorRef) -> ops::OpResult;
    let cases: [(&str, Build, F1); 7] = [
        ("relu", ops::relu, |v| v.max(0.0)),
        ("gelu", ops::gelu, gelu_ref),
        ("tanh", ops::tanh, f64::tanh),
        ("sigmoid", ops::sigmoid, |v| 1.0 / (1.0 + (-v).exp())),
        ("exp", ops::exp, f64::exp),
        ("neg", ops::neg, |v| -v),
        ("scale", |b, x| ops::scale(b, x, -2.5), |v| v * -2.5),
    ];
    for dtype in [DType::F32, DType::F64] {
        for (name, build, f) in cases {
            let mut b = GraphBuilder::new();
            let x = b.input("x", &[3, 4], dtype);
            let y = build(&mut b, x).unwrap();
            let g = b.finish().unwrap();
            assert_eq!(g.shape(y), &[3, 4]);
            assert_eq!(g.dtype(y), dtype);
            let xv: Vec<f64> = r.vec32(12).iter().map(|v| v * 3.0).collect();
            let want: Vec<f64> = xv.iter().map(|&v| f(v)).collect();
            close(&run(&g, &[&xv]), &want, name);
        }
    }
}

#[test]
fn generic_unary_and_cast() {
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[5], DType::F64);
    let sq = ops::unary(
        &mut b,
        x,
        |e| e.clone() * e + Expr::lit(1.0, DType::F64),
        "sq1",
    )
    .unwrap();
    let c = ops::cast(&mut b, sq, DType::I32).unwrap();
    let g = b.finish().unwrap();
    assert_eq!(g.stages[0].name, "sq1");
    let xv = [0.5, -1.5, 2.0, 3.1, -0.2];
    let want: Vec<f64> = xv.iter().map(|v| (v * v + 1.0) as i32 as f64).collect();
    assert_eq!(run(&g, &[&xv]), want);
    assert_eq!(g.dtype(c), DType::I32);
}

#[test]
fn bias_add_last_axis() {
    let mut r = Lcg(6);
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[2, 3, 4], DType::F32);
    let bias = b.input("bias", &[4], DType::F32);
    ops::bias_add(&mut b, x, bias).unwrap();
    let g = b.finish().unwrap();
    let (xv, bv) = (r.vec32(24), r.vec32(4));
    let want: Vec<f64> = xv.iter().enumerate().map(|(i, v)| v + bv[i % 4]).collect();
    close(&run(&g, &[&xv, &bv]), &want, "bias_add");
}

// ---------------------------------------------------------------------------------------------
// Convolutions

fn out_len(l: usize, k: usize, s: usize, p: usize, d: usize) -> usize {
    (l + 2 * p - d * (k - 1) - 1) / s + 1
}

#[allow(clippy::too_many_arguments)]
fn ref_conv1d(
    x: &[f64],
    w: &[f64],
    (n, c, l): (usize, usize, usize),
    (f, k): (usize, usize),
    p: Conv1dParams,
) -> Vec<f64> {
    let lo = out_len(l, k, p.stride, p.pad, p.dilation);
    let (cg, fg) = (c / p.groups, f / p.groups);
    let mut out = vec![0.0; n * f * lo];
    for ni in 0..n {
        for fi in 0..f {
            for o in 0..lo {
                let mut s = 0.0;
                for rc in 0..cg {
                    let ci = (fi / fg) * cg + rc;
                    for kk in 0..k {
                        let pos = (o * p.stride + kk * p.dilation) as isize - p.pad as isize;
                        if pos >= 0 && (pos as usize) < l {
                            s += x[(ni * c + ci) * l + pos as usize] * w[(fi * cg + rc) * k + kk];
                        }
                    }
                }
                out[(ni * f + fi) * lo + o] = s;
            }
        }
    }
    out
}

#[test]
fn conv1d_matches() {
    let mut r = Lcg(7);
    let (n, c, l) = (2, 4, 9);
    let cases = [
        (6, 3, 1, 0, 1, 1),
        (6, 3, 2, 1, 1, 1),
        (6, 3, 1, 2, 2, 2),
        (4, 3, 2, 1, 2, 4),
    ];
    for (f, k, stride, pad, dilation, groups) in cases {
        let p = Conv1dParams {
            stride,
            pad,
            dilation,
            groups,
        };
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[n, c, l], DType::F32);
        let w = b.input("w", &[f, c / groups, k], DType::F32);
        let y = ops::conv1d(&mut b, x, w, p).unwrap();
        let g = b.finish().unwrap();
        assert_eq!(g.shape(y), &[n, f, out_len(l, k, stride, pad, dilation)]);
        assert_eq!(g.stages.len(), if pad > 0 { 2 } else { 1 });
        let (xv, wv) = (r.vec32(n * c * l), r.vec32(f * (c / groups) * k));
        close(
            &run(&g, &[&xv, &wv]),
            &ref_conv1d(&xv, &wv, (n, c, l), (f, k), p),
            &format!("conv1d {p:?}"),
        );
    }
}

fn ref_conv2d(
    x: &[f64],
    w: &[f64],
    (n, c, h, wd): (usize, usize, usize, usize),
    (f, kh, kw): (usize, usize, usize),
    p: Conv2dParams,
) -> Vec<f64> {
    let ho = out_len(h, kh, p.stride.0, p.pad.0, p.dilation.0);
    let wo = out_len(wd, kw, p.stride.1, p.pad.1, p.dilation.1);
    let (cg, fg) = (c / p.groups, f / p.groups);
    let mut out = vec![0.0; n * f * ho * wo];
    for ni in 0..n {
        for fi in 0..f {
            for oy in 0..ho {
                for ox in 0..wo {
                    let mut s = 0.0;
                    for rc in 0..cg {
                        let ci = (fi / fg) * cg + rc;
                        for ry in 0..kh {
                            for rx in 0..kw {
                                let iy = (oy * p.stride.0 + ry * p.dilation.0) as isize
                                    - p.pad.0 as isize;
                                let ix = (ox * p.stride.1 + rx * p.dilation.1) as isize
                                    - p.pad.1 as isize;
                                if iy < 0 || ix < 0 || iy as usize >= h || ix as usize >= wd {
                                    continue;
                                }
                                let xv = x[((ni * c + ci) * h + iy as usize) * wd + ix as usize];
                                let wv = w[((fi * cg + rc) * kh + ry) * kw + rx];
                                s += xv * wv;
                            }
                        }
                    }
                    out[((ni * f + fi) * ho + oy) * wo + ox] = s;
                }
            }
        }
    }
    out
}

fn check_conv2d(
    r: &mut Lcg,
    xs: (usize, usize, usize, usize),
    (f, kh, kw): (usize, usize, usize),
    p: Conv2dParams,
) {
    let (n, c, h, wd) = xs;
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[n, c, h, wd], DType::F32);
    let w = b.input("w", &[f, c / p.groups, kh, kw], DType::F32);
    let y = ops::conv2d(&mut b, x, w, p).unwrap();
    let g = b.finish().unwrap();
    let ho = out_len(h, kh, p.stride.0, p.pad.0, p.dilation.0);
    let wo = out_len(wd, kw, p.stride.1, p.pad.1, p.dilation.1);
    assert_eq!(g.shape(y), &[n, f, ho, wo]);
    let padded = p.pad != (0, 0);
    assert_eq!(g.stages.len(), if padded { 2 } else { 1 });
    if padded {
        assert_eq!(g.stages[0].name, "pad");
        // A depthwise convolution strided along its rows splits each padded row into its
        // phases (`[.., stride, ceil(Wp / stride)]`).
        let (hp, wp) = (h + 2 * p.pad.0, wd + 2 * p.pad.1);
        let phases = p.groups == c && c > 1 && p.stride.1 > 1 && p.dilation.1 == 1;
        let want = if phases {
            vec![n, c, hp, p.stride.1, wp.div_ceil(p.stride.1)]
        } else {
            vec![n, c, hp, wp]
        };
        assert_eq!(g.stages[0].shape, want);
        // The conv stage reads the padded tensor without any select.
        g.stages[1]
            .body
            .visit(&mut |e| assert!(!matches!(e, Expr::Select(..))));
    }
    let (xv, wv) = (
        r.vec32(n * c * h * wd),
        r.vec32(f * (c / p.groups) * kh * kw),
    );
    close(
        &run(&g, &[&xv, &wv]),
        &ref_conv2d(&xv, &wv, xs, (f, kh, kw), p),
        &format!("conv2d {xs:?} {p:?}"),
    );
}

#[test]
fn conv2d_matches() {
    let mut r = Lcg(8);
    for dilation in [1, 2] {
        // 1x3x5x5, 4 filters 3x3, stride 2, pad 1.
        let p = Conv2dParams {
            stride: (2, 2),
            pad: (1, 1),
            dilation: (dilation, dilation),
            groups: 1,
        };
        check_conv2d(&mut r, (1, 3, 5, 5), (4, 3, 3), p);
        // Depthwise.
        check_conv2d(
            &mut r,
            (1, 3, 5, 5),
            (3, 3, 3),
            Conv2dParams { groups: 3, ..p },
        );
    }
    // No padding, unit stride; asymmetric parameters; grouped with channel multiplier.
    check_conv2d(&mut r, (2, 2, 4, 5), (3, 2, 3), Conv2dParams::default());
    check_conv2d(
        &mut r,
        (1, 4, 6, 7),
        (6, 3, 2),
        Conv2dParams {
            stride: (1, 2),
            pad: (2, 0),
            dilation: (2, 1),
            groups: 2,
        },
    );
    check_conv2d(
        &mut r,
        (1, 2, 5, 5),
        (4, 3, 3),
        Conv2dParams {
            groups: 2,
            pad: (1, 1),
            ..Default::default()
        },
    );
}

fn ref_conv3d(
    x: &[f64],
    w: &[f64],
    (n, c, d, h, wd): (usize, usize, usize, usize, usize),
    (f, kd, kh, kw): (usize, usize, usize, usize),
    p: Conv3dParams,
) -> Vec<f64> {
    let od = out_len(d, kd, p.stride.0, p.pad.0, p.dilation.0);
    let oh = out_len(h, kh, p.stride.1, p.pad.1, p.dilation.1);
    let ow = out_len(wd, kw, p.stride.2, p.pad.2, p.dilation.2);
    let (cg, fg) = (c / p.groups, f / p.groups);
    let mut out = vec![0.0; n * f * od * oh * ow];
    for ni in 0..n {
        for fi in 0..f {
            for oz in 0..od {
                for oy in 0..oh {
                    for ox in 0..ow {
                        let mut s = 0.0;
                        for rc in 0..cg {
                            let ci = (fi / fg) * cg + rc;
                            for rz in 0..kd {
                                for ry in 0..kh {
                                    for rx in 0..kw {
                                        let iz = (oz * p.stride.0 + rz * p.dilation.0) as isize
                                            - p.pad.0 as isize;
                                        let iy = (oy * p.stride.1 + ry * p.dilation.1) as isize
                                            - p.pad.1 as isize;
                                        let ix = (ox * p.stride.2 + rx * p.dilation.2) as isize
                                            - p.pad.2 as isize;
                                        if iz < 0
                                            || iy < 0
                                            || ix < 0
                                            || iz as usize >= d
                                            || iy as usize >= h
                                            || ix as usize >= wd
                                        {
                                            continue;
                                        }
                                        let (iz, iy, ix) = (iz as usize, iy as usize, ix as usize);
                                        let xv = x[(((ni * c + ci) * d + iz) * h + iy) * wd + ix];
                                        let wv =
                                            w[(((fi * cg + rc) * kd + rz) * kh + ry) * kw + rx];
                                        s += xv * wv;
                                    }
                                }
                            }
                        }
                        out[(((ni * f + fi) * od + oz) * oh + oy) * ow + ox] = s;
                    }
                }
            }
        }
    }
    out
}

#[test]
fn conv3d_matches() {
    let mut r = Lcg(9);
    let (n, c, d, h, w) = (1, 2, 4, 5, 4);
    let cases = [
        (3, (2, 3, 2), Conv3dParams::default()),
        (
            4,
            (3, 2, 3),
            Conv3dParams {
                stride: (2, 1, 2),
                pad: (1, 0, 1),
                dilation: (1, 2, 1),
                groups: 2,
            },
        ),
    ];
    for (f, (kd, kh, kw), p) in cases {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[n, c, d, h, w], DType::F64);
        let wt = b.input("w", &[f, c / p.groups, kd, kh, kw], DType::F64);
        ops::conv3d(&mut b, x, wt, p).unwrap();
        let g = b.finish().unwrap();
        let (xv, wv) = (
            r.vec(n * c * d * h * w),
            r.vec(f * (c / p.groups) * kd * kh * kw),
        );
        close(
            &run(&g, &[&xv, &wv]),
            &ref_conv3d(&xv, &wv, (n, c, d, h, w), (f, kd, kh, kw), p),
            &format!("conv3d {p:?}"),
        );
    }
}

/// Scatter form of the transposed convolution, independent of the op's gather form.
fn ref_conv2d_transpose(
    x: &[f64],
    w: &[f64],
    (n, c, h, wd): (usize, usize, usize, usize),
    (fg, kh, kw): (usize, usize, usize),
    p: Conv2dParams,
) -> (Vec<f64>, [usize; 2]) {
    let ho = (h - 1) * p.stride.0 + p.dilation.0 * (kh - 1) + 1 - 2 * p.pad.0;
    let wo = (wd - 1) * p.stride.1 + p.dilation.1 * (kw - 1) + 1 - 2 * p.pad.1;
    let cg = c / p.groups;
    let f = fg * p.groups;
    let mut out = vec![0.0; n * f * ho * wo];
    for ni in 0..n {
        for ci in 0..c {
            let grp = ci / cg;
            for iy in 0..h {
                for ix in 0..wd {
                    for fl in 0..fg {
                        let fi = grp * fg + fl;
                        for ky in 0..kh {
                            for kx in 0..kw {
                                let oy = (iy * p.stride.0 + ky * p.dilation.0) as isize
                                    - p.pad.0 as isize;
                                let ox = (ix * p.stride.1 + kx * p.dilation.1) as isize
                                    - p.pad.1 as isize;
                                if oy < 0 || ox < 0 || oy as usize >= ho || ox as usize >= wo {
                                    continue;
                                }
                                out[((ni * f + fi) * ho + oy as usize) * wo + ox as usize] += x
                                    [((ni * c + ci) * h + iy) * wd + ix]
                                    * w[((ci * fg + fl) * kh + ky) * kw + kx];
                            }
                        }
                    }
                }
            }
        }
    }
    (out, [ho, wo])
}

fn check_conv2d_transpose(
    r: &mut Lcg,
    xs: (usize, usize, usize, usize),
    (fg, kh, kw): (usize, usize, usize),
    p: Conv2dParams,
) {
    let (n, c, h, wd) = xs;
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[n, c, h, wd], DType::F32);
    let w = b.input("w", &[c, fg, kh, kw], DType::F32);
    let y = ops::conv2d_transpose(&mut b, x, w, p).unwrap();
    let g = b.finish().unwrap();
    let (xv, wv) = (r.vec32(n * c * h * wd), r.vec32(c * fg * kh * kw));
    let (want, [ho, wo]) = ref_conv2d_transpose(&xv, &wv, xs, (fg, kh, kw), p);
    assert_eq!(g.shape(y), &[n, fg * p.groups, ho, wo]);
    close(
        &run(&g, &[&xv, &wv]),
        &want,
        &format!("conv2d_transpose {xs:?} {p:?}"),
    );
}

#[test]
fn conv2d_transpose_matches() {
    let mut r = Lcg(10);
    let base = Conv2dParams::default();
    check_conv2d_transpose(&mut r, (1, 2, 3, 3), (3, 3, 3), base);
    check_conv2d_transpose(
        &mut r,
        (1, 2, 3, 4),
        (3, 3, 3),
        Conv2dParams {
            stride: (2, 2),
            pad: (1, 1),
            ..base
        },
    );
    check_conv2d_transpose(
        &mut r,
        (2, 3, 3, 2),
        (2, 2, 3),
        Conv2dParams {
            stride: (3, 2),
            pad: (0, 1),
            dilation: (2, 1),
            ..base
        },
    );
    check_conv2d_transpose(
        &mut r,
        (1, 4, 3, 3),
        (1, 3, 3),
        Conv2dParams {
            stride: (2, 2),
            pad: (1, 1),
            groups: 2,
            ..base
        },
    );
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    #[test]
    fn conv2d_random_params(
        c in 1usize..4, h in 1usize..7, w in 1usize..7, f_mult in 1usize..3,
        kh in 1usize..4, kw in 1usize..4, sh in 1usize..4, sw in 1usize..3,
        ph in 0usize..3, pw in 0usize..2, dh in 1usize..3, dw in 1usize..3,
        depthwise in any::<bool>(), seed in any::<u64>(),
    ) {
        let groups = if depthwise { c } else { 1 };
        let f = if depthwise { c * f_mult } else { f_mult + 1 };
        let p = Conv2dParams { stride: (sh, sw), pad: (ph, pw), dilation: (dh, dw), groups };
        let fits = dh * (kh - 1) < h + 2 * ph && dw * (kw - 1) < w + 2 * pw;
        if fits {
            check_conv2d(&mut Lcg(seed), (1, c, h, w), (f, kh, kw), p);
        } else {
            let mut b = GraphBuilder::new();
            let x = b.input("x", &[1, c, h, w], DType::F32);
            let wt = b.input("w", &[f, c / groups, kh, kw], DType::F32);
            let is_mismatch = matches!(
                ops::conv2d(&mut b, x, wt, p),
                Err(OpError::ShapeMismatch { .. })
            );
            prop_assert!(is_mismatch);
        }
    }

    #[test]
    fn conv2d_transpose_random_params(
        c in 1usize..4, h in 1usize..5, w in 1usize..5, fg in 1usize..3,
        kh in 1usize..4, kw in 1usize..4, sh in 1usize..4, sw in 1usize..3,
        ph in 0usize..3, pw in 0usize..2, dh in 1usize..3, dw in 1usize..3,
        grouped in any::<bool>(), seed in any::<u64>(),
    ) {
        let groups = if grouped { c } else { 1 };
        let p = Conv2dParams { stride: (sh, sw), pad: (ph, pw), dilation: (dh, dw), groups };
        let ho = ((h - 1) * sh + dh * (kh - 1) + 1) as isize - 2 * ph as isize;
        let wo = ((w - 1) * sw + dw * (kw - 1) + 1) as isize - 2 * pw as isize;
        if ho >= 1 && wo >= 1 {
            check_conv2d_transpose(&mut Lcg(seed), (1, c, h, w), (fg, kh, kw), p);
        } else {
            let mut b = GraphBuilder::new();
            let x = b.input("x", &[1, c, h, w], DType::F32);
            let wt = b.input("w", &[c, fg, kh, kw], DType::F32);
            let is_mismatch = matches!(
                ops::conv2d_transpose(&mut b, x, wt, p),
                Err(OpError::ShapeMismatch { .. })
            );
            prop_assert!(is_mismatch);
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Normalisations

#[test]
fn softmax_matches() {
    let mut r = Lcg(11);
    let shape = [2, 3, 4];
    for axis in [-1isize, 0, 1, 2] {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &shape, DType::F32);
        let y = ops::softmax(&mut b, x, axis).unwrap();
        let g = b.finish().unwrap();
        // max, exp, sum, 1 / sum, product
        assert_eq!(g.stages.len(), 5);
        assert_eq!(g.shape(y), &shape);
        // Large values: the max subtraction keeps exp finite.
        let xv: Vec<f64> = r.vec32(24).iter().map(|v| v * 50.0).collect();
        let a = if axis < 0 { 2 } else { axis as usize };
        let strides = [12, 4, 1];
        let mut want = vec![0.0; 24];
        for (flat, slot) in want.iter_mut().enumerate() {
            let pos = (flat / strides[a]) % shape[a];
            let base = flat - pos * strides[a];
            let row: Vec<f64> = (0..shape[a]).map(|q| xv[base + q * strides[a]]).collect();
            let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let s: f64 = row.iter().map(|v| (v - m).exp()).sum();
            *slot = (xv[flat] - m).exp() / s;
        }
        close(&run(&g, &[&xv]), &want, &format!("softmax axis {axis}"));
    }
    // 1-D.
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[5], DType::F64);
    ops::softmax(&mut b, x, 0).unwrap();
    let g = b.finish().unwrap();
    let xv: [f64; 5] = [1.0, 2.0, 3.0, 1000.0, -4.0];
    let m: f64 = 1000.0;
    let s: f64 = xv.iter().map(|v| (v - m).exp()).sum();
    let want: Vec<f64> = xv.iter().map(|v| (v - m).exp() / s).collect();
    close(&run(&g, &[&xv]), &want, "softmax 1-D");
}

#[test]
fn layer_norm_matches() {
    let mut r = Lcg(12);
    for shape in [vec![3, 8], vec![2, 2, 5], vec![6]] {
        let l = *shape.last().unwrap();
        let rows: usize = shape.iter().product::<usize>() / l;
        let mut b = GraphBuilder::new();
        let x = b.input("x", &shape, DType::F32);
        let gamma = b.input("gamma", &[l], DType::F32);
        let beta = b.input("beta", &[l], DType::F32);
        let y = ops::layer_norm(&mut b, x, gamma, beta, 1e-5).unwrap();
        let g = b.finish().unwrap();
        assert_eq!(g.stages.len(), 3);
        assert_eq!(g.shape(y), &shape[..]);
        let xv: Vec<f64> = r.vec32(rows * l).iter().map(|v| v * 4.0 + 3.0).collect();
        let (gv, bv) = (r.vec32(l), r.vec32(l));
        let mut want = Vec::new();
        for row in xv.chunks(l) {
            let mean = row.iter().sum::<f64>() / l as f64;
            let var = row.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / l as f64;
            for (j, v) in row.iter().enumerate() {
                want.push((v - mean) / (var + 1e-5).sqrt() * gv[j] + bv[j]);
            }
        }
        close(
            &run(&g, &[&xv, &gv, &bv]),
            &want,
            &format!("layer_norm {shape:?}"),
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Errors

fn builder_with(shapes: &[(&[usize], DType)]) -> (GraphBuilder, Vec<TensorRef>) {
    let mut b = GraphBuilder::new();
    let ts = shapes
        .iter()
        .enumerate()
        .map(|(i, (s, d))| b.input(&format!("t{i}"), s, *d))
        .collect();
    (b, ts)
}

#[test]
fn shape_errors() {
    use DType::{F32, I32};
    let (mut b, t) = builder_with(&[
        (&[2, 3], F32),
        (&[4, 5], F32),
        (&[3], F32),
        (&[2, 3, 4], F32),
    ]);
    let e = ops::matmul(&mut b, t[0], t[1], false, false).unwrap_err();
    assert!(matches!(e, OpError::ShapeMismatch { .. }), "{e}");
    let msg = e.to_string();
    assert!(msg.contains("[2, 3]") && msg.contains("[4, 5]"), "{msg}");
    assert!(matches!(
        ops::matmul(&mut b, t[3], t[1], false, false),
        Err(OpError::Rank { .. })
    ));
    assert!(matches!(
        ops::batch_matmul(&mut b, t[3], t[3], false, false),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::dense(&mut b, t[0], t[1], None, Activation::Relu),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::broadcast_binary(&mut b, BinaryOp::Add, t[0], t[1]),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::broadcast_binary(&mut b, BinaryOp::And, t[0], t[0]),
        Err(OpError::InvalidParam { .. })
    ));
    assert!(matches!(
        ops::bias_add(&mut b, t[1], t[2]),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::softmax(&mut b, t[0], 2),
        Err(OpError::Axis { .. })
    ));
    assert!(matches!(
        ops::softmax(&mut b, t[0], -3),
        Err(OpError::Axis { .. })
    ));
    assert!(matches!(
        ops::layer_norm(&mut b, t[1], t[2], t[2], 1e-5),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::matmul(&mut b, TensorRef::Stage(99), t[1], false, false),
        Err(OpError::UnknownTensor { .. })
    ));
    // Nothing was added by the failed calls.
    assert!(b.graph().stages.is_empty());

    let (mut b, t) = builder_with(&[
        (&[2, 3], F32),
        (&[3, 2], I32),
        (&[2, 2], I32),
        (&[2, 0], F32),
    ]);
    assert!(matches!(
        ops::matmul(&mut b, t[0], t[1], false, false),
        Err(OpError::DTypeMismatch { .. })
    ));
    assert!(matches!(
        ops::gelu(&mut b, t[2]),
        Err(OpError::UnsupportedDType { .. })
    ));
    assert!(matches!(
        ops::softmax(&mut b, t[2], -1),
        Err(OpError::UnsupportedDType { .. })
    ));
    assert!(matches!(
        ops::dense(&mut b, t[1], t[2], None, Activation::Tanh),
        Err(OpError::UnsupportedDType { .. })
    ));
    assert!(matches!(
        ops::scale(&mut b, t[2], 0.5),
        Err(OpError::InvalidParam { .. })
    ));
    assert!(matches!(
        ops::cast(&mut b, t[2], DType::Bool),
        Err(OpError::UnsupportedDType { .. })
    ));
    assert!(matches!(
        ops::relu(&mut b, t[3]),
        Err(OpError::EmptyTensor { .. })
    ));
    assert!(b.graph().stages.is_empty());
}

#[test]
fn conv_errors() {
    use DType::F32;
    let (mut b, t) = builder_with(&[
        (&[1, 4, 5, 5], F32),
        (&[6, 4, 3, 3], F32),
        (&[6, 3, 3, 3], F32),
        (&[6, 4, 7, 3], F32),
        (&[1, 4, 5], F32),
        (&[6, 2, 3, 3], F32),
        (&[4, 2, 3, 3], F32),
    ]);
    let ok = Conv2dParams::default();
    assert!(ops::conv2d(&mut b, t[0], t[1], ok).is_ok());
    // Wrong channel count in the weights.
    assert!(matches!(
        ops::conv2d(&mut b, t[0], t[2], ok),
        Err(OpError::ShapeMismatch { .. })
    ));
    // Kernel larger than the input.
    assert!(matches!(
        ops::conv2d(&mut b, t[0], t[3], ok),
        Err(OpError::ShapeMismatch { .. })
    ));
    // Rank.
    assert!(matches!(
        ops::conv2d(&mut b, t[4], t[1], ok),
        Err(OpError::Rank { .. })
    ));
    // Zero stride, zero dilation, zero groups.
    for p in [
        Conv2dParams {
            stride: (0, 1),
            ..ok
        },
        Conv2dParams {
            dilation: (1, 0),
            ..ok
        },
        Conv2dParams { groups: 0, ..ok },
    ] {
        assert!(matches!(
            ops::conv2d(&mut b, t[0], t[1], p),
            Err(OpError::InvalidParam { .. })
        ));
    }
    // Groups that do not divide the channels, or the filters.
    let g3 = Conv2dParams { groups: 3, ..ok };
    assert!(matches!(
        ops::conv2d(&mut b, t[0], t[1], g3),
        Err(OpError::ShapeMismatch { .. })
    ));
    let g4 = Conv2dParams { groups: 4, ..ok };
    assert!(matches!(
        ops::conv2d(&mut b, t[0], t[5], g4),
        Err(OpError::ShapeMismatch { .. })
    ));
    // Transpose: w's first dim must be C; too much padding.
    assert!(ops::conv2d_transpose(&mut b, t[0], t[6], ok).is_ok());
    assert!(matches!(
        ops::conv2d_transpose(&mut b, t[0], t[1], ok),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::conv2d_transpose(&mut b, t[0], t[6], Conv2dParams { pad: (4, 0), ..ok }),
        Err(OpError::ShapeMismatch { .. })
    ));
    assert!(matches!(
        ops::conv1d(&mut b, t[4], t[1], Conv1dParams::default()),
        Err(OpError::Rank { .. })
    ));
    assert!(matches!(
        ops::conv3d(&mut b, t[0], t[1], Conv3dParams::default()),
        Err(OpError::Rank { .. })
    ));
    // Huge padding beyond i32 index arithmetic.
    assert!(matches!(
        ops::conv2d(
            &mut b,
            t[0],
            t[1],
            Conv2dParams {
                pad: (usize::MAX / 2, 0),
                ..ok
            }
        ),
        Err(OpError::InvalidParam { .. })
    ));
}

// ---------------------------------------------------------------------------------------------
// Workloads

#[test]
fn workloads_build_and_validate() {
    let graphs = [
        workloads::matmul(4, 5, 6),
        workloads::dense_bias_relu(4, 5, 6),
        workloads::batch_matmul(2, 3, 4, 5),
        workloads::conv1d(1, 4, 10, 8, 3, 1, 1, 1, 2),
        workloads::conv2d(1, 3, 8, 8, 4, 3, 3, 2, 1, 1, 1),
        workloads::depthwise_conv2d(1, 4, 6, 6, 3, 3, 1, 1, 1),
        workloads::conv3d(1, 2, 4, 4, 4, 3, 3, 3, 3, 1, 1, 1, 1),
        workloads::conv2d_transpose(1, 3, 4, 4, 2, 3, 3, 2, 1, 1),
        workloads::softmax(4, 16),
        workloads::layer_norm(4, 16),
    ];
    for g in graphs {
        let g = g.unwrap();
        g.validate().unwrap();
        assert!(g.flops() > 0.0);
    }
    assert_eq!(workloads::dense_bias_relu(4, 5, 6).unwrap().stages.len(), 2);
    assert_eq!(workloads::softmax(4, 16).unwrap().stages.len(), 5);
    assert!(workloads::conv2d(1, 3, 2, 2, 4, 5, 5, 1, 0, 1, 1).is_err());
    assert!(workloads::matmul(0, 2, 2).is_err());
    assert!(workloads::conv1d(1, 3, 10, 4, 3, 1, 0, 1, 2).is_err());

    // A small dense_bias_relu through the interpreter.
    let g = workloads::dense_bias_relu(2, 3, 4).unwrap();
    let mut r = Lcg(13);
    let (x, w, bias) = (r.vec32(6), r.vec32(12), r.vec32(4));
    let want: Vec<f64> = ref_matmul(&x, &w, 2, 3, 4, false, false)
        .iter()
        .enumerate()
        .map(|(i, v)| (v + bias[i % 4]).max(0.0))
        .collect();
    close(
        &run(&g, &[&x, &w, &bias]),
        &want,
        "dense_bias_relu workload",
    );
}

#[test]
fn workload_key_ignores_names_not_shapes() {
    let build = |xn: &str, wn: &str, m: usize| {
        let mut b = GraphBuilder::new();
        let x = b.input(xn, &[m, 8], DType::F32);
        let w = b.input(wn, &[8, 4], DType::F32);
        let bias = b.input("bias_of_".to_string().as_str(), &[4], DType::F32);
        ops::dense(&mut b, x, w, Some(bias), Activation::Gelu).unwrap();
        b.finish().unwrap()
    };
    let a = build("x", "w", 3);
    let mut b2 = build("input", "weight", 3);
    for s in &mut b2.stages {
        s.name = format!("renamed_{}", s.name);
    }
    assert_eq!(a.workload_key(), b2.workload_key());
    assert_ne!(a.workload_key(), build("x", "w", 5).workload_key());
    assert_eq!(
        workloads::conv2d(1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1)
            .unwrap()
            .workload_key(),
        workloads::conv2d(1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1)
            .unwrap()
            .workload_key()
    );
    assert_ne!(
        workloads::conv2d(1, 3, 8, 8, 4, 3, 3, 1, 1, 1, 1)
            .unwrap()
            .workload_key(),
        workloads::conv2d(1, 3, 8, 8, 4, 3, 3, 1, 1, 2, 1)
            .unwrap()
            .workload_key()
    );
    assert_ne!(
        workloads::matmul(4, 5, 6).unwrap().workload_key(),
        workloads::matmul(4, 6, 5).unwrap().workload_key()
    );
}
