//! The multiply-add peak of one thread: what a kernel's GFLOP/s are a share of.
//!
//! Independent chains of vector multiply-adds, as many as hide the instruction's latency on
//! two FMA pipes, in the widest instruction set [`Isa::detect`] finds. Benchmarks print a
//! kernel's speed as a share of this figure measured in the same sitting, which does not drift
//! with a peer library's version or the neighbours' load the way a peer's figure does.

use super::Isa;
use std::hint::black_box;
use std::time::Instant;

/// FLOP/s (a multiply-add counts two) that one thread reaches, the best of five bursts that
/// each take about `seconds / 5`.
pub fn fma_peak_flops(seconds: f64) -> f64 {
    let isa = Isa::detect();
    let burst_s = (seconds / 5.0).max(1e-3);
    // Iterations that take about a burst.
    let mut iters: u64 = 1 << 12;
    while time(isa, iters).0 < burst_s && iters < 1 << 40 {
        iters *= 2;
    }
    (0..5)
        .map(|_| {
            let (s, flops) = time(isa, iters);
            flops / s.max(1e-9)
        })
        .fold(0.0, f64::max)
}

/// Seconds and FLOPs of one burst of `iters` steps.
fn time(isa: Isa, iters: u64) -> (f64, f64) {
    let start = Instant::now();
    let flops = burst(isa, black_box(iters));
    (start.elapsed().as_secs_f64(), flops)
}

/// Runs `iters` steps of every chain; returns the FLOPs done.
fn burst(isa: Isa, iters: u64) -> f64 {
    #[cfg(target_arch = "x86_64")]
    match isa {
        // SAFETY: `Isa::detect` found AVX-512F and FMA on this CPU.
        Isa::Avx512 => return unsafe { x86::avx512(iters) },
        // SAFETY: `Isa::detect` found AVX2 and FMA on this CPU.
        Isa::Avx2 => return unsafe { x86::avx2(iters) },
        _ => {}
    }
    let _ = isa;
    portable(iters)
}

/// Eight scalar chains of a multiply and an add (no FMA is assumed).
fn portable(iters: u64) -> f64 {
    let (a, b) = (black_box(0.999_999_9f32), black_box(1e-7f32));
    let mut acc = [0.0f32; 8];
    for _ in 0..iters {
        for c in &mut acc {
            *c = *c * a + b;
        }
    }
    black_box(acc);
    (iters * 8 * 2) as f64
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use core::arch::x86_64::*;
    use std::hint::black_box;

    /// Sixteen chains of 16 lanes (32 registers: room to spare).
    #[target_feature(enable = "avx512f,fma")]
    pub(super) unsafe fn avx512(iters: u64) -> f64 {
        let a = _mm512_set1_ps(black_box(0.999_999_9));
        let b = _mm512_set1_ps(black_box(1e-7));
        let mut acc = [_mm512_setzero_ps(); 16];
        for _ in 0..iters {
            for c in &mut acc {
                *c = _mm512_fmadd_ps(*c, a, b);
            }
        }
        black_box(acc);
        (iters * 16 * 16 * 2) as f64
    }

    /// Twelve chains of 8 lanes (with the two operands, 14 of the 16 registers).
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn avx2(iters: u64) -> f64 {
        let a = _mm256_set1_ps(black_box(0.999_999_9));
        let b = _mm256_set1_ps(black_box(1e-7));
        let mut acc = [_mm256_setzero_ps(); 12];
        for _ in 0..iters {
            for c in &mut acc {
                *c = _mm256_fmadd_ps(*c, a, b);
            }
        }
        black_box(acc);
        (iters * 12 * 8 * 2) as f64
    }
}

#[cfg(test)]
mod tests {
    /// The peak is a positive, finite rate (its size depends on the machine, so nothing more
    /// is asserted here; `harl-bench models` prints it).
    #[test]
    fn the_peak_is_measured() {
        let p = super::fma_peak_flops(0.05);
        assert!(p.is_finite() && p > 1e6, "{p}");
    }
}
