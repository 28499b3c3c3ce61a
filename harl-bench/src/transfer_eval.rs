//! `harl-bench transfer-eval --eval FILE`: how well each cost model ranks the schedules of
//! workloads it never trained on, after 0, 16, 64 and 256 of their own measured trials.
//!
//! The file is a dataset of held-out workloads (`harl-bench dataset --split eval`). For each
//! workload and each `n`, a model is trained on the first `n` trials (in the order the tuner
//! measured them) and ranks the rest: pairwise accuracy (pairs ordered like their measured
//! throughputs), top-1 recall (the model's first is the truly fastest) and top-5% recall.
//! Medians over `--seeds` (model seeds), then the mean over workloads.

use crate::Error;
use harl_tune::cost_model::dataset::{Dataset, Measured, Rows};
use harl_tune::cost_model::metatune::MetaTuneWeights;
use harl_tune::cost_model::{
    model_by_name, pairwise_accuracy, top_k_recall, CostModel, MetaTuneModel, TransferModel,
    XgbModel, XgbParams,
};
use harl_tune::features;
use std::path::PathBuf;
use std::time::Instant;

/// Options of `transfer-eval`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// The held-out dataset.
    #[arg(long)]
    pub eval: PathBuf,
    /// Models: any `--cost-model` name, `xgb-nowarmup` (cold XGBoost fitted from the first
    /// rows rather than after 64) and `metatune=FILE` (MetaTune over weights in FILE).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "xgb,xgb-nowarmup,xgb-transfer"
    )]
    pub models: Vec<String>,
    /// Own trials the model has seen.
    #[arg(long, value_delimiter = ',', default_value = "0,16,64")]
    pub seen: Vec<usize>,
    /// Model seeds.
    #[arg(long, value_delimiter = ',', default_value = "0,1,2")]
    pub seeds: Vec<u64>,
    /// Warm-start from the shipped dataset of this ISA class (default: the class the file was
    /// measured on), to see how a prior made on one ISA ranks another's schedules.
    #[arg(long)]
    pub prior: Option<String>,
    /// Write the table (JSON) here.
    #[arg(long)]
    pub out: Option<PathBuf>,
}

fn model(name: &str, seed: u64, isa_class: &str) -> Result<Box<dyn CostModel>, Error> {
    // `xgb-transfer/ROUNDS/DEPTH/ETA`: the task booster with other settings (to tune them).
    if let Some(rest) = name.strip_prefix("xgb-transfer/") {
        let v: Vec<&str> = rest.split('/').collect();
        let bad = || format!("`{name}`: want xgb-transfer/ROUNDS/DEPTH/ETA");
        let [r, d, e] = v[..] else {
            return Err(bad().into());
        };
        let params = XgbParams {
            rounds: r.parse().map_err(|_| bad())?,
            max_depth: d.parse().map_err(|_| bad())?,
            eta: e.parse().map_err(|_| bad())?,
            ..TransferModel::task_params(seed)
        };
        return Ok(Box::new(
            TransferModel::shipped(seed, isa_class)?.with_task_params(params),
        ));
    }
    // `metatune=FILE`: MetaTune over weights read from a file rather than the shipped ones.
    if let Some(path) = name.strip_prefix("metatune=") {
        let weights = MetaTuneWeights::read(std::path::Path::new(path))?;
        return Ok(Box::new(MetaTuneModel::new(std::sync::Arc::new(weights))));
    }
    if name == "xgb-nowarmup" {
        return Ok(Box::new(XgbModel::new(XgbParams {
            seed,
            warmup_rows: 0,
            ..XgbParams::default()
        })));
    }
    match model_by_name(name, seed, isa_class) {
        Some(m) => Ok(m?),
        None => Err(format!("unknown cost model `{name}`").into()),
    }
}

/// Runs the evaluation and prints the table.
pub fn run(o: &Options) -> Result<(), Error> {
    let data = Dataset::read(&o.eval)?;
    // What warm start costs a tuning process once: the shipped dataset's features, the prior.
    let t0 = Instant::now();
    // The models warm-start from the shipped dataset of the ISA class the file was measured on.
    let isa_class = o
        .prior
        .clone()
        .unwrap_or_else(|| data.header.target.isa_class.clone());
    let rows = TransferModel::shipped_rows(&isa_class);
    let extract_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    TransferModel::shipped(1 << 40, &isa_class)?;
    let prior_s = t1.elapsed().as_secs_f64();
    println!(
        "warm start for {isa_class}: {} dataset rows, features extracted in {extract_s:.2} s, prior fitted in {prior_s:.2} s",
        rows.len()
    );
    // (features, latency) of each workload's lowering trials, in measured order.
    let workloads: Vec<(String, Vec<Measured>)> = data
        .workloads
        .iter()
        .map(|w| {
            let rows = w
                .trials
                .iter()
                .filter_map(|t| {
                    let p = harl_build::lower::lower(&w.graph, &t.schedule).ok()?;
                    Some((features::extract(&p), t.latency_s))
                })
                .collect();
            (w.name.clone(), rows)
        })
        .collect();
    let mut table = Vec::new();
    println!("| model | own trials | pairwise accuracy | top-1 recall | top-5% recall | fit+predict ms |");
    println!("|---|---|---|---|---|---|");
    for name in &o.models {
        for &n in &o.seen {
            let (mut pair, mut top1, mut top5, mut ms) = (vec![], vec![], vec![], vec![]);
            for (_, rows) in &workloads {
                if rows.len() <= n + 1 {
                    continue;
                }
                let (train, test) = rows.split_at(n);
                let test: Vec<&Measured> = test.iter().filter(|r| r.1.is_some()).collect();
                let truth: Vec<f64> = test.iter().map(|r| 1.0 / r.1.unwrap_or(f64::MAX)).collect();
                let feats: Vec<Vec<f32>> = test.iter().map(|r| r.0.clone()).collect();
                let (mut p, mut t1, mut t5, mut m) = (vec![], vec![], vec![], vec![]);
                for &seed in &o.seeds {
                    let start = Instant::now();
                    let mut model = model(name, seed, &isa_class)?;
                    let mut own = Rows::default();
                    own.push_group(train.iter().cloned());
                    if !own.is_empty() {
                        model.train(&own.features, &own.throughput, &own.groups)?;
                    }
                    let pred = model.predict(&feats)?;
                    m.push(start.elapsed().as_secs_f64() * 1e3);
                    p.push(pairwise_accuracy(&pred, &truth));
                    t1.push(top_k_recall(&pred, &truth, 1));
                    t5.push(top_k_recall(&pred, &truth, test.len().div_ceil(20)));
                }
                pair.push(crate::stats::median(&p).unwrap_or(f64::NAN));
                top1.push(crate::stats::median(&t1).unwrap_or(f64::NAN));
                top5.push(crate::stats::median(&t5).unwrap_or(f64::NAN));
                ms.push(crate::stats::median(&m).unwrap_or(f64::NAN));
            }
            let mean = |v: &[f64]| v.iter().sum::<f64>() / v.len().max(1) as f64;
            println!(
                "| {name} | {n} | {:.3} | {:.2} | {:.2} | {:.0} |",
                mean(&pair),
                mean(&top1),
                mean(&top5),
                mean(&ms)
            );
            table.push(serde_json::json!({
                "model": name, "seen": n, "workloads": pair.len(),
                "pairwise": mean(&pair), "top1": mean(&top1), "top5pct": mean(&top5),
                "per_workload_pairwise": pair, "ms": mean(&ms),
            }));
        }
    }
    if let Some(out) = &o.out {
        let doc = serde_json::json!({
            "eval": o.eval.display().to_string(),
            "eval_target": data.header.target,
            "prior_isa_class": isa_class,
            "workloads": workloads.iter().map(|w| &w.0).collect::<Vec<_>>(),
            "seeds": o.seeds,
            "dataset_rows": rows.len(),
            "feature_extraction_s": extract_s,
            "prior_fit_s": prior_s,
            "rows": table,
        });
        std::fs::write(out, serde_json::to_string_pretty(&doc)? + "\n")?;
    }
    Ok(())
}
