//! The small runtime that generated kernels call: ISA dispatch, the parallel loop, pointer
//! wrappers for sharing buffers across threads, and math helpers shared with the interpreter.
//!
//! This is the narrow layer where harl itself uses `unsafe` outside generated kernels.

pub mod aligned;
pub mod math;
pub mod peak;
pub mod scratch;

pub use aligned::AlignedBuf;
pub use scratch::{scratch_keep, scratch_take, ScratchUse};

use std::sync::OnceLock;

/// The instruction-set class a kernel multiversion was compiled for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Isa {
    /// x86-64 with AVX-512F, AVX2 and FMA.
    Avx512,
    /// x86-64 with AVX2 and FMA.
    Avx2,
    /// aarch64 with NEON (always present there; FMA is used).
    Neon,
    /// Anything else: the portable version, no FMA.
    Baseline,
}

impl Isa {
    /// The best class this CPU supports, detected once. `HARL_ISA=baseline|avx2|avx512` lowers it
    /// (never raises it), for testing the fallbacks.
    pub fn detect() -> Isa {
        static ISA: OnceLock<Isa> = OnceLock::new();
        *ISA.get_or_init(|| {
            let best = detect_host();
            match std::env::var("HARL_ISA").ok().as_deref() {
                Some("baseline") => Isa::Baseline,
                Some("avx2") if best == Isa::Avx512 => Isa::Avx2,
                _ => best,
            }
        })
    }
}

#[cfg(any(target_arch = "x86", target_arch = "x86_64"))]
fn detect_host() -> Isa {
    if std::arch::is_x86_feature_detected!("avx512f")
        && std::arch::is_x86_feature_detected!("avx512vl")
        && std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Isa::Avx512
    } else if std::arch::is_x86_feature_detected!("avx2")
        && std::arch::is_x86_feature_detected!("fma")
    {
        Isa::Avx2
    } else {
        Isa::Baseline
    }
}

#[cfg(target_arch = "aarch64")]
fn detect_host() -> Isa {
    Isa::Neon
}

#[cfg(not(any(target_arch = "x86", target_arch = "x86_64", target_arch = "aarch64")))]
fn detect_host() -> Isa {
    Isa::Baseline
}

/// Runs `body(i)` for `i in 0..n` on the current rayon pool, so `pool.install(|| kernel(..))`
/// controls the threads a kernel uses.
pub fn parallel_for(n: usize, body: impl Fn(usize) + Sync + Send) {
    use rayon::prelude::*;
    let threads = rayon::current_num_threads();
    if n <= 1 || threads <= 1 {
        (0..n).for_each(body);
    } else {
        // About eight chunks per thread: enough to balance, few enough that tiny iterations
        // (an elementwise row) are not one task each.
        let chunk = (n / (threads * 8)).max(1);
        (0..n).into_par_iter().with_min_len(chunk).for_each(body);
    }
}

/// A raw pointer that generated kernels share across the threads of a parallel loop.
///
/// Kernels write disjoint elements from different iterations of a parallel loop (lowering only
/// parallelises spatial loops), so sharing the pointer is sound for them.
#[derive(Debug)]
pub struct SyncPtr<T>(pub *mut T);

impl<T> Clone for SyncPtr<T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for SyncPtr<T> {}

// SAFETY: the pointer is only dereferenced by generated kernels, whose parallel iterations touch
// disjoint output elements and only read inputs; the buffers outlive the parallel loop.
unsafe impl<T> Send for SyncPtr<T> {}
// SAFETY: as above; no two threads write the same element.
unsafe impl<T> Sync for SyncPtr<T> {}

/// `a * b + c`, fused when the caller's multiversion has FMA (a libm call otherwise, so never).
#[inline(always)]
pub fn madd_f32<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// `a * b + c` for f64; see [`madd_f32`].
#[inline(always)]
pub fn madd_f64<const FMA: bool>(a: f64, b: f64, c: f64) -> f64 {
    if FMA {
        a.mul_add(b, c)
    } else {
        a * b + c
    }
}

/// The error function, the same formula as the reference interpreter's (|error| < 1.2e-7).
#[inline]
pub fn erf_f64(x: f64) -> f64 {
    let z = x.abs();
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t
        * (-z * z - 1.265_512_23
            + t * (1.000_023_68
                + t * (0.374_091_96
                    + t * (0.096_784_18
                        + t * (-0.186_288_06
                            + t * (0.278_868_07
                                + t * (-1.135_203_98
                                    + t * (1.488_515_87
                                        + t * (-0.822_152_23 + t * 0.170_872_77)))))))))
            .exp();
    if x >= 0.0 {
        1.0 - r
    } else {
        r - 1.0
    }
}

/// The error function for f32 (computed in f64). Kernels call [`math::erf_f32`] where it
/// vectorises.
#[inline]
pub fn erf_f32(x: f32) -> f32 {
    erf_f64(x as f64) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn erf_matches_known_values() {
        assert!((erf_f64(0.5) - 0.520_499_877_813_046_5).abs() < 2e-7);
        assert!((erf_f64(-1.0) + 0.842_700_792_949_714_9).abs() < 2e-7);
        assert!(erf_f64(0.0).abs() < 2e-7);
        assert!((erf_f64(3.0) - 0.999_977_909_503_001_4).abs() < 2e-7);
    }

    #[test]
    fn parallel_for_visits_each_index_once() {
        let hits: Vec<std::sync::atomic::AtomicUsize> = (0..100)
            .map(|_| std::sync::atomic::AtomicUsize::new(0))
            .collect();
        parallel_for(100, |i| {
            hits[i].fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        });
        assert!(hits
            .iter()
            .all(|h| h.load(std::sync::atomic::Ordering::Relaxed) == 1));
    }
}
