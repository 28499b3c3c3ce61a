//! `harl-bench record`: measures the quickstart's kernels as built here and appends one tuning
//! record per kernel (its schedule and measured median latency) to a cache directory.
//!
//! There is no search yet, so the recorded schedule is the one this build used (the default
//! schedule of the variant this CPU runs). The record is honest data: that schedule, measured
//! on this machine. It lets the quickstart exercise its "cache record present" path.

use crate::timing::measure;
use crate::Error;
use harl_build::cache::{Record, TuningCache};
use harl_build::codegen::Variant;
use harl_build::default_schedule::default_schedule;
use harl_build::target::TargetFingerprint;
use harl_te::Graph;
use std::path::{Path, PathBuf};

/// Options of `record`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// Cache directory the records go to.
    #[arg(long, default_value = "examples/quickstart/tuning-cache")]
    pub out: PathBuf,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            out: PathBuf::from("examples/quickstart/tuning-cache"),
        }
    }
}

/// Runs a compiled-in kernel on flat inputs.
type Runner = fn(&[Vec<f32>], &mut [f32]) -> Result<(), harl::KernelError>;

/// A compiled-in kernel: its graph (rebuilt the way build.rs found it), where its schedule came
/// from, and a runner over flat f32 inputs.
struct Compiled {
    name: &'static str,
    graph: Graph,
    source: &'static str,
    run: Runner,
}

fn quickstart_graphs() -> Result<Vec<(String, Graph)>, Error> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../examples/quickstart/src");
    let mut found = Vec::new();
    harl_build::scan::scan_path(&src, &mut found)
        .map_err(|(p, e)| format!("{}: {e}", p.display()))?;
    Ok(found.into_iter().map(|d| (d.name, d.graph)).collect())
}

fn compiled() -> Result<Vec<Compiled>, Error> {
    let graphs = quickstart_graphs()?;
    let graph = |name: &str| -> Result<Graph, Error> {
        graphs
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, g)| g.clone())
            .ok_or_else(|| format!("the quickstart no longer declares `{name}`").into())
    };
    let out = vec![
        Compiled {
            name: "dense_relu",
            graph: graph("dense_relu")?,
            source: crate::kernels::qs_dense_relu::schedule_source(),
            run: |x, out| crate::kernels::qs_dense_relu::run(&x[0], &x[1], &x[2], out),
        },
        Compiled {
            name: "conv3x3",
            graph: graph("conv3x3")?,
            source: crate::kernels::qs_conv3x3::schedule_source(),
            run: |x, out| crate::kernels::qs_conv3x3::run(&x[0], &x[1], out),
        },
    ];
    for c in &out {
        let key = match c.name {
            "dense_relu" => crate::kernels::qs_dense_relu::WORKLOAD_KEY,
            _ => crate::kernels::qs_conv3x3::WORKLOAD_KEY,
        };
        if c.graph.workload_key() != key {
            return Err(format!(
                "`{}` changed since this binary was built; rebuild harl-bench",
                c.name
            )
            .into());
        }
    }
    Ok(out)
}

/// The variant `Isa::detect` picks on this CPU.
fn host_variant(target: &TargetFingerprint) -> Variant {
    Variant::ALL
        .into_iter()
        .find(|v| v.isa_class(&target.arch) == target.isa_class)
        .unwrap_or(Variant::Base)
}

/// Measures each quickstart kernel and appends its record.
pub fn run(options: &Options) -> Result<(), Error> {
    let target = TargetFingerprint::host();
    let variant = host_variant(&target);
    let cache = TuningCache::new(&options.out);
    for k in compiled()? {
        if k.source != "default schedule" {
            println!(
                "{}: built from a cache record already ({}); not recording",
                k.name, k.source
            );
            continue;
        }
        let inputs: Vec<Vec<f32>> = k
            .graph
            .inputs
            .iter()
            .enumerate()
            .map(|(i, p)| {
                let n: usize = p.shape.iter().product();
                (0..n)
                    .map(|j| ((i * 7 + j * 13) % 17) as f32 / 17.0 - 0.5)
                    .collect()
            })
            .collect();
        let mut out = vec![0.0f32; k.graph.stages.last().map_or(0, |s| s.size())];
        let timing = measure(|| (k.run)(&inputs, &mut out))?;
        let schedule = default_schedule(
            &k.graph,
            &variant.cpu_target(&target.arch, target.cores.max(1)),
        );
        let record = Record::new(
            k.graph.workload_key(),
            format!("quickstart {}", k.name),
            target.clone(),
            schedule,
            timing.median_s,
            1,
        );
        let path = cache.append(&record)?;
        println!(
            "{}: median {:.3} ms over {} runs -> {}",
            k.name,
            timing.median_s * 1e3,
            timing.runs,
            path.display()
        );
    }
    Ok(())
}
