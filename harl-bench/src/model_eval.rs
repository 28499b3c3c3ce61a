//! `harl-bench model-eval FILES...`: the cost model's ranking quality on held-out measured
//! records (the `records.json` that `tune` writes), against random ranking.
//!
//! Every third record of each workload is held out; the XGBoost model trains on the rest.
//! Reported per workload and pooled: pairwise ranking accuracy (the fraction of held-out pairs
//! of one workload ordered like their measured latencies) and top-k recall (the share of the
//! truly fastest k held-out schedules among the model's top k).

use crate::suite;
use crate::Error;
use harl_build::lower::lower;
use harl_build::schedule::Schedule;
use harl_tune::cost_model::{
    pairwise_accuracy_grouped, top_k_recall, CostModel, RandomModel, XgbModel,
};
use harl_tune::features;
use std::collections::BTreeMap;
use std::path::Path;

/// One measured schedule of a workload.
#[derive(serde::Deserialize)]
struct Row {
    workload: String,
    schedule: Schedule,
    latency_s: Option<f64>,
}

/// Ranking quality of one model on the held-out rows.
#[derive(Debug, Clone, Copy)]
pub struct Quality {
    /// Pairwise ranking accuracy within workloads.
    pub pairwise: f64,
    /// Top-k recall averaged over workloads.
    pub top_k: f64,
}

/// The evaluation: the XGBoost model and the random baseline.
#[derive(Debug, Clone, Copy)]
pub struct Evaluation {
    /// Rows trained on.
    pub train_rows: usize,
    /// Rows held out.
    pub test_rows: usize,
    /// XGBoost.
    pub xgb: Quality,
    /// Random scores.
    pub random: Quality,
}

/// The k of top-k recall.
pub const TOP_K: usize = 10;

/// Loads records, featurises them, trains on two thirds and scores the held-out third.
pub fn evaluate(files: &[impl AsRef<Path>], seed: u64) -> Result<Evaluation, Error> {
    let mut rows: Vec<Row> = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(f.as_ref())
            .map_err(|e| format!("{}: {e}", f.as_ref().display()))?;
        rows.extend(serde_json::from_str::<Vec<Row>>(&text)?);
    }
    let mut tasks: BTreeMap<String, usize> = BTreeMap::new();
    let (mut train, mut test) = (Set::default(), Set::default());
    let mut seen: BTreeMap<usize, usize> = BTreeMap::new();
    let mut graphs = BTreeMap::new();
    for row in rows {
        let Some(latency) = row.latency_s.filter(|l| *l > 0.0 && l.is_finite()) else {
            continue;
        };
        let n = tasks.len();
        let task = *tasks.entry(row.workload.clone()).or_insert(n);
        let graph = match graphs.entry(task) {
            std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::btree_map::Entry::Vacant(e) => e.insert(suite::build(&row.workload)?),
        };
        let program = lower(graph, &row.schedule)?;
        let i = seen.entry(task).or_insert(0);
        let set = if *i % 3 == 2 { &mut test } else { &mut train };
        *i += 1;
        set.push(features::extract(&program), latency, task);
    }
    let (train_y, test_y) = (train.throughput(), test.throughput());
    let mut xgb = XgbModel::with_seed(seed);
    xgb.train(&train.x, &train_y, &train.task)?;
    let random = RandomModel::new(seed);
    Ok(Evaluation {
        train_rows: train.x.len(),
        test_rows: test.x.len(),
        xgb: quality(&xgb, &test, &test_y)?,
        random: quality(&random, &test, &test_y)?,
    })
}

#[derive(Default)]
struct Set {
    x: Vec<Vec<f32>>,
    latency: Vec<f64>,
    task: Vec<usize>,
}

impl Set {
    fn push(&mut self, x: Vec<f32>, latency: f64, task: usize) {
        self.x.push(x);
        self.latency.push(latency);
        self.task.push(task);
    }
    /// Throughput normalised per task (best = 1).
    fn throughput(&self) -> Vec<f64> {
        let mut best: BTreeMap<usize, f64> = BTreeMap::new();
        for (l, t) in self.latency.iter().zip(&self.task) {
            let b = best.entry(*t).or_insert(f64::INFINITY);
            *b = b.min(*l);
        }
        self.latency
            .iter()
            .zip(&self.task)
            .map(|(l, t)| best[t] / l)
            .collect()
    }
}

fn quality(model: &dyn CostModel, test: &Set, truth: &[f64]) -> Result<Quality, Error> {
    let pred = model.predict(&test.x)?;
    let pairwise = pairwise_accuracy_grouped(&pred, truth, &test.task);
    let tasks: Vec<usize> = {
        let mut t = test.task.clone();
        t.dedup();
        t.sort_unstable();
        t.dedup();
        t
    };
    let mut recall = 0.0;
    for t in &tasks {
        let idx: Vec<usize> = (0..pred.len()).filter(|&i| test.task[i] == *t).collect();
        let p: Vec<f64> = idx.iter().map(|&i| pred[i]).collect();
        let y: Vec<f64> = idx.iter().map(|&i| truth[i]).collect();
        recall += top_k_recall(&p, &y, TOP_K);
    }
    Ok(Quality {
        pairwise,
        top_k: recall / tasks.len().max(1) as f64,
    })
}

/// Prints the evaluation of `files`.
pub fn run(files: &[String]) -> Result<(), Error> {
    if files.is_empty() {
        return Err("model-eval needs records.json files (written by `tune`)".into());
    }
    let e = evaluate(files, 0)?;
    println!(
        "cost model on held-out records: {} train rows, {} test rows",
        e.train_rows, e.test_rows
    );
    println!(
        "  xgboost (rank:pairwise): pairwise accuracy {:.3}, top-{TOP_K} recall {:.3}",
        e.xgb.pairwise, e.xgb.top_k
    );
    println!(
        "  random:                  pairwise accuracy {:.3}, top-{TOP_K} recall {:.3}",
        e.random.pairwise, e.random.top_k
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Records measured on the development machine with `harl-bench tune --strategy random`
    /// (gemm 128^3 and a 28x28 32->32 3x3 conv2d): real latencies, held fixed so the test is
    /// repeatable.
    const FIXTURE: &str = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/fixtures/cost_model_records.json"
    );

    #[test]
    fn xgboost_ranks_held_out_schedules_better_than_random() {
        let e = evaluate(&[FIXTURE], 0).expect("evaluate");
        assert!(e.test_rows >= 60, "{e:?}");
        assert!(e.xgb.pairwise > 0.65, "{e:?}");
        assert!(e.xgb.pairwise > e.random.pairwise + 0.1, "{e:?}");
    }
}
