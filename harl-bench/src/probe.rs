//! `harl-bench probe --workload W [--threads T] [--rounds R]` (W a suite name or spec, a
//! `models` kernel's name, or `TASKS.json@NAME`, a task of an `e2e` task list): a check of the
//! measurer itself.
//! It times, in one batch and in a rotating order, the default schedule twice and the point of
//! every sketch that reproduces the default's loops (the tuner's seeds), so that a gap between
//! schedules that should run alike shows whether it comes from the code or from where in a
//! batch a candidate was timed.

use crate::harness::{host_target, measure_rotating_flushed};
use crate::suite;
use crate::Error;
use harl_build::default_schedule::default_schedule;
use harl_tune::space::cpu::generate_sketches;

/// What `probe` times and where it writes.
pub struct Probe<'a> {
    /// Suite name or spec, or a `models` kernel's name.
    pub workload: &'a str,
    /// Threads of the timed runs.
    pub threads: usize,
    /// Rounds (each candidate once a round, in a rotating order).
    pub rounds: usize,
    /// Where to write each candidate's generated module.
    pub emit: Option<&'a std::path::Path>,
    /// Where to write the default schedule (JSON); nothing is timed then.
    pub save_default: Option<&'a std::path::Path>,
    /// Schedules (JSON) to time beside the default, each named by its file.
    pub against: &'a [std::path::PathBuf],
    /// Evict the caches before each timed run (weights and inputs cold, as in a network).
    pub cold: bool,
}

/// Bytes written before each timed run with `--cold`: twice a 32 MB L3.
const COLD_FLUSH_BYTES: usize = 64 << 20;

/// The graph of the task named `name` (its `name` or `kernel` field) in a task list such as
/// `e2e`'s `tasks.json` or `tuning-cache/networks/<net>.json`.
fn listed_task(file: &str, name: &str) -> Result<harl_te::Graph, Error> {
    #[derive(serde::Deserialize)]
    struct Listed {
        #[serde(default)]
        name: String,
        kernel: String,
        graph: harl_te::Graph,
    }
    let text = std::fs::read_to_string(file)?;
    let listed: Vec<Listed> = serde_json::from_str(&text).map_err(|e| format!("{file}: {e}"))?;
    let task = listed
        .into_iter()
        .find(|t| t.name == name || t.kernel == name)
        .ok_or_else(|| format!("{file}: no task named `{name}`"))?;
    task.graph
        .validate()
        .map_err(|e| format!("{file} {name}: {e}"))?;
    Ok(task.graph)
}

/// Times the default schedule (twice) and the schedules of `against`, or, without those, the
/// sketches' default points, `rounds` rounds; with `emit`, also writes each schedule's generated Rust module there
/// (`0.rs`, `1.rs`, ...).
pub fn run(p: &Probe<'_>) -> Result<(), Error> {
    let (workload, threads, rounds, emit) = (p.workload, p.threads, p.rounds, p.emit);
    let graph = match crate::models::kernel_graph(workload) {
        Some(graph) => graph?,
        None => match workload.split_once('@') {
            Some((file, name)) if file.ends_with(".json") => listed_task(file, name)?,
            _ => suite::build(&suite::resolve(workload)?.spec)?,
        },
    };
    let target = host_target(threads);
    if let Some(file) = p.save_default {
        let json = serde_json::to_string_pretty(&default_schedule(&graph, &target))
            .map_err(|e| e.to_string())?;
        std::fs::write(file, json)?;
        return Ok(());
    }
    let mut named = vec![
        ("default".to_string(), default_schedule(&graph, &target)),
        (
            "default (again)".to_string(),
            default_schedule(&graph, &target),
        ),
    ];
    for file in p.against {
        let text = std::fs::read_to_string(file)?;
        let schedule =
            serde_json::from_str(&text).map_err(|e| format!("{}: {e}", file.display()))?;
        let name = file
            .file_stem()
            .map_or_else(|| "against".into(), |s| s.to_string_lossy().into_owned());
        named.push((name, schedule));
    }
    // An A/B times only the defaults; otherwise the sketches' seeds too.
    let seeds = if p.against.is_empty() {
        generate_sketches(&graph, &target)
    } else {
        Vec::new()
    };
    for (i, sk) in seeds.iter().enumerate() {
        if let Some(p) = sk.default_params(i, &target) {
            named.push((format!("seed of {}", sk.name()), sk.to_schedule(&p)?));
        }
    }
    if let Some(dir) = emit {
        write_sources(dir, &graph, &named)?;
    }
    let schedules: Vec<_> = named.iter().map(|(_, s)| s.clone()).collect();
    let flush = if p.cold { COLD_FLUSH_BYTES } else { 0 };
    let latencies = measure_rotating_flushed(&graph, &schedules, threads, rounds, flush)?;
    let flops = graph.flops();
    // The latency column too: a task without multiply-adds (a transpose) has no GFLOP/s.
    println!(
        "| schedule | median GFLOP/s | min | max | runs | median us |\n|---|---|---|---|---|---|"
    );
    for ((name, _), mut l) in named.into_iter().zip(latencies) {
        l.sort_by(f64::total_cmp);
        let g = |x: Option<&f64>| x.map_or("-".into(), |x| format!("{:.1}", flops / x / 1e9));
        let median = l.get(l.len() / 2);
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            g(median),
            g(l.last()),
            g(l.first()),
            l.len(),
            median.map_or("-".into(), |x| format!("{:.1}", x * 1e6))
        );
    }
    Ok(())
}

/// Writes the Rust module each schedule generates (the host's variant, as measured) to `dir/<k>.rs`.
fn write_sources(
    dir: &std::path::Path,
    graph: &harl_te::Graph,
    named: &[(String, harl_build::schedule::Schedule)],
) -> Result<(), Error> {
    use harl_build::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
    std::fs::create_dir_all(dir)?;
    let meta = KernelMeta {
        name: "kernel".into(),
        params: (0..graph.inputs.len()).map(|i| format!("in{i}")).collect(),
        output: "out".into(),
    };
    for (k, (name, schedule)) in named.iter().enumerate() {
        let program = harl_build::lower::lower(graph, schedule)?;
        let variant = VariantProgram {
            variant: Variant::host(),
            program,
            source: name.clone(),
        };
        let src = emit_module(graph, std::slice::from_ref(&variant), &meta);
        std::fs::write(dir.join(format!("{k}.rs")), format!("// {name}\n{src}"))?;
    }
    Ok(())
}
