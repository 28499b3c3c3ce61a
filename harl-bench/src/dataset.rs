//! `harl-bench dataset`: tunes a published set of workloads and stores every measured trial
//! (workload graph, schedule, latency, this machine's fingerprint) as a cost-model dataset
//! ([`harl_tune::cost_model::dataset`]).
//!
//! ```text
//! harl-bench dataset --split train|eval --trials N --threads T --seed K --out FILE
//! ```
//!
//! `train` is what ships in harl-tune (`harl-tune/data/dataset-<isa-class>.jsonl.gz`): many shapes of the
//! op library's ops, none of them a kernel of `harl-bench models` or of the tuning suite.
//! `eval` is the tuning suite's workloads, held out: cost models are judged on them.

use crate::harness::{run_tasks, RunSpec};
use crate::suite;
use crate::Error;
use harl_build::target::TargetFingerprint;
use harl_tune::cost_model::dataset::{
    Dataset, DatasetHeader, DatasetTrial, DatasetWorkload, DATASET_VERSION,
};
use harl_tune::space::cpu::Task;
use std::path::PathBuf;
use std::time::Instant;

/// The training workloads (name, spec): off the shapes of `models` and of the suite.
pub const TRAIN: &[(&str, &str)] = &[
    ("mm_64", "matmul:m=64,k=64,n=64"),
    ("mm_96x200x160", "matmul:m=96,k=200,n=160"),
    ("mm_256x128x384", "matmul:m=256,k=128,n=384"),
    ("mm_200x300x100", "matmul:m=200,k=300,n=100"),
    ("mm_32x1024x256", "matmul:m=32,k=1024,n=256"),
    ("mm_384x256x64", "matmul:m=384,k=256,n=64"),
    ("gemv_512x1024", "matmul:m=1,k=512,n=1024"),
    ("mm_48x96x1000", "matmul:m=48,k=96,n=1000"),
    ("dense_32x512x512", "dense:m=32,k=512,n=512"),
    ("dense_100x256x200", "dense:m=100,k=256,n=200"),
    ("bmm_4x64x32x64", "batch_matmul:b=4,m=64,k=32,n=64"),
    ("bmm_8x50x64x50", "batch_matmul:b=8,m=50,k=64,n=50"),
    ("conv1d_32x512_k5", "conv1d:c=32,l=512,f=64,k=5,pad=2"),
    (
        "conv1d_128x128_s2",
        "conv1d:c=128,l=128,f=128,k=3,stride=2,pad=1",
    ),
    ("conv2d_32x28", "conv2d:c=32,h=28,w=28,f=32,kh=3,kw=3,pad=1"),
    (
        "conv2d_16x64_k5s2",
        "conv2d:c=16,h=64,w=64,f=32,kh=5,kw=5,stride=2,pad=2",
    ),
    (
        "conv2d_128x14_1x1",
        "conv2d:c=128,h=14,w=14,f=128,kh=1,kw=1",
    ),
    ("conv2d_96x20", "conv2d:c=96,h=20,w=20,f=48,kh=3,kw=3,pad=1"),
    (
        "dw_64x56_s2",
        "depthwise:c=64,h=56,w=56,kh=3,kw=3,stride=2,pad=1",
    ),
    ("dw_128x28_k5", "depthwise:c=128,h=28,w=28,kh=5,kw=5,pad=2"),
    ("softmax_64x500", "softmax:rows=64,cols=500"),
    ("layer_norm_100x512", "layer_norm:rows=100,cols=512"),
    (
        "conv3d_8x8x16",
        "conv3d:c=8,d=8,h=16,w=16,f=16,kd=3,kh=3,kw=3,pad=1",
    ),
    (
        "conv2d_t_64x8",
        "conv2d_transpose:c=64,h=8,w=8,f=32,kh=4,kw=4,stride=2,pad=1",
    ),
];

/// The held-out workloads: the tuning suite's (none of them in [`TRAIN`]).
pub const EVAL: &[&str] = &[
    "gemm_512",
    "gemm_128x768x3072",
    "batch_gemm",
    "conv1d",
    "conv2d_56",
    "depthwise_112",
];

/// Options of `dataset`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// `train` (the shipped set) or `eval` (the held-out suite workloads).
    #[arg(long, default_value = "train")]
    pub split: String,
    /// Trials per workload.
    #[arg(long, default_value_t = 64, value_parser = crate::harness::positive)]
    pub trials: usize,
    /// Threads the kernels run on.
    #[arg(long, default_value_t = 1, value_parser = crate::harness::positive)]
    pub threads: usize,
    /// Seed.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Strategy (and cost model, after `@`) that picks the measured schedules: cold XGBoost
    /// by default, so a dataset never depends on the datasets already shipped.
    #[arg(long, default_value = "ansor@xgb")]
    pub strategy: String,
    /// Only these workloads (names of the split), for a quick run.
    #[arg(long, value_delimiter = ',')]
    pub only: Vec<String>,
    /// The dataset file (gzipped JSON lines).
    #[arg(long)]
    pub out: PathBuf,
}

/// The (name, spec) pairs of a split.
pub fn split(name: &str) -> Result<Vec<(String, String)>, Error> {
    match name {
        "train" => Ok(TRAIN
            .iter()
            .map(|(n, s)| (n.to_string(), s.to_string()))
            .collect()),
        "eval" => EVAL
            .iter()
            .map(|n| Ok((n.to_string(), suite::resolve(n)?.spec)))
            .collect(),
        other => Err(format!("unknown split `{other}` (train, eval)").into()),
    }
}

/// This machine's fingerprint, as the bench's variant (`HARL_ISA`) presents it.
pub(crate) fn bench_target() -> TargetFingerprint {
    let mut t = TargetFingerprint::host();
    t.isa_class = crate::harness::bench_variant().isa_class(&t.arch);
    t
}

/// Tunes the split's workloads and writes the dataset.
pub fn run(o: &Options) -> Result<(), Error> {
    let start = Instant::now();
    let mut workloads = Vec::new();
    for (name, spec) in split(&o.split)? {
        if !o.only.is_empty() && !o.only.contains(&name) {
            continue;
        }
        let graph = suite::build(&spec)?;
        let t0 = Instant::now();
        let r = run_tasks(
            vec![Task::new(name.clone(), graph.clone(), 1.0)],
            &RunSpec {
                strategy: &o.strategy,
                scheduler: "round-robin",
                trials: o.trials,
                seed: o.seed,
                threads: o.threads,
                batch: 16,
                seed_default: true,
            },
        )?;
        let trials: Vec<DatasetTrial> = r
            .tasks
            .iter()
            .flat_map(|t| &t.trials)
            .map(|t| DatasetTrial {
                schedule: t.candidate.schedule.clone(),
                latency_s: t.latency_s,
            })
            .collect();
        println!(
            "{name}: {} trials ({} failed) in {:.0} s",
            trials.len(),
            trials.iter().filter(|t| t.latency_s.is_none()).count(),
            t0.elapsed().as_secs_f64()
        );
        workloads.push(DatasetWorkload {
            name,
            graph,
            trials,
        });
    }
    let dataset = Dataset {
        header: DatasetHeader {
            version: DATASET_VERSION,
            target: bench_target(),
            threads: o.threads,
            note: format!(
                "harl-bench dataset --split {} --trials {} --threads {} --seed {} --strategy {}",
                o.split, o.trials, o.threads, o.seed, o.strategy
            ),
        },
        workloads,
    };
    if let Some(dir) = o.out.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    dataset.write(&o.out)?;
    println!(
        "{} workloads, {} trials in {:.0} s -> {}",
        dataset.workloads.len(),
        dataset.trials(),
        start.elapsed().as_secs_f64(),
        o.out.display()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn the_shipped_datasets_hold_no_benchmark_or_held_out_workload() {
        let models = crate::models::workload_keys().expect("models");
        let eval: Vec<String> = split("eval")
            .expect("eval")
            .into_iter()
            .map(|(_, spec)| suite::build(&spec).expect("graph").workload_key())
            .collect();
        for shipped in Dataset::shipped() {
            let shipped = shipped.as_ref().expect("the shipped dataset parses");
            let keys: HashSet<String> = shipped
                .workloads
                .iter()
                .map(|w| w.graph.workload_key())
                .collect();
            assert_eq!(keys.len(), shipped.workloads.len(), "a workload twice");
            for k in models.iter().chain(&eval) {
                assert!(
                    !keys.contains(k),
                    "a benchmark or held-out workload is in the dataset"
                );
            }
            // The training list is what was measured.
            let names: HashSet<&str> = shipped.workloads.iter().map(|w| w.name.as_str()).collect();
            assert_eq!(names, TRAIN.iter().map(|(n, _)| *n).collect());
        }
    }
}
