//! `harl-bench math`: elementwise kernels harl emits with its vector math (`exp`, `log`,
//! `tanh`, `erf`, and a GELU epilogue) against the scalar loop harl emitted before, which calls
//! libm (`f32::exp`, ...; `erf` through the f64 formula), timed interleaved in one run on one
//! thread, medians of rounds. Each harl result is checked against the scalar one first.

use crate::stats::median;
use crate::timing::measure;
use crate::Error;

/// Elements per kernel call.
const N: usize = 1 << 20;

#[harl::kernel(N = 1048576)]
fn h_exp(x: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| exp(x[i]))
}

#[harl::kernel(N = 1048576)]
fn h_log(x: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| log(x[i]))
}

#[harl::kernel(N = 1048576)]
fn h_tanh(x: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| tanh(x[i]))
}

#[harl::kernel(N = 1048576)]
fn h_erf(x: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| erf(x[i]))
}

/// BERT's GELU epilogue, x/2 (1 + erf(x / sqrt 2)).
#[harl::kernel(N = 1048576)]
fn h_gelu(x: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| x[i] * 0.5 * (1.0 + erf(x[i] * 0.70710677)))
}

type Kernel = fn(&[f32], &mut [f32]) -> Result<(), harl::KernelError>;

fn scalar_erf(x: f32) -> f32 {
    harl::runtime::erf_f64(f64::from(x)) as f32
}

/// One function: its name, harl's kernel, the scalar libm version, and the input range.
struct Case {
    name: &'static str,
    harl: Kernel,
    scalar: fn(f32) -> f32,
    range: (f32, f32),
}

fn cases() -> Vec<Case> {
    vec![
        Case {
            name: "exp",
            harl: h_exp,
            scalar: f32::exp,
            range: (-10.0, 10.0),
        },
        Case {
            name: "log",
            harl: h_log,
            scalar: f32::ln,
            range: (1e-3, 1e3),
        },
        Case {
            name: "tanh",
            harl: h_tanh,
            scalar: f32::tanh,
            range: (-5.0, 5.0),
        },
        Case {
            name: "erf",
            harl: h_erf,
            scalar: scalar_erf,
            range: (-4.0, 4.0),
        },
        Case {
            name: "gelu",
            harl: h_gelu,
            scalar: |x| x * 0.5 * (1.0 + scalar_erf(x * 0.707_106_77)),
            range: (-6.0, 6.0),
        },
    ]
}

/// Runs the comparison: `rounds` interleaved rounds, one thread.
pub fn run(rounds: usize) -> Result<(), Error> {
    let pool = rayon::ThreadPoolBuilder::new().num_threads(1).build()?;
    let isa = harl::runtime::Isa::detect();
    println!("elementwise kernels over {N} f32, 1 thread, {isa:?} multiversion, medians of {rounds} rounds");
    println!(
        "{:<6} {:>14} {:>14} {:>9}  max |diff|",
        "fn", "scalar ns/elem", "harl ns/elem", "speed-up"
    );
    for case in cases() {
        let (lo, hi) = case.range;
        let x: Vec<f32> = (0..N)
            .map(|i| lo + (hi - lo) * ((i * 7919) % N) as f32 / N as f32)
            .collect();
        let mut got = vec![0.0f32; N];
        let mut want = vec![0.0f32; N];
        pool.install(|| (case.harl)(&x, &mut got))?;
        for (w, &v) in want.iter_mut().zip(&x) {
            *w = (case.scalar)(v);
        }
        let diff = got
            .iter()
            .zip(&want)
            .map(|(g, w)| (g - w).abs() / w.abs().max(1e-30).max(1.0))
            .fold(0.0f32, f32::max);
        if diff > 1e-5 {
            return Err(format!(
                "{}: harl's kernel differs from the scalar loop by {diff:e}",
                case.name
            )
            .into());
        }
        let (mut scalar, mut harl) = (Vec::new(), Vec::new());
        for _ in 0..rounds {
            scalar.push(
                measure(|| -> Result<(), Error> {
                    for (w, &v) in want.iter_mut().zip(std::hint::black_box(&x)) {
                        *w = (case.scalar)(v);
                    }
                    std::hint::black_box(&want);
                    Ok(())
                })?
                .median_s,
            );
            harl.push(
                measure(|| -> Result<(), Error> {
                    pool.install(|| (case.harl)(std::hint::black_box(&x), &mut got))?;
                    Ok(())
                })?
                .median_s,
            );
        }
        let s = median(&scalar).unwrap_or(f64::NAN) / N as f64 * 1e9;
        let h = median(&harl).unwrap_or(f64::NAN) / N as f64 * 1e9;
        println!(
            "{:<6} {s:>14.3} {h:>14.3} {:>8.1}x  {diff:.1e}",
            case.name,
            s / h
        );
    }
    Ok(())
}
