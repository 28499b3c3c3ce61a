//! Timing: warm up, then repeat until enough time and runs have passed; report the median.

use crate::stats::median;
use std::time::{Duration, Instant};

/// Warm-up stops after this many calls or this much time, whichever comes first.
const WARMUP_CALLS: usize = 3;
const WARMUP_TIME: Duration = Duration::from_millis(100);
/// Measurement goes on until both are reached.
const MIN_RUNS: usize = 10;
const MIN_TIME: Duration = Duration::from_millis(300);

/// The result of timing one function.
#[derive(Clone, Copy, Debug)]
pub struct Timing {
    /// Median seconds per call.
    pub median_s: f64,
    /// Timed calls (warm-up excluded).
    pub runs: usize,
}

impl Timing {
    /// GFLOP/s of a call that does `flops` floating-point operations.
    pub fn gflops(&self, flops: f64) -> f64 {
        flops / self.median_s / 1e9
    }
}

/// Times `call`: warm-up, then at least [`MIN_RUNS`] calls and [`MIN_TIME`] in all.
pub fn measure<E>(mut call: impl FnMut() -> Result<(), E>) -> Result<Timing, E> {
    let warmup = Instant::now();
    for _ in 0..WARMUP_CALLS {
        call()?;
        if warmup.elapsed() >= WARMUP_TIME {
            break;
        }
    }
    let mut samples = Vec::with_capacity(MIN_RUNS);
    let start = Instant::now();
    while samples.len() < MIN_RUNS || start.elapsed() < MIN_TIME {
        let t = Instant::now();
        call()?;
        samples.push(t.elapsed().as_secs_f64());
    }
    Ok(Timing {
        // Never empty (at least MIN_RUNS samples), so never NaN.
        median_s: median(&samples).unwrap_or(f64::NAN),
        runs: samples.len(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn measure_runs_at_least_min_runs() {
        let mut calls = 0;
        let t = measure(|| -> Result<(), ()> {
            calls += 1;
            std::thread::sleep(Duration::from_millis(1));
            Ok(())
        })
        .unwrap();
        assert!(t.runs >= MIN_RUNS);
        assert!(calls > t.runs);
        assert!(t.median_s > 0.0);
    }
}
