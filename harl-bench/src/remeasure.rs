//! `harl-bench remeasure DIR [--threads T] [--rounds R]`: times, in one run and interleaved,
//! the tuned schedule of every `DIR/*/summary.json`, the default schedule and (for GEMMs) the
//! `gemm` crate, so that the ratios do not depend on what else the machine did during tuning.
//! Prints a markdown table and writes `DIR/remeasure.json`.

use crate::harness::{gemm_gflops, measure_schedules};
use crate::stats::median;
use crate::suite;
use crate::workload::Matmul;
use crate::Error;
use harl_build::schedule::Schedule;
use serde_json::{json, Value};
use std::path::Path;

/// Re-measures every tuned workload under `dir`: `rounds` rounds, medians.
pub fn run(dir: &Path, threads: usize, rounds: usize) -> Result<(), Error> {
    let entries = crate::summarize::summary_files(dir)?;
    let mut rows = Vec::new();
    println!("| workload | tuned GFLOP/s | default GFLOP/s | tuned/default | gemm crate GFLOP/s | tuned/gemm |\n|---|---|---|---|---|---|");
    for path in entries {
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)?;
        let name = v["workload"].as_str().unwrap_or("?").to_string();
        let Some(best) = v.get("best_schedule").filter(|b| !b.is_null()) else {
            continue;
        };
        let best: Schedule = serde_json::from_value(best.clone())?;
        let workload = suite::resolve(&name)?;
        let graph = suite::build(&workload.spec)?;
        let flops = graph.flops();
        let mut tuned = Vec::new();
        let mut default = Vec::new();
        let mut peer = Vec::new();
        for round in 0..rounds.max(1) {
            let [t, d] = measure_schedules(&graph, &best, threads, round as u64)?;
            tuned.extend(t);
            default.extend(d);
            if let Some((m, k, n)) = suite::gemm_shape(&workload.spec) {
                peer.push(gemm_gflops(Matmul { m, k, n }, threads)?);
            }
        }
        let g = |l: &[f64]| median(l).map(|l| flops / l / 1e9);
        let (tg, dg, pg) = (g(&tuned), g(&default), median(&peer));
        let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
            (Some(a), Some(b)) => format!("{:.2}", a / b),
            _ => "-".into(),
        };
        let f1 = |x: Option<f64>| x.map_or("-".into(), |x| format!("{x:.1}"));
        println!(
            "| {name} | {} | {} | {} | {} | {} |",
            f1(tg),
            f1(dg),
            ratio(tg, dg),
            f1(pg),
            ratio(tg, pg)
        );
        rows.push(json!({ "workload": name, "threads": threads, "rounds": rounds,
            "tuned_gflops": tg, "default_gflops": dg, "peer": if pg.is_some() { "gemm" } else { "none" }, "peer_gflops": pg }));
    }
    std::fs::write(
        dir.join("remeasure.json"),
        serde_json::to_string_pretty(&rows)? + "\n",
    )?;
    Ok(())
}
