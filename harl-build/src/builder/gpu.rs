//! GPU code of a kernel module: tuned GPU records per compute capability and the default GPU
//! program, as PTX.

use crate::cache::TuningCache;
use crate::lower::lower;
use crate::schedule::Schedule;
use crate::target::TargetFingerprint;
use harl_te::Graph;
use std::path::Path;

/// The compute capability the default GPU program's PTX targets (the driver JIT-compiles it for
/// any newer device).
const DEFAULT_PTX_CC: u32 = 70;

/// The best GPU record of the workload for each compute capability the cache has a file for
/// (`cuda-sm_XY.jsonl`), checked to lower and to bind blocks; bad records are warnings.
pub(super) fn gpu_records(
    name: &str,
    graph: &Graph,
    key: &str,
    cache_dir: &Path,
    warn: &mut dyn FnMut(String),
) -> Vec<((u32, u32), Schedule)> {
    let Ok(entries) = std::fs::read_dir(cache_dir) else {
        return Vec::new();
    };
    let mut classes: Vec<String> = entries
        .filter_map(Result::ok)
        .filter_map(|e| {
            e.file_name()
                .to_str()?
                .strip_suffix(".jsonl")
                .map(String::from)
        })
        .filter(|c| crate::target::cuda_capability(c).is_some())
        .collect();
    classes.sort();
    let cache = TuningCache::new(cache_dir);
    let mut out = Vec::new();
    for class in classes {
        let Some(cc) = crate::target::cuda_capability(&class) else {
            continue;
        };
        let probe = TargetFingerprint {
            arch: "cuda".into(),
            isa_class: class,
            features: vec![],
            cpu_model: "unknown".into(),
            cores: 1,
        };
        let lookup = cache.lookup(key, &probe, |r| {
            let bound = r
                .schedule
                .steps
                .iter()
                .any(|s| matches!(s, crate::schedule::Step::BindBlock { .. }));
            if !bound {
                return Err("not a GPU schedule".into());
            }
            lower(graph, &r.schedule)
                .map(|_| ())
                .map_err(|e| e.to_string())
        });
        for w in lookup.warnings {
            warn(format!(
                "kernel `{name}`: ignoring a GPU tuning record ({w})"
            ));
        }
        if let Some(r) = lookup.record {
            out.push((cc, r.schedule));
        }
    }
    out
}

/// The `GPU` item of a kernel module: its PTX programs (tuned ones first, then the default)
/// and launch plans.
pub(super) fn gpu_item(
    name: &str,
    graph: &Graph,
    tuned: &[((u32, u32), Schedule)],
    warn: &mut dyn FnMut(String),
) -> String {
    let sizes: Vec<usize> = graph
        .inputs
        .iter()
        .map(|t| t.shape.iter().product())
        .collect();
    let output = graph.stages.last().map_or(0, |s| s.size());
    let mut programs = Vec::new();
    for (cc, schedule) in tuned {
        match gpu_program(graph, schedule, Some(*cc)) {
            Ok(p) => programs.push(p),
            Err(why) => warn(format!(
                "kernel `{name}`: no tuned GPU code for sm_{}{}: {why}",
                cc.0, cc.1
            )),
        }
    }
    let default = crate::gpu_sketch::GpuSketch::new(graph)
        .ok_or_else(|| "invalid graph".to_string())
        .and_then(|sk| {
            sk.to_schedule(&sk.default_params())
                .map_err(|e| e.to_string())
        })
        .and_then(|s| gpu_program(graph, &s, None));
    match default {
        Ok(p) => programs.push(p),
        Err(why) => warn(format!("kernel `{name}`: no GPU code: {why}")),
    }
    let programs = programs.join(", ");
    format!(
        "\n/// GPU code of this kernel: see `harl::gpu`.\npub static GPU: ::harl::gpu::GpuKernel = ::harl::gpu::GpuKernel {{ name: {name:?}, inputs: &{sizes:?}, output: {output}, programs: &[{programs}] }};\n"
    )
}

/// A GPU schedule's program as a `harl::gpu::GpuProgram` expression: PTX for `tuned_for`'s
/// compute capability, or for [`DEFAULT_PTX_CC`] (any newer device) when `None`.
fn gpu_program(
    graph: &Graph,
    schedule: &Schedule,
    tuned_for: Option<(u32, u32)>,
) -> Result<String, String> {
    let f32_only = graph
        .inputs
        .iter()
        .map(|t| t.dtype)
        .chain(graph.stages.iter().map(|s| s.dtype))
        .all(|d| d == harl_te::DType::F32);
    if !f32_only {
        return Err("GPU kernels are f32-only for now".into());
    }
    let program = lower(graph, schedule).map_err(|e| e.to_string())?;
    let module = crate::cuda::emit(&program).map_err(|e| e.to_string())?;
    let cc = tuned_for.map_or(DEFAULT_PTX_CC, |(major, minor)| major * 10 + minor);
    let ptx = compile_ptx(&module.source, cc)?;
    let launches: Vec<String> = module
        .launches
        .iter()
        .map(|l| format!("({:?}, {}, {})", l.name, l.grid, l.block))
        .collect();
    let temps: Vec<usize> = module
        .buffers
        .iter()
        .take(module.buffers.len().saturating_sub(1))
        .map(|&s| program.graph.stages[s].size())
        .collect();
    Ok(format!(
        "::harl::gpu::GpuProgram {{ ptx: {ptx:?}, tuned_for: {tuned_for:?}, launches: &[{}], temps: &{temps:?} }}",
        launches.join(", ")
    ))
}

#[cfg(feature = "cuda")]
fn compile_ptx(source: &str, cc: u32) -> Result<String, String> {
    crate::nvrtc::compile_ptx(source, cc).map_err(|e| match e {
        crate::nvrtc::NvrtcError::NoNvrtc => "no NVRTC on the build host (install the CUDA toolkit, or `pip install nvidia-cuda-nvrtc-cu12` and put its lib/ on LD_LIBRARY_PATH)".to_string(),
        e => e.to_string(),
    })
}

#[cfg(not(feature = "cuda"))]
fn compile_ptx(_: &str, _: u32) -> Result<String, String> {
    Err("harl-build was built without its `cuda` feature (NVRTC), so no PTX was made".into())
}
