//! `harl-bench compare`: several strategies on the same workload and seeds, in one process.
//!
//! ```text
//! harl-bench compare --workload W --strategies harl,ansor,random --trials N --seeds 0,1,2 --out DIR
//! harl-bench compare --network bert --schedulers harl,gradient --trials N --seeds 0 --out DIR
//! ```
//! A workload run writes `DIR/compare.json` (per strategy, medians over seeds of the final
//! GFLOP/s, of the trials and of the wall time at which it first reaches the baseline's final
//! best; the baseline is `ansor` when it is in the list, else the first strategy),
//! `DIR/curves.csv` and `DIR/curves.svg`. A network run tunes the tasks of one BERT-base
//! encoder layer (sequence 128), or of an ONNX model (`--network m.onnx`), with their weights
//! under each task scheduler (`harl` with HARL's strategy, the others with Ansor's) and writes
//! each run's weighted latency (Σ weight × task latency, the tuner's estimate of the
//! network's), trial allocation and curve to `DIR/network.json`, with the trials the first
//! scheduler needs to reach each other one's final figure. A workload run ends with `compare-retime`
//! over its winners (`--retime R` rounds, default 5, 0 for none), which writes
//! `DIR/retime.json`.

use crate::harness::phases_json;
use crate::harness::{run_tasks, RunSpec};
use crate::stats::median;
use crate::suite;
use crate::Error;
use harl_build::target::TargetFingerprint;
use harl_tune::space::cpu::Task;
use harl_tune::tuner::{PhaseTimes, TuneResult};
use serde_json::{json, Value};
use std::path::PathBuf;

/// Options of `compare`.
#[derive(Debug, Clone, clap::Args)]
#[command(group(clap::ArgGroup::new("what").required(true).args(["workload", "network"])))]
pub struct Options {
    /// Suite name or spec (a workload run).
    #[arg(long)]
    pub workload: Option<String>,
    /// `bert` (one BERT-base encoder layer) or an ONNX model file (its tasks, with their
    /// weights): a network run.
    #[arg(long)]
    pub network: Option<String>,
    /// Strategies of a workload run.
    #[arg(long, value_delimiter = ',', default_value = "harl,ansor,random")]
    pub strategies: Vec<String>,
    /// Task schedulers of a network run.
    #[arg(long, value_delimiter = ',', default_value = "harl,gradient")]
    pub schedulers: Vec<String>,
    /// Trials per run.
    #[arg(long, default_value_t = 200, value_parser = crate::harness::positive)]
    pub trials: usize,
    /// Seeds.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub seeds: Vec<u64>,
    /// Threads.
    #[arg(long, default_value_t = 1, value_parser = crate::harness::positive)]
    pub threads: usize,
    /// Candidates per round.
    #[arg(long, default_value_t = 16, value_parser = crate::harness::positive)]
    pub batch: usize,
    /// Output directory.
    #[arg(long, default_value = "compare-out")]
    pub out: PathBuf,
    /// Measure the default-like schedules first (off with `--no-default-seed`).
    #[arg(long = "no-default-seed", action = clap::ArgAction::SetFalse)]
    pub seed_default: bool,
    /// Rounds of `compare-retime` run over the winners once the runs are done (0: none).
    #[arg(long = "retime", default_value_t = 5)]
    pub retime_rounds: usize,
}

impl Options {
    /// The run settings of one strategy, scheduler and seed under these options.
    fn run_spec<'a>(&self, strategy: &'a str, scheduler: &'a str, seed: u64) -> RunSpec<'a> {
        RunSpec {
            strategy,
            scheduler,
            trials: self.trials,
            seed,
            threads: self.threads,
            batch: self.batch,
            seed_default: self.seed_default,
        }
    }
}

/// Runs a comparison.
pub fn run(o: &Options) -> Result<(), Error> {
    std::fs::create_dir_all(&o.out)?;
    match (&o.workload, &o.network) {
        (Some(w), _) => compare_workload(o, w),
        (_, Some(n)) => compare_network(o, n),
        _ => Err("nothing to compare".into()),
    }
}

/// One run's best-so-far curve: (trial, best latency, elapsed seconds).
type Curve = Vec<(usize, f64, f64)>;

fn curve(r: &TuneResult) -> Curve {
    r.curve
        .iter()
        .map(|p| (p.trial, p.best_latency_s, p.elapsed_s))
        .collect()
}

/// Trials of a run that failed to build or run.
fn failed_trials(r: &TuneResult) -> usize {
    r.tasks
        .iter()
        .flat_map(|t| &t.trials)
        .filter(|t| t.latency_s.is_none())
        .count()
}

/// One finished (strategy, seed) run of a workload comparison.
struct SavedRun {
    curve: Curve,
    /// Trials that failed to build or run (`None` in run files written before it was kept).
    failed: Option<usize>,
    phases: PhaseTimes,
    wall_s: f64,
    /// Read back from `DIR/runs/` rather than run now.
    reused: bool,
}

/// The settings a saved run must match to stand in for a new one, the machine among them: a
/// run measured on another CPU (an AVX-512 one, say, against this AVX2 one) is not comparable,
/// and machines change between sessions.
fn run_key(o: &Options, spec: &str, strategy: &str, seed: u64) -> Value {
    let host = TargetFingerprint::host();
    let cost_model = strategy
        .split_once('@')
        .map_or(harl_tune::cost_model::DEFAULT_COST_MODEL, |(_, m)| m);
    json!({
        "spec": spec, "strategy": strategy, "cost_model": cost_model, "seed": seed, "trials": o.trials,
        "threads": o.threads, "batch": o.batch, "seed_default": o.seed_default,
        "isa_class": host.isa_class, "cpu_model": host.cpu_model,
    })
}

/// Runs one strategy on one seed, or reads the run back from `DIR/runs/` when an earlier
/// invocation with the same settings finished it: a long comparison survives interruption,
/// and seeds or strategies can run as separate processes into one directory.
fn workload_run(
    o: &Options,
    workload: &suite::SuiteWorkload,
    graph: &harl_te::Graph,
    strategy: &str,
    seed: u64,
) -> Result<SavedRun, Error> {
    let dir = o.out.join("runs");
    let path = dir.join(format!("{strategy}-seed{seed}.json"));
    let key = run_key(o, &workload.spec, strategy, seed);
    if let Some(saved) = read_saved_run(&path, &key) {
        return Ok(saved);
    }
    let task = Task::new(workload.name.clone(), graph.clone(), 1.0);
    let r = run_tasks(vec![task], &o.run_spec(strategy, "gradient", seed))?;
    let run = SavedRun {
        curve: curve(&r),
        failed: Some(failed_trials(&r)),
        phases: r.phases,
        wall_s: r.wall_s,
        reused: false,
    };
    std::fs::create_dir_all(&dir)?;
    let saved = json!({
        "key": key,
        "wall_s": run.wall_s,
        "failed_trials": run.failed,
        "best_params": r.tasks.first().and_then(|t| t.best()).map(|t| &t.candidate.params),
        "phases_s": phases_json(&run.phases),
        "curve": run.curve.iter().map(|p| json!([p.0, p.1, p.2])).collect::<Vec<_>>(),
    });
    std::fs::write(&path, serde_json::to_string(&saved)? + "\n")?;
    Ok(run)
}

/// A saved run whose settings equal `key`; `None` (run it again) for a missing, unreadable
/// or different one.
fn read_saved_run(path: &std::path::Path, key: &Value) -> Option<SavedRun> {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()?;
    if v.get("key") != Some(key) {
        return None;
    }
    let num = |v: &Value| v.as_f64();
    let curve = v["curve"]
        .as_array()?
        .iter()
        .map(|p| {
            Some((
                p.get(0)?.as_u64()? as usize,
                num(p.get(1)?)?,
                num(p.get(2)?)?,
            ))
        })
        .collect::<Option<Curve>>()?;
    let ph = &v["phases_s"];
    Some(SavedRun {
        curve,
        failed: v["failed_trials"].as_u64().map(|n| n as usize),
        phases: PhaseTimes {
            propose_s: num(&ph["propose"])?,
            measure_s: num(&ph["measure"])?,
            retrain_s: num(&ph["retrain"])?,
        },
        wall_s: num(&v["wall_s"])?,
        reused: true,
    })
}

fn compare_workload(o: &Options, name: &str) -> Result<(), Error> {
    let workload = suite::resolve(name)?;
    let graph = suite::build(&workload.spec)?;
    let flops = graph.flops();
    let baseline = if o.strategies.iter().any(|s| s == "ansor") {
        "ansor".to_string()
    } else {
        o.strategies[0].clone()
    };
    // runs[strategy][seed]
    let mut runs: Vec<Vec<SavedRun>> = Vec::new();
    for strategy in &o.strategies {
        let mut per_seed = Vec::new();
        for &seed in &o.seeds {
            let run = workload_run(o, &workload, &graph, strategy, seed)?;
            println!(
                "{} {strategy} seed {seed}: {} trials ({} failed) in {:.1} s (propose {:.1}, measure {:.1}, retrain {:.1}), best {}{}",
                workload.name,
                run.curve.last().map_or(0, |p| p.0),
                run.failed.map_or("?".into(), |n| n.to_string()),
                run.wall_s,
                run.phases.propose_s,
                run.phases.measure_s,
                run.phases.retrain_s,
                run.curve.last().map_or("none".into(), |p| format!(
                    "{:.1} GFLOP/s",
                    flops / p.1 / 1e9
                )),
                if run.reused { " (saved run)" } else { "" }
            );
            per_seed.push(run);
        }
        runs.push(per_seed);
    }
    let bi = o
        .strategies
        .iter()
        .position(|s| *s == baseline)
        .unwrap_or(0);
    let baseline_best: Vec<Option<f64>> = runs[bi]
        .iter()
        .map(|r| r.curve.last().map(|p| p.1))
        .collect();
    let mut strategies = serde_json::Map::new();
    for (s, name) in o.strategies.iter().enumerate() {
        let mut finals = Vec::new();
        let mut reach_trials = Vec::new();
        let mut reach_wall = Vec::new();
        let mut near_trials = Vec::new();
        let mut per_seed = Vec::new();
        for (k, run) in runs[s].iter().enumerate() {
            let c = &run.curve;
            let fin = c.last().map(|p| flops / p.1 / 1e9);
            let reach = baseline_best[k].and_then(|b| c.iter().find(|p| p.1 <= b));
            // Within 1% of the baseline's best: less at the mercy of one lucky measurement.
            let near = baseline_best[k].and_then(|b| c.iter().find(|p| p.1 * 0.99 <= b));
            finals.push(fin.unwrap_or(f64::NAN));
            reach_trials.push(reach.map_or(f64::INFINITY, |p| p.0 as f64));
            reach_wall.push(reach.map_or(f64::INFINITY, |p| p.2));
            near_trials.push(near.map_or(f64::INFINITY, |p| p.0 as f64));
            per_seed.push(json!({
                "seed": o.seeds[k],
                "final_gflops": fin,
                "trials_to_reach_baseline": reach.map(|p| p.0),
                "wall_s_to_reach_baseline": reach.map(|p| p.2),
                "trials_to_reach_99pct_baseline": near.map(|p| p.0),
                "wall_s": run.wall_s,
                "failed_trials": run.failed,
                "phases_s": phases_json(&run.phases),
            }));
        }
        strategies.insert(
            name.clone(),
            json!({
                "final_gflops": median(&finals),
                "trials_to_reach_baseline": median(&reach_trials),
                "wall_s_to_reach_baseline": median(&reach_wall),
                "trials_to_reach_99pct_baseline": median(&near_trials),
                "wall_s": median(&runs[s].iter().map(|r| r.wall_s).collect::<Vec<_>>()),
                "per_seed": per_seed,
            }),
        );
    }
    let report = json!({
        "workload": workload.name,
        "spec": workload.spec,
        "trials": o.trials,
        "seeds": o.seeds,
        "threads": o.threads,
        "baseline": baseline,
        "strategies": Value::Object(strategies),
    });
    std::fs::write(
        o.out.join("compare.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    let mut csv = String::from("strategy,seed,trial,best_latency_s,elapsed_s\n");
    for (s, name) in o.strategies.iter().enumerate() {
        for (k, run) in runs[s].iter().enumerate() {
            for p in &run.curve {
                csv.push_str(&format!(
                    "{name},{},{},{:e},{:.3}\n",
                    o.seeds[k], p.0, p.1, p.2
                ));
            }
        }
    }
    std::fs::write(o.out.join("curves.csv"), csv)?;
    let curves: Vec<Vec<Curve>> = runs
        .into_iter()
        .map(|per_seed| per_seed.into_iter().map(|r| r.curve).collect())
        .collect();
    plot(o, &workload.name, flops, &curves)?;
    println!("{}", serde_json::to_string_pretty(&report["strategies"])?);
    // Each run's final figure is its luckiest timing, taken hours apart from the other
    // strategy's; the winners timed again side by side are what the ratio should rest on.
    if o.retime_rounds > 0 {
        println!("\nthe winners timed again, {} rounds:", o.retime_rounds);
        crate::retime::run(&o.out, o.retime_rounds)?;
    }
    Ok(())
}

/// Median best-so-far GFLOP/s per trial over seeds, one line per strategy.
fn plot(o: &Options, title: &str, flops: f64, curves: &[Vec<Curve>]) -> Result<(), Error> {
    use plotters::prelude::*;
    let path = o.out.join("curves.svg");
    let root = SVGBackend::new(&path, (900, 540)).into_drawing_area();
    root.fill(&WHITE)?;
    let lines: Vec<Vec<(f64, f64)>> = curves
        .iter()
        .map(|per_seed| {
            (1..=o.trials)
                .filter_map(|t| {
                    let at: Vec<f64> = per_seed
                        .iter()
                        .filter_map(|c| {
                            c.iter()
                                .take_while(|p| p.0 <= t)
                                .last()
                                .map(|p| flops / p.1 / 1e9)
                        })
                        .collect();
                    (at.len() == per_seed.len())
                        .then(|| median(&at).map(|m| (t as f64, m)))
                        .flatten()
                })
                .collect()
        })
        .collect();
    let top = lines.iter().flatten().map(|p| p.1).fold(1.0f64, f64::max) * 1.1;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!(
                "{title}: best-so-far GFLOP/s (median of {} seeds)",
                o.seeds.len()
            ),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(52)
        .build_cartesian_2d(0f64..o.trials as f64, 0f64..top)?;
    chart
        .configure_mesh()
        .x_desc("trials")
        .y_desc("GFLOP/s")
        .draw()?;
    let colors = [RED, BLUE, GREEN, MAGENTA, CYAN, BLACK];
    for (s, line) in lines.into_iter().enumerate() {
        let color = colors[s % colors.len()];
        chart
            .draw_series(LineSeries::new(line, color.stroke_width(2)))?
            .label(o.strategies[s].clone())
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()?;
    root.present()?;
    Ok(())
}

/// The tasks of one BERT-base encoder layer at sequence length 128, with their weights.
pub fn bert_layer() -> Result<Vec<Task>, Error> {
    let specs: [(&str, &str, f64); 8] = [
        ("qkv_proj", "matmul:m=128,k=768,n=768", 3.0),
        ("attn_scores", "batch_matmul:b=12,m=128,k=64,n=128", 1.0),
        ("attn_softmax", "softmax:rows=1536,cols=128", 1.0),
        ("attn_context", "batch_matmul:b=12,m=128,k=128,n=64", 1.0),
        ("out_proj", "matmul:m=128,k=768,n=768", 1.0),
        ("ffn_gelu", "dense:m=128,k=768,n=3072", 1.0),
        ("ffn_out", "matmul:m=128,k=3072,n=768", 1.0),
        ("layer_norm", "layer_norm:rows=128,cols=768", 2.0),
    ];
    specs
        .iter()
        .map(|(name, spec, w)| Ok(Task::new(name.to_string(), suite::build(spec)?, *w)))
        .collect()
}

/// A network run's tasks: BERT's layer, or an ONNX model's tasks with their call counts.
fn network_tasks(network: &str) -> Result<(String, Vec<Task>), Error> {
    if network == "bert" {
        return Ok(("bert-base encoder layer, seq 128".into(), bert_layer()?));
    }
    let net = harl_te::onnx::import(std::path::Path::new(network))?;
    let name = std::path::Path::new(network)
        .file_stem()
        .map_or_else(|| network.to_string(), |s| s.to_string_lossy().into_owned());
    let tasks = net
        .tasks
        .into_iter()
        .enumerate()
        .map(|(i, t)| Task::new(format!("t{i} {}", t.name), t.graph, t.weight as f64))
        .collect();
    Ok((name, tasks))
}

/// The first trial at which a curve's weighted latency is at or under `target`.
fn trials_to_reach(curve: &[harl_tune::tuner::CurvePoint], target: f64) -> Option<usize> {
    curve
        .iter()
        .find(|p| p.best_latency_s <= target)
        .map(|p| p.trial)
}

fn compare_network(o: &Options, network: &str) -> Result<(), Error> {
    // Imported once; each run tunes a fresh copy.
    let (title, imported) = network_tasks(network)?;
    let mut runs = serde_json::Map::new();
    // Per seed: each scheduler's curve, for the budget-to-match figure.
    let mut curves: Vec<Vec<(String, Vec<harl_tune::tuner::CurvePoint>)>> =
        vec![Vec::new(); o.seeds.len()];
    for scheduler in &o.schedulers {
        let strategy = if scheduler == "harl" { "harl" } else { "ansor" };
        let mut per_seed = Vec::new();
        for (si, &seed) in o.seeds.iter().enumerate() {
            let tasks = imported.clone();
            let names: Vec<String> = tasks.iter().map(|t| t.name.clone()).collect();
            let mut spec = o.run_spec(strategy, scheduler, seed);
            // As a tuning job's: rounds small enough that every task gets one.
            spec.batch = spec.batch.min(o.trials / tasks.len().max(1)).max(1);
            let r = run_tasks(tasks, &spec)?;
            let best = r.curve.last().map(|p| p.best_latency_s);
            println!(
                "{title}, scheduler {scheduler} + {strategy}, seed {seed}: {} trials in {:.1} s, weighted latency {}",
                r.trials,
                r.wall_s,
                best.map_or("none".into(), |l| format!("{:.3} ms", l * 1e3))
            );
            let allocation: serde_json::Map<String, Value> = names
                .into_iter()
                .zip(&r.allocation)
                .map(|(n, a)| (n, json!(a)))
                .collect();
            let curve: Vec<Value> = r
                .curve
                .iter()
                .map(|p| json!([p.trial, p.best_latency_s, p.elapsed_s]))
                .collect();
            per_seed.push(json!({ "seed": seed, "weighted_latency_s": best, "allocation": allocation, "wall_s": r.wall_s, "curve": curve }));
            curves[si].push((format!("{scheduler}+{strategy}"), r.curve));
        }
        runs.insert(format!("{scheduler}+{strategy}"), Value::Array(per_seed));
    }
    // The paper's claim, per seed: the trials the first scheduler needs to reach the weighted
    // latency every other one ends at, as a fraction of the budget.
    let mut to_match = Vec::new();
    for (seed, runs) in o.seeds.iter().zip(&curves) {
        let Some(((first, mine), rest)) = runs.split_first().map(|(f, r)| ((&f.0, &f.1), r)) else {
            continue;
        };
        for (other, theirs) in rest {
            let Some(target) = theirs.last().map(|p| p.best_latency_s) else {
                continue;
            };
            let reached = trials_to_reach(mine, target);
            println!(
                "seed {seed}: {first} reaches {other}'s final {:.3} ms {}",
                target * 1e3,
                reached.map_or("never".to_string(), |t| format!(
                    "after {t} trials ({:.2}x the budget)",
                    t as f64 / o.trials as f64
                ))
            );
            to_match.push(json!({"seed": seed, "scheduler": first, "baseline": other, "baseline_final_s": target, "trials_to_match": reached, "fraction_of_budget": reached.map(|t| t as f64 / o.trials as f64)}));
        }
    }
    let report = json!({ "network": title, "trials": o.trials, "threads": o.threads, "runs": Value::Object(runs), "to_match": to_match });
    std::fs::write(
        o.out.join("network.json"),
        serde_json::to_string_pretty(&report)? + "\n",
    )?;
    Ok(())
}
