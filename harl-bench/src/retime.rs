//! `harl-bench compare-retime DIR [--rounds R]`: times the best schedule of every saved run of
//! one `compare` directory again, all of them and the default schedule in one batch per round,
//! rotating their order, and reports medians.
//!
//! A run's final figure is the fastest of the search's own measurements, a minimum over noisy
//! timings taken hours apart from the other strategy's; this puts every winner through the
//! same conditions so that the strategies' ratio rests on like-for-like timings. Needs run
//! files that keep `best_params` (written since `compare` keeps them). Prints a markdown table
//! and writes `DIR/retime.json`.

use crate::harness::{host_target, measure_rotating};
use crate::stats::median;
use crate::suite;
use crate::Error;
use harl_build::default_schedule::default_schedule;
use harl_build::schedule::Schedule;
use harl_tune::space::cpu::{generate_sketches, Params};
use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::path::Path;

/// One saved run's winner.
struct Winner {
    strategy: String,
    seed: u64,
    /// The search's own best latency (the curve's last point).
    searched_s: f64,
    schedule: Schedule,
}

/// `<strategy>-seed<k>.json` -> (strategy, k).
fn run_name(file_stem: &str) -> Option<(String, u64)> {
    let (strategy, seed) = file_stem.rsplit_once("-seed")?;
    Some((strategy.to_string(), seed.parse().ok()?))
}

/// The winners of the run files under `DIR/runs/` that keep their best parameters.
fn winners(dir: &Path, graph: &harl_te::Graph, threads: usize) -> Result<Vec<Winner>, Error> {
    let sketches = generate_sketches(graph, &host_target(threads));
    let runs = dir.join("runs");
    let mut paths: Vec<_> = std::fs::read_dir(&runs)
        .map_err(|e| format!("{}: {e}", runs.display()))?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        .collect();
    paths.sort();
    let mut out = Vec::new();
    for path in paths {
        let Some((strategy, seed)) = path
            .file_stem()
            .and_then(|s| run_name(&s.to_string_lossy()))
        else {
            continue;
        };
        let v: Value = serde_json::from_str(&std::fs::read_to_string(&path)?)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let Some(best) = v.get("best_params").filter(|b| !b.is_null()) else {
            eprintln!(
                "{}: no best_params (written before runs kept them); skipped",
                path.display()
            );
            continue;
        };
        let params: Params = serde_json::from_value(best.clone())
            .map_err(|e| format!("{}: best_params: {e}", path.display()))?;
        let sketch = sketches.get(params.sketch).ok_or_else(|| {
            format!(
                "{}: sketch {} is not a sketch of this workload here",
                path.display(),
                params.sketch
            )
        })?;
        let schedule = sketch
            .to_schedule(&params)
            .map_err(|e| format!("{}: {e}", path.display()))?;
        let searched_s = v["curve"]
            .as_array()
            .and_then(|c| c.last())
            .and_then(|p| p.get(1))
            .and_then(Value::as_f64)
            .unwrap_or(f64::NAN);
        out.push(Winner {
            strategy,
            seed,
            searched_s,
            schedule,
        });
    }
    Ok(out)
}

/// Re-times the winners of `dir` (one `compare --workload` directory), `rounds` rounds.
pub fn run(dir: &Path, rounds: usize) -> Result<(), Error> {
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(dir.join("compare.json"))
            .map_err(|e| format!("{}: {e}", dir.join("compare.json").display()))?,
    )?;
    let name = report["workload"]
        .as_str()
        .ok_or("compare.json: no workload")?;
    let threads = report["threads"].as_u64().unwrap_or(1) as usize;
    let baseline = report["baseline"].as_str().unwrap_or("ansor");
    let workload = suite::resolve(name)?;
    let graph = suite::build(&workload.spec)?;
    let flops = graph.flops();
    let winners = winners(dir, &graph, threads)?;
    if winners.is_empty() {
        return Err(format!("{}: no run keeps its best parameters", dir.display()).into());
    }
    // The default schedule rides along as a drift check against the runs' first trials.
    let mut schedules: Vec<Schedule> = winners.iter().map(|w| w.schedule.clone()).collect();
    schedules.push(default_schedule(&graph, &host_target(threads)));
    let n = schedules.len();
    let latencies = measure_rotating(&graph, &schedules, threads, rounds)?;
    let gflops = |l: Option<f64>| l.map(|l| flops / l / 1e9);
    let f1 = |x: Option<f64>| x.map_or("-".to_string(), |x| format!("{x:.1}"));
    println!("| strategy | seed | searched GFLOP/s | re-timed GFLOP/s (median of {rounds}) | re-timed range |\n|---|---|---|---|---|");
    // Slowest and fastest timing of a schedule, as GFLOP/s.
    let range = |l: &[f64]| {
        let lo = l
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(f64::INFINITY, f64::min);
        let hi = l
            .iter()
            .copied()
            .filter(|x| x.is_finite())
            .fold(0.0, f64::max);
        (hi > 0.0).then(|| (flops / hi / 1e9, flops / lo / 1e9))
    };
    let fr = |r: Option<(f64, f64)>| r.map_or("-".to_string(), |(a, b)| format!("{a:.1}-{b:.1}"));
    let mut per_strategy: BTreeMap<&str, (Vec<f64>, Vec<f64>)> = BTreeMap::new();
    let mut rows = Vec::new();
    for (w, l) in winners.iter().zip(&latencies) {
        let (searched, retimed) = (gflops(Some(w.searched_s)), gflops(median(l)));
        println!(
            "| {} | {} | {} | {} | {} |",
            w.strategy,
            w.seed,
            f1(searched),
            f1(retimed),
            fr(range(l))
        );
        let e = per_strategy.entry(&w.strategy).or_default();
        e.0.extend(searched);
        e.1.push(retimed.unwrap_or(f64::NAN));
        rows.push(json!({ "strategy": w.strategy, "seed": w.seed,
            "searched_gflops": searched, "retimed_gflops": retimed, "latencies_s": l }));
    }
    let default = gflops(median(&latencies[n - 1]));
    println!(
        "| default schedule | - | - | {} | {} |",
        f1(default),
        fr(range(&latencies[n - 1]))
    );
    let base = per_strategy.get(baseline).and_then(|(_, r)| median(r));
    let mut summary = serde_json::Map::new();
    println!("\n| strategy | searched GFLOP/s (median over seeds) | re-timed | re-timed / {baseline} re-timed |\n|---|---|---|---|");
    for (s, (searched, retimed)) in &per_strategy {
        let (ms, mr) = (median(searched), median(retimed));
        let ratio = match (mr, base) {
            (Some(a), Some(b)) if b > 0.0 => Some(a / b),
            _ => None,
        };
        println!(
            "| {s} | {} | {} | {} |",
            f1(ms),
            f1(mr),
            ratio.map_or("-".to_string(), |r| format!("{r:.2}"))
        );
        summary.insert(
            s.to_string(),
            json!({ "searched_gflops": ms, "retimed_gflops": mr, "retimed_ratio_to_baseline": ratio }),
        );
    }
    let out = json!({
        "workload": name, "threads": threads, "rounds": rounds, "baseline": baseline,
        "default_gflops": default, "strategies": summary, "runs": rows,
    });
    std::fs::write(
        dir.join("retime.json"),
        serde_json::to_string_pretty(&out)? + "\n",
    )?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_files_name_their_strategy_and_seed() {
        assert_eq!(run_name("harl-seed2"), Some(("harl".into(), 2)));
        assert_eq!(
            run_name("harl-elite50-seed10"),
            Some(("harl-elite50".into(), 10))
        );
        assert_eq!(run_name("notes"), None);
        assert_eq!(run_name("ansor-seedx"), None);
    }

    #[test]
    fn a_directory_without_runs_is_an_error() {
        let dir = std::env::temp_dir().join(format!("harl-retime-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        std::fs::write(
            dir.join("compare.json"),
            r#"{"workload":"gemm_128","threads":1,"baseline":"ansor"}"#,
        )
        .expect("write");
        let r = run(&dir, 1);
        let _ = std::fs::remove_dir_all(&dir);
        assert!(r.is_err());
        assert!(run(Path::new("/nonexistent-harl-dir"), 1).is_err());
    }

    #[test]
    fn winners_rebuild_the_saved_schedule_and_skip_old_files() {
        let workload = suite::resolve("gemm_128").expect("suite");
        let graph = suite::build(&workload.spec).expect("graph");
        let sketches = generate_sketches(&graph, &host_target(1));
        let p = sketches[0]
            .default_params(0, &host_target(1))
            .expect("default point");
        let dir = std::env::temp_dir().join(format!("harl-retime-w-{}", std::process::id()));
        std::fs::create_dir_all(dir.join("runs")).expect("dir");
        let saved = json!({ "best_params": p, "curve": [[1, 2.0e-3, 0.1], [2, 1.0e-3, 0.2]] });
        std::fs::write(dir.join("runs/harl-seed0.json"), saved.to_string()).expect("write");
        std::fs::write(
            dir.join("runs/ansor-seed0.json"),
            r#"{"curve":[[1,1.0,0.1]]}"#,
        )
        .expect("write");
        let w = winners(&dir, &graph, 1);
        let _ = std::fs::remove_dir_all(&dir);
        let w = w.expect("winners");
        assert_eq!(w.len(), 1);
        assert_eq!((w[0].strategy.as_str(), w[0].seed), ("harl", 0));
        assert_eq!(w[0].searched_s, 1.0e-3);
        assert_eq!(
            w[0].schedule,
            sketches[0].to_schedule(&p).expect("schedule")
        );
    }
}
