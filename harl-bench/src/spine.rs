//! `spine`: harl's kernels against the `gemm` crate and `matrixmultiply`, one thread and all
//! cores, in one run.
//!
//! harl and `gemm` run inside a rayon pool of the measured size. `matrixmultiply` reads its
//! thread count (`MATMUL_NUM_THREADS`) once per process, so each of its measurements runs in a
//! child process of this binary (the hidden [`WORKER_COMMAND`]) with that variable set.

use crate::peers::{Peer, PeerRunner};
use crate::report::{self, Row};
use crate::timing::{measure, Timing};
use crate::workload::{self, Workload};
use crate::Error;
use std::convert::Infallible;
use std::path::PathBuf;
use std::process::Command;

/// The hidden subcommand that times `matrixmultiply` in a child process:
/// `harl-bench __matrixmultiply WORKLOAD THREADS`, printing `MEDIAN_S RUNS`.
pub const WORKER_COMMAND: &str = "__matrixmultiply";

/// Options of the `spine` command.
#[derive(Clone, Debug, Default, clap::Args)]
pub struct Options {
    /// Also write the table as JSON here.
    #[arg(long)]
    pub json: Option<PathBuf>,
}

/// Runs the benchmark: verify every kernel, then time every workload at every thread count.
pub fn run(options: &Options) -> Result<(), Error> {
    let workloads = workload::spine();
    let all = std::thread::available_parallelism().map_or(1, usize::from);
    let isa = format!("{:?}", harl::runtime::Isa::detect());
    println!("harl-bench spine: ISA {isa}, {all} threads available");
    for w in &workloads {
        println!("  {:<12} {}  ({})", w.name, w.describe(), w.schedule_source);
    }
    let mut counts = vec![1, all];
    counts.dedup();
    let pools = counts
        .iter()
        .map(|&n| pool(n).map(|p| (n, p)))
        .collect::<Result<Vec<_>, _>>()?;
    // Every (workload, threads) pair, one thread first.
    let cases: Vec<(&Workload, usize, &rayon::ThreadPool)> = pools
        .iter()
        .flat_map(|(n, p)| workloads.iter().map(move |w| (w, *n, p)))
        .collect();

    println!("verifying against the gemm crate:");
    let errors = cases
        .iter()
        .map(|&(w, threads, pool)| verify(w, threads, pool))
        .collect::<Result<Vec<_>, _>>()?;

    println!("timing:");
    let rows = cases
        .iter()
        .zip(errors)
        .map(|(&(w, threads, pool), err)| time_row(w, threads, pool, err))
        .collect::<Result<Vec<_>, _>>()?;
    println!();
    report::print_table(&rows);
    if let Some(path) = &options.json {
        let text = serde_json::to_string_pretty(&report::to_json(&rows, &isa, all))?;
        std::fs::write(path, text + "\n").map_err(|e| format!("{}: {e}", path.display()))?;
        println!("wrote {}", path.display());
    }
    Ok(())
}

/// The hidden worker: times `matrixmultiply` on `name` in this process (whose
/// `MATMUL_NUM_THREADS` the parent set) and prints `MEDIAN_S RUNS`.
pub fn matrixmultiply_worker(name: &str, threads: usize) -> Result<(), Error> {
    let w = workload::spine()
        .into_iter()
        .find(|w| w.name == name)
        .ok_or_else(|| format!("unknown workload `{name}`"))?;
    let pool = pool(threads)?;
    let (x, y) = w.inputs();
    let mut runner = PeerRunner::new(&w);
    let (want, got) = pool.install(|| {
        let want = peer_output(&w, &mut runner, Peer::Gemm, 1, &x, &y);
        let got = peer_output(&w, &mut runner, Peer::MatrixMultiply, threads, &x, &y);
        (want, got)
    });
    check(&w, "matrixmultiply", threads, &got, &want)?;
    let mut out = vec![0.0; got.len()];
    let t = pool.install(|| {
        measure(|| {
            runner.run(Peer::MatrixMultiply, threads, &x, &y, &mut out);
            Ok::<(), Infallible>(())
        })
    })?;
    println!("{} {}", t.median_s, t.runs);
    Ok(())
}

/// A rayon pool of `threads` threads.
fn pool(threads: usize) -> Result<rayon::ThreadPool, Error> {
    Ok(rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?)
}

/// Runs harl and the gemm crate once in `pool` and compares; returns the max relative error.
fn verify(w: &Workload, threads: usize, pool: &rayon::ThreadPool) -> Result<f64, Error> {
    let (x, y) = w.inputs();
    let mut runner = PeerRunner::new(w);
    let (got, want) = pool.install(|| -> Result<_, Error> {
        let mut got = vec![f32::NAN; w.lens().2];
        (w.kernel)(&x, &y, &mut got)?;
        let want = peer_output(w, &mut runner, Peer::Gemm, threads, &x, &y);
        Ok((got, want))
    })?;
    check(w, "harl", threads, &got, &want)
}

/// One call of `peer` on fresh output.
fn peer_output(
    w: &Workload,
    runner: &mut PeerRunner,
    peer: Peer,
    threads: usize,
    x: &[f32],
    y: &[f32],
) -> Vec<f32> {
    let mut out = vec![f32::NAN; w.lens().2];
    runner.run(peer, threads, x, y, &mut out);
    out
}

/// Compares `got` with `want`: the largest `|got - want| / (1 + |want|)` must be within
/// `1e-5 * K` (K the reduction length: rounding differences grow with it).
fn check(
    w: &Workload,
    what: &str,
    threads: usize,
    got: &[f32],
    want: &[f32],
) -> Result<f64, Error> {
    let tol = 1e-5 * w.gemm_shape().k as f64;
    let err = max_rel_err(got, want);
    let ok = got.len() == want.len() && err <= tol;
    println!(
        "  {:<12} {threads:>2} thread(s): {what} max relative error {err:.2e} (tolerance {tol:.1e}) {}",
        w.name,
        if ok { "ok" } else { "MISMATCH" }
    );
    if ok {
        Ok(err)
    } else {
        Err(format!(
            "{what} output of `{}` ({threads} thread(s)) differs from the gemm crate's: \
             max relative error {err:.3e} > {tol:.1e}",
            w.name
        )
        .into())
    }
}

/// The largest `|g - w| / (1 + |w|)`; NaN anywhere gives infinity.
fn max_rel_err(got: &[f32], want: &[f32]) -> f64 {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let e = (g as f64 - w as f64).abs() / (1.0 + (w as f64).abs());
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .fold(0.0, f64::max)
}

/// Times harl and the gemm crate in `pool`, and matrixmultiply in a child process.
fn time_row(
    w: &Workload,
    threads: usize,
    pool: &rayon::ThreadPool,
    max_rel_err: f64,
) -> Result<Row, Error> {
    let (x, y) = w.inputs();
    let mut out = vec![0.0; w.lens().2];
    let harl = pool.install(|| measure(|| (w.kernel)(&x, &y, &mut out)))?;
    let mut runner = PeerRunner::new(w);
    let gemm = pool.install(|| {
        measure(|| {
            runner.run(Peer::Gemm, threads, &x, &y, &mut out);
            Ok::<(), Infallible>(())
        })
    })?;
    let matrixmultiply = matrixmultiply_in_child(w.name, threads)?;
    let row = Row {
        workload: w.name,
        shape: w.describe(),
        schedule_source: w.schedule_source,
        threads,
        flops: w.flops(),
        harl,
        gemm,
        matrixmultiply,
        max_rel_err,
    };
    println!(
        "  {:<12} {threads:>2} thread(s): harl {:.3} ms, gemm {:.3} ms, matrixmultiply {:.3} ms",
        w.name,
        harl.median_s * 1e3,
        gemm.median_s * 1e3,
        matrixmultiply.median_s * 1e3
    );
    Ok(row)
}

/// Runs [`WORKER_COMMAND`] with `MATMUL_NUM_THREADS=threads` and reads its timing.
fn matrixmultiply_in_child(name: &str, threads: usize) -> Result<Timing, Error> {
    let output = Command::new(std::env::current_exe()?)
        .args([WORKER_COMMAND, name, &threads.to_string()])
        .env("MATMUL_NUM_THREADS", threads.to_string())
        .stderr(std::process::Stdio::inherit())
        .output()?;
    let stdout = String::from_utf8_lossy(&output.stdout);
    if !output.status.success() {
        return Err(format!(
            "matrixmultiply worker for `{name}` failed ({})",
            output.status
        )
        .into());
    }
    let timing_line = stdout.lines().last().unwrap_or_default();
    let mut fields = timing_line.split_whitespace();
    let (Some(median), Some(runs)) = (fields.next(), fields.next()) else {
        return Err(format!("matrixmultiply worker printed {stdout:?}").into());
    };
    Ok(Timing {
        median_s: median.parse()?,
        runs: runs.parse()?,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn check_rejects_a_mismatch_and_nan() {
        let w = workload::spine()[0];
        let want = vec![1.0f32; 8];
        assert!(check(&w, "test", 1, &want, &want).is_ok());
        let mut got = want.clone();
        got[3] = 1.5;
        assert!(check(&w, "test", 1, &got, &want).is_err());
        got[3] = f32::NAN;
        assert_eq!(max_rel_err(&got, &want), f64::INFINITY);
        assert!(check(&w, "test", 1, &got, &want).is_err());
    }
}
