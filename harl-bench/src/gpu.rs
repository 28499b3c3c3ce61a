//! `harl-bench gpu`: tunes one workload's GPU schedule on device 0 and compares it with cuBLAS
//! (GEMMs) on the same inputs.
//!
//! ```text
//! harl-bench gpu --workload W --trials N --seed K --out DIR [--batch B] [--record CACHE_DIR]
//!                [--strategy harl|ansor|autotvm|random]
//! ```
//!
//! The search is the tuning loop `cargo harl tune` runs, over the GPU sketch space
//! ([`harl_tune::space::GpuSpace`]) with any of the CPU search's strategies and the XGBoost
//! model; the default GPU schedule is measured first. Writes `DIR/summary.json` and
//! `DIR/curve.csv` like `tune`.
//! On a machine without a GPU, CUDA driver or NVRTC it fails with the reason.

use crate::suite;
use crate::Error;
use harl_build::schedule::Schedule;
use harl_te::Graph;
use harl_tune::cost_model::XgbModel;
use harl_tune::measure::gpu::{GpuMeasureConfig, GpuMeasurer};
use harl_tune::measure::Measure;
use harl_tune::space::GpuSpace;
use harl_tune::strategy::{strategy_by_name, TaskState, STRATEGY_NAMES};
use harl_tune::task_scheduler::RoundRobin;
use harl_tune::tuner::{best_candidate, default_latency, tune_states, TuneOptions};
use serde_json::json;
use std::path::PathBuf;

/// Options of `gpu`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Suite name or spec.
    #[arg(long)]
    pub workload: String,
    /// Trial budget.
    #[arg(long, default_value_t = 200, value_parser = crate::harness::positive)]
    pub trials: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Candidates per round.
    #[arg(long, default_value_t = 32, value_parser = crate::harness::positive)]
    pub batch: usize,
    /// Output directory.
    #[arg(long, default_value = "gpu-out")]
    pub out: PathBuf,
    /// Append the best schedule to this tuning cache (`cuda-sm_XY.jsonl`).
    #[arg(long)]
    pub record: Option<PathBuf>,
    /// The search strategy, as `cargo harl tune --strategy`.
    #[arg(long, default_value = "harl", value_parser = gpu_strategy)]
    pub strategy: String,
}

fn gpu_strategy(s: &str) -> Result<String, String> {
    match strategy_by_name::<GpuSpace>(s, 0) {
        Some(_) => Ok(s.to_string()),
        None => Err(format!("unknown strategy `{s}` ({STRATEGY_NAMES})")),
    }
}

/// The GPU measurer, printing each failed trial.
struct Logged<'a> {
    m: &'a mut GpuMeasurer,
    trial: usize,
}

impl Measure for Logged<'_> {
    fn measure(&mut self, graph: &Graph, schedules: &[Schedule]) -> Vec<Result<f64, String>> {
        let results = self.m.measure(graph, schedules);
        for r in &results {
            self.trial += 1;
            if let Err(e) = r {
                eprintln!("  trial {}: {e}", self.trial);
            }
        }
        results
    }
}

/// Runs the GPU tuning job.
pub fn run(o: &Options) -> Result<(), Error> {
    let workload = suite::resolve(&o.workload)?;
    let graph = suite::build(&workload.spec)?;
    let flops = graph.flops();
    let space = GpuSpace::new(&graph).ok_or("the graph has no GPU schedule")?;
    let mut m = GpuMeasurer::new(GpuMeasureConfig {
        seed: o.seed,
        ..GpuMeasureConfig::default()
    })?;
    let (device, cc) = m.device();
    println!(
        "{}: tuning on {device} (compute capability {}.{})",
        workload.name, cc.0, cc.1
    );
    let options = TuneOptions {
        trials: o.trials,
        batch: o.batch,
        time_budget: None,
        reserve_rounds: 0,
        seed: o.seed,
        seed_default: true,
    };
    let mut strategy =
        strategy_by_name::<GpuSpace>(&o.strategy, o.seed).ok_or("unknown strategy")?;
    let task = harl_tune::task::Task::new(workload.name.clone(), graph.clone(), 1.0);
    let result = tune_states(
        vec![TaskState::with_space(task, space)],
        &options,
        strategy.as_mut(),
        &mut RoundRobin::default(),
        &mut XgbModel::with_seed(o.seed),
        &mut Logged {
            m: &mut m,
            trial: 0,
        },
    );
    let mut curve = String::from("trial,best_latency_s,elapsed_s\n");
    for p in &result.curve {
        curve.push_str(&format!(
            "{},{:e},{:.3}\n",
            p.trial, p.best_latency_s, p.elapsed_s
        ));
    }
    let state = result.tasks.first().ok_or("no task")?;
    let best = best_candidate(state).map(|(c, l)| (l, c.params.clone(), c.schedule.clone()));
    let default_latency = default_latency(state);
    let n_trials = result.trials;
    let failed = state
        .trials
        .iter()
        .filter(|t| t.latency_s.is_none())
        .count();
    let wall = result.wall_s;
    let peer = match suite::gemm_shape(&workload.spec) {
        Some((mm, k, n)) => Some(cublas_gflops(&m, mm, k, n)?),
        None => None,
    };
    let best_latency = best.as_ref().map(|(l, _, _)| *l);
    let gf = |l: Option<f64>| l.map(|l| flops / l / 1e9);
    let summary = json!({
        "workload": workload.name,
        "device": device,
        "compute_capability": format!("{}.{}", cc.0, cc.1),
        "trials": n_trials,
        "failed_trials": failed,
        "seed": o.seed,
        "strategy": o.strategy,
        "best_latency_s": best_latency,
        "gflops": gf(best_latency),
        "default_gflops": gf(default_latency),
        "tune_wall_s": wall,
        "trials_per_s": n_trials as f64 / wall.max(1e-9),
        "peer": if peer.is_some() { "cublas" } else { "none" },
        "peer_gflops": peer,
        "best_params": best.as_ref().map(|(_, p, _)| serde_json::to_value(p).unwrap_or_default()),
    });
    std::fs::create_dir_all(&o.out)?;
    std::fs::write(
        o.out.join("summary.json"),
        serde_json::to_string_pretty(&summary)? + "\n",
    )?;
    std::fs::write(o.out.join("curve.csv"), curve)?;
    if let (Some(dir), Some((latency, _, schedule))) = (&o.record, &best) {
        let schedule = schedule.clone();
        let record = harl_build::cache::Record::new(
            graph.workload_key(),
            workload.name.clone(),
            m.fingerprint(),
            schedule,
            *latency,
            n_trials as u64,
        );
        let path = harl_build::cache::TuningCache::new(dir).append(&record)?;
        println!("recorded in {}", path.display());
    }
    println!(
        "{} [gpu] {} trials in {wall:.1} s: best {} GFLOP/s, default {} GFLOP/s, cuBLAS {} GFLOP/s",
        workload.name,
        n_trials,
        gf(best_latency).map_or("-".into(), |g| format!("{g:.0}")),
        gf(default_latency).map_or("-".into(), |g| format!("{g:.0}")),
        peer.map_or("-".into(), |g| format!("{g:.0}")),
    );
    Ok(())
}

/// cuBLAS SGEMM on the same device, row-major `[m, k] x [k, n]`: median of 5 event-timed groups.
fn cublas_gflops(m: &GpuMeasurer, mm: usize, k: usize, n: usize) -> Result<f64, Error> {
    use cudarc::cublas::{sys::cublasOperation_t, CudaBlas, Gemm, GemmConfig};
    let stream = m.stream().clone();
    let blas = CudaBlas::new(stream.clone())?;
    let a = stream.clone_htod(&vec![0.5f32; mm * k])?;
    let b = stream.clone_htod(&vec![0.25f32; k * n])?;
    let mut c = stream.alloc_zeros::<f32>(mm * n)?;
    let int = |x: usize| i32::try_from(x).map_err(|e| e.to_string());
    // Row-major C = A B is column-major C^T = B^T A^T: swap the operands.
    let cfg = GemmConfig {
        transa: cublasOperation_t::CUBLAS_OP_N,
        transb: cublasOperation_t::CUBLAS_OP_N,
        m: int(n)?,
        n: int(mm)?,
        k: int(k)?,
        alpha: 1.0f32,
        lda: int(n)?,
        ldb: int(k)?,
        beta: 0.0f32,
        ldc: int(n)?,
    };
    let mut run = || -> Result<(), Error> {
        // SAFETY: the buffers were allocated above with exactly the sizes the configuration
        // describes (b: k x n, a: m x k, c: m x n), on this stream.
        unsafe { blas.gemm(cfg, &b, &a, &mut c) }?;
        Ok(())
    };
    for _ in 0..3 {
        run()?;
    }
    let timing = Some(cudarc::driver::sys::CUevent_flags::CU_EVENT_DEFAULT);
    let mut times = Vec::new();
    for _ in 0..5 {
        let start = stream.record_event(timing)?;
        for _ in 0..20 {
            run()?;
        }
        let end = stream.record_event(timing)?;
        end.synchronize()?;
        times.push(f64::from(start.elapsed_ms(&end)?) * 1e-3 / 20.0);
    }
    times.sort_by(f64::total_cmp);
    Ok(2.0 * (mm * k * n) as f64 / times[2] / 1e9)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `gpu`'s options as clap parses them.
    #[derive(clap::Parser)]
    struct Cli {
        #[command(flatten)]
        options: Options,
    }

    fn parse(args: &[&str]) -> Result<Options, clap::Error> {
        use clap::Parser;
        Cli::try_parse_from(std::iter::once("gpu").chain(args.iter().copied())).map(|c| c.options)
    }

    #[test]
    fn options_parse_and_reject() {
        let o =
            parse(&["--workload", "gemm_1024", "--trials", "300", "--out", "d"]).expect("parses");
        assert_eq!((o.trials, o.batch, o.seed), (300, 32, 0));
        assert_eq!(o.strategy, "harl");
        let h = parse(&["--workload", "gemm_128", "--strategy", "ansor"]).expect("parses");
        assert_eq!(h.strategy, "ansor");
        assert!(parse(&["--workload", "gemm_128", "--strategy", "sampling"]).is_err());
        assert!(parse(&["--trials", "3"]).is_err());
        assert!(parse(&["--workload", "gemm_128", "--trials", "0"]).is_err());
        assert!(parse(&["--workload"]).is_err());
    }

    #[test]
    fn without_a_gpu_it_is_an_error_not_a_panic() {
        // SAFETY: a dlopen probe.
        if unsafe { cudarc::driver::sys::is_culib_present() } {
            eprintln!("skipped: this machine has a CUDA driver");
            return;
        }
        let o = parse(&[
            "--workload",
            "gemm_128",
            "--trials",
            "4",
            "--out",
            "/nonexistent-harl",
        ])
        .expect("parses");
        let e = run(&o).expect_err("no driver");
        assert!(e.to_string().contains("no CUDA driver"), "{e}");
    }
}
