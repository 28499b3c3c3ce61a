//! The result table: printed for people, written as JSON for tools.

use crate::timing::Timing;
use serde_json::{json, Value};

/// `matrixmultiply` never uses more threads than this (see its `threading` feature docs).
pub const MATRIXMULTIPLY_MAX_THREADS: usize = 4;

/// One workload at one thread count.
#[derive(Clone, Debug)]
pub struct Row {
    /// Kernel name.
    pub workload: &'static str,
    /// Human-readable shape.
    pub shape: String,
    /// Where harl's schedule came from.
    pub schedule_source: &'static str,
    /// Threads of the rayon pool (and `MATMUL_NUM_THREADS` for matrixmultiply).
    pub threads: usize,
    /// Floating-point operations per call.
    pub flops: f64,
    /// harl's generated kernel.
    pub harl: Timing,
    /// The `gemm` crate.
    pub gemm: Timing,
    /// `matrixmultiply`.
    pub matrixmultiply: Timing,
    /// Largest relative difference of harl's output from the gemm crate's.
    pub max_rel_err: f64,
}

impl Row {
    /// harl's speed relative to the gemm crate's (> 1: harl is faster).
    pub fn ratio(&self) -> f64 {
        self.gemm.median_s / self.harl.median_s
    }

    fn to_json(&self) -> Value {
        let timing = |t: &Timing| {
            json!({
                "median_s": t.median_s,
                "runs": t.runs,
                "gflops": t.gflops(self.flops),
            })
        };
        let mut mm = timing(&self.matrixmultiply);
        mm["max_threads"] = json!(self.threads.min(MATRIXMULTIPLY_MAX_THREADS));
        json!({
            "workload": self.workload,
            "shape": self.shape,
            "schedule_source": self.schedule_source,
            "threads": self.threads,
            "flops": self.flops,
            "harl": timing(&self.harl),
            "gemm": timing(&self.gemm),
            "matrixmultiply": mm,
            "ratio_harl_gemm": self.ratio(),
            "max_rel_err": self.max_rel_err,
        })
    }
}

/// Prints the table: one line per workload and thread count.
pub fn print_table(rows: &[Row]) {
    println!(
        "{:<12} {:>7} {:>14} {:>14} {:>16} {:>10}",
        "workload", "threads", "harl GFLOP/s", "gemm GFLOP/s", "mmul GFLOP/s", "harl/gemm"
    );
    for r in rows {
        println!(
            "{:<12} {:>7} {:>14.1} {:>14.1} {:>16.1} {:>10.2}",
            r.workload,
            r.threads,
            r.harl.gflops(r.flops),
            r.gemm.gflops(r.flops),
            r.matrixmultiply.gflops(r.flops),
            r.ratio()
        );
    }
    println!(
        "GFLOP/s from the median of >= 10 timed calls (>= 0.3 s); mmul = matrixmultiply::sgemm."
    );
    println!("conv2d peers: im2col (timed) + sgemm; harl/gemm > 1 means harl is faster.");
    if rows.iter().any(|r| r.threads > MATRIXMULTIPLY_MAX_THREADS) {
        println!(
            "matrixmultiply uses at most {MATRIXMULTIPLY_MAX_THREADS} threads, whatever MATMUL_NUM_THREADS says."
        );
    }
}

/// The whole run as JSON.
pub fn to_json(rows: &[Row], isa: &str, available_parallelism: usize) -> Value {
    json!({
        "benchmark": "spine",
        "isa": isa,
        "available_parallelism": available_parallelism,
        "rows": rows.iter().map(Row::to_json).collect::<Vec<_>>(),
    })
}
