//! harl quickstart: declare two kernels, build them with harl, run them, check them.

use std::time::Instant;

/// A dense layer: relu(a x w + bias).
#[harl::kernel(M = 128, K = 256, N = 512)]
fn dense_relu(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>, bias: Tensor<f32, N>) -> Tensor<f32, M, N> {
    let mm = compute([M, N], |i, j| sum(K, |k| a[[i, k]] * w[[k, j]]));
    compute([M, N], |i, j| max(mm[[i, j]] + bias[j], 0.0))
}

/// A 3x3 convolution, NCHW, padding 1, from the op library.
#[harl::kernel(C = 64, H = 56, W = 56, F = 64)]
fn conv3x3(x: Tensor<f32, 1, C, H, W>, w: Tensor<f32, F, C, 3, 3>) -> Tensor<f32, 1, F, H, W> {
    conv2d(x, w).pad(1)
}

fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed;
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}

fn check(name: &str, got: &[f32], want: &[f32], terms: usize) -> bool {
    // FMA rounds differently from the naive loop: scale the tolerance by the reduction length.
    let tol = 1e-6 * terms as f32;
    let worst = got
        .iter()
        .zip(want)
        .map(|(g, w)| (g - w).abs() / (1.0 + w.abs()))
        .fold(0.0f32, f32::max);
    let ok = got.len() == want.len() && worst <= tol;
    println!("  {name}: max relative error {worst:.2e} (tolerance {tol:.1e}) -> {}", if ok { "ok" } else { "MISMATCH" });
    ok
}

fn main() {
    let (m, k, n) = (128, 256, 512);
    let (a, w, bias) = (data(m * k, 1), data(k * n, 2), data(n, 3));
    let mut out = vec![0.0; m * n];
    println!("dense_relu [{m}x{k}] x [{k}x{n}] + bias, relu");
    println!("  schedule: {}", dense_relu::schedule_source());
    let t = Instant::now();
    dense_relu(&a, &w, &bias, &mut out).expect("buffer lengths match the declared shapes");
    let secs = t.elapsed().as_secs_f64();
    println!("  first call {:.3} ms ({:.1} GFLOP/s)", secs * 1e3, 2.0 * (m * k * n) as f64 / secs / 1e9);
    let mut want = vec![0.0f32; m * n];
    for i in 0..m {
        for j in 0..n {
            let mut acc = 0.0f32;
            for kk in 0..k {
                acc += a[i * k + kk] * w[kk * n + j];
            }
            want[i * n + j] = (acc + bias[j]).max(0.0);
        }
    }
    let mut ok = check("dense_relu", &out, &want, k);

    let (c, h, wd, f) = (64, 56, 56, 64);
    let (x, wt) = (data(c * h * wd, 4), data(f * c * 9, 5));
    let mut y = vec![0.0; f * h * wd];
    println!("conv3x3 1x{c}x{h}x{wd}, {f} filters 3x3, pad 1");
    println!("  schedule: {}", conv3x3::schedule_source());
    let t = Instant::now();
    conv3x3(&x, &wt, &mut y).expect("buffer lengths match the declared shapes");
    let secs = t.elapsed().as_secs_f64();
    println!("  first call {:.3} ms ({:.1} GFLOP/s)", secs * 1e3, 2.0 * (f * h * wd * c * 9) as f64 / secs / 1e9);
    let mut want = vec![0.0f32; f * h * wd];
    for ff in 0..f {
        for oh in 0..h {
            for ow in 0..wd {
                let mut acc = 0.0f32;
                for cc in 0..c {
                    for r in 0..3 {
                        for s in 0..3 {
                            let (ih, iw) = (oh as isize + r as isize - 1, ow as isize + s as isize - 1);
                            if ih >= 0 && iw >= 0 && (ih as usize) < h && (iw as usize) < wd {
                                acc += x[(cc * h + ih as usize) * wd + iw as usize] * wt[((ff * c + cc) * 3 + r) * 3 + s];
                            }
                        }
                    }
                }
                want[(ff * h + oh) * wd + ow] = acc;
            }
        }
    }
    ok &= check("conv3x3", &y, &want, c * 9);

    // A wrong length is a typed error, not a panic.
    let err = dense_relu(&a[1..], &w, &bias, &mut out).unwrap_err();
    println!("a short input gives: {err}");

    if !ok {
        eprintln!("quickstart: a kernel did not match the reference");
        std::process::exit(1);
    }
    println!("all kernels match the reference");
}
