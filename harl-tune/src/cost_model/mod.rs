//! Learned cost models: score schedules from their [`features`](super::features) so the search
//! measures only the promising ones.
//!
//! [`XgbModel`] is the model of Ansor and HARL: gradient-boosted trees (XGBoost), here with the
//! pairwise rank objective of AutoTVM (`rank:pairwise`) and each task a ranking group, since only
//! the order of schedules *within* a task matters. It is retrained from scratch on every record
//! at each [`CostModel::train`] call, as Ansor does. [`RandomModel`] is the baseline.
//!
//! Measured records reach a model as rows of features with a throughput (higher is better,
//! normalised per task) and a task id; [`load_records`] and [`training_set`] turn a JSON file of
//! measured rows into exactly that, for tests and offline experiments.
//!
//! [`pairwise_accuracy`] and [`top_k_recall`] measure how well a model ranks.

pub mod dataset;
mod gz;
pub mod metatune;
mod random;
mod transfer;
mod xgb;

pub use metatune::MetaTuneModel;
pub use random::RandomModel;
pub use transfer::TransferModel;
pub use xgb::{XgbModel, XgbParams};

use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// Why a cost model could not train or predict.
#[derive(Debug, thiserror::Error)]
pub enum CostModelError {
    /// The argument slices disagree in length.
    #[error("{rows} feature rows but {throughputs} throughputs and {groups} group ids")]
    LengthMismatch {
        /// Feature rows.
        rows: usize,
        /// Throughput values.
        throughputs: usize,
        /// Group ids.
        groups: usize,
    },
    /// A row has the wrong number of features.
    #[error("row {row} has {got} features; the model expects {expected}")]
    FeatureLength {
        /// Row index.
        row: usize,
        /// Its length.
        got: usize,
        /// The length of the first row (training) or of the trained model (prediction).
        expected: usize,
    },
    /// A throughput is NaN or infinite.
    #[error("throughput of row {row} is {value}; it must be finite")]
    BadThroughput {
        /// Row index.
        row: usize,
        /// The value.
        value: f64,
    },
    /// XGBoost reported an error.
    #[error("xgboost: {0}")]
    Xgboost(String),
    /// A records file could not be read or parsed.
    #[error("records file {path}: {why}")]
    Records {
        /// The file.
        path: PathBuf,
        /// What went wrong.
        why: String,
    },
}

impl From<xgboost_rs::XGBError> for CostModelError {
    fn from(e: xgboost_rs::XGBError) -> Self {
        CostModelError::Xgboost(e.to_string())
    }
}

/// The model tuning uses unless told otherwise (`HARL_COST_MODEL`).
pub const DEFAULT_COST_MODEL: &str = "xgb-transfer";

/// The names [`model_by_name`] accepts, for messages.
pub const COST_MODEL_NAMES: &str = "xgb-transfer, metatune, xgb, random";

/// The model called `name` (`HARL_COST_MODEL`, `--cost-model`) for tuning on ISA class
/// `isa_class`, seeded with `seed`: `xgb-transfer` ([`TransferModel`] over the shipped dataset
/// of that class; its prior is fitted once per thread, seed and class), `metatune`
/// ([`MetaTuneModel`] over the shipped weights of that class; deterministic, so the seed is
/// unused), `xgb` (cold: random
/// scores until it has 64 rows, as Ansor's) or `random`. `None` for an unknown name.
pub fn model_by_name(
    name: &str,
    seed: u64,
    isa_class: &str,
) -> Option<Result<Box<dyn CostModel>, CostModelError>> {
    match name {
        "xgb-transfer" => {
            Some(TransferModel::shipped(seed, isa_class).map(|m| Box::new(m) as Box<dyn CostModel>))
        }
        "metatune" => {
            Some(MetaTuneModel::shipped(isa_class).map(|m| Box::new(m) as Box<dyn CostModel>))
        }
        "xgb" => Some(Ok(Box::new(XgbModel::with_seed(seed)))),
        "random" => Some(Ok(Box::new(RandomModel::new(seed)))),
        _ => None,
    }
}

/// A model that scores schedules by their feature vectors.
pub trait CostModel {
    /// A short name for logs and reports.
    fn name(&self) -> &str;

    /// Fits the model to all measured rows so far: `features[i]` measured `throughput[i]`
    /// (higher is better, e.g. flops / latency normalised per task) in task `groups[i]`.
    /// Only the order of throughputs within a task is meaningful.
    fn train(
        &mut self,
        features: &[Vec<f32>],
        throughput: &[f64],
        groups: &[usize],
    ) -> Result<(), CostModelError>;

    /// Scores rows: higher means predicted faster. Scores rank schedules of one task; they are
    /// not latencies and not comparable across tasks.
    fn predict(&self, features: &[Vec<f32>]) -> Result<Vec<f64>, CostModelError>;
}

/// Checks the shapes of a training set and returns the feature length (0 when empty).
fn check_training_set(
    features: &[Vec<f32>],
    throughput: &[f64],
    groups: &[usize],
) -> Result<usize, CostModelError> {
    if features.len() != throughput.len() || features.len() != groups.len() {
        return Err(CostModelError::LengthMismatch {
            rows: features.len(),
            throughputs: throughput.len(),
            groups: groups.len(),
        });
    }
    let n = features.first().map_or(0, Vec::len);
    check_rows(features, n)?;
    if let Some((row, &value)) = throughput.iter().enumerate().find(|(_, t)| !t.is_finite()) {
        return Err(CostModelError::BadThroughput { row, value });
    }
    Ok(n)
}

fn check_rows(features: &[Vec<f32>], expected: usize) -> Result<(), CostModelError> {
    match features.iter().position(|r| r.len() != expected) {
        Some(row) => Err(CostModelError::FeatureLength {
            row,
            got: features[row].len(),
            expected,
        }),
        None => Ok(()),
    }
}

/// Fraction of pairs with different true values that `pred` orders like `truth` (a tie in
/// `pred` counts half). 0.5 when no pair differs in `truth`.
///
/// # Panics
///
/// If the slices differ in length.
pub fn pairwise_accuracy(pred: &[f64], truth: &[f64]) -> f64 {
    assert_eq!(pred.len(), truth.len(), "pairwise_accuracy: lengths differ");
    let (mut right, mut pairs) = (0.0, 0.0);
    for i in 0..pred.len() {
        for j in i + 1..pred.len() {
            if truth[i] == truth[j] {
                continue;
            }
            pairs += 1.0;
            let t = truth[i] > truth[j];
            if pred[i] == pred[j] {
                right += 0.5;
            } else if (pred[i] > pred[j]) == t {
                right += 1.0;
            }
        }
    }
    if pairs == 0.0 {
        0.5
    } else {
        right / pairs
    }
}

/// [`pairwise_accuracy`] over pairs in the same group only (the ranking a cost model is
/// trained for): pooled over all groups' pairs.
///
/// # Panics
///
/// If the slices differ in length.
pub fn pairwise_accuracy_grouped(pred: &[f64], truth: &[f64], groups: &[usize]) -> f64 {
    assert!(
        pred.len() == truth.len() && pred.len() == groups.len(),
        "pairwise_accuracy_grouped: lengths differ"
    );
    let (mut right, mut pairs) = (0.0, 0.0);
    for i in 0..pred.len() {
        for j in i + 1..pred.len() {
            if groups[i] != groups[j] || truth[i] == truth[j] {
                continue;
            }
            pairs += 1.0;
            if pred[i] == pred[j] {
                right += 0.5;
            } else if (pred[i] > pred[j]) == (truth[i] > truth[j]) {
                right += 1.0;
            }
        }
    }
    if pairs == 0.0 {
        0.5
    } else {
        right / pairs
    }
}

/// Recall of the true top `k` among the predicted top `k` (higher is better in both): the
/// share of the `k` best-predicted rows whose true value reaches the k-th best true value (so
/// ties in `truth` at the boundary all count). `k` is clipped to the number of rows; 1.0 when
/// it is 0. Ties in `pred` are broken by row order.
///
/// # Panics
///
/// If the slices differ in length.
pub fn top_k_recall(pred: &[f64], truth: &[f64], k: usize) -> f64 {
    assert_eq!(pred.len(), truth.len(), "top_k_recall: lengths differ");
    let k = k.min(pred.len());
    if k == 0 {
        return 1.0;
    }
    let desc = |v: &[f64]| {
        let mut idx: Vec<usize> = (0..v.len()).collect();
        idx.sort_by(|&a, &b| v[b].total_cmp(&v[a]));
        idx
    };
    let threshold = truth[desc(truth)[k - 1]];
    let hits = desc(pred)[..k]
        .iter()
        .filter(|&&i| truth[i] >= threshold)
        .count();
    hits as f64 / k as f64
}

/// One measured row as a test fixture or offline experiment stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Record {
    /// The schedule's feature vector ([`super::features::extract`]).
    pub features: Vec<f32>,
    /// Measured latency in seconds; `null` (or a non-positive value) for a failed measurement.
    pub latency_s: Option<f64>,
    /// Task id: rows of one task are ranked against each other.
    pub task: usize,
}

/// Reads a JSON list of [`Record`]s (`[{"features": [..], "latency_s": 1e-3, "task": 0}, ..]`).
pub fn load_records(path: impl AsRef<Path>) -> Result<Vec<Record>, CostModelError> {
    let path = path.as_ref();
    let err = |why: String| CostModelError::Records {
        path: path.to_path_buf(),
        why,
    };
    let text = std::fs::read_to_string(path).map_err(|e| err(e.to_string()))?;
    serde_json::from_str(&text).map_err(|e| err(e.to_string()))
}

/// Turns records into the arguments of [`CostModel::train`]: features, throughput normalised
/// per task (the task's best latency over this latency, so 1.0 is the task's best and a failed
/// measurement is 0.0), and task ids.
pub fn training_set(records: &[Record]) -> (Vec<Vec<f32>>, Vec<f64>, Vec<usize>) {
    let ok = |r: &Record| r.latency_s.filter(|l| l.is_finite() && *l > 0.0);
    let mut best: HashMap<usize, f64> = HashMap::new();
    for r in records {
        if let Some(l) = ok(r) {
            let b = best.entry(r.task).or_insert(f64::INFINITY);
            *b = b.min(l);
        }
    }
    let throughput = records
        .iter()
        .map(|r| match (ok(r), best.get(&r.task)) {
            (Some(l), Some(b)) => b / l,
            _ => 0.0,
        })
        .collect();
    (
        records.iter().map(|r| r.features.clone()).collect(),
        throughput,
        records.iter().map(|r| r.task).collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use harl_build::rng::Rng;

    /// A synthetic task set: `n` rows of `dims` features (some exactly 0), 4 tasks, throughput a
    /// monotone function of a few features plus a per-task scale.
    fn synthetic(n: usize, dims: usize, seed: u64) -> (Vec<Vec<f32>>, Vec<f64>, Vec<usize>) {
        let mut rng = Rng::new(seed);
        let mut x = Vec::new();
        let mut y = Vec::new();
        let mut g = Vec::new();
        for i in 0..n {
            let task = i % 4;
            let row: Vec<f32> = (0..dims)
                .map(|d| {
                    if d % 3 == 2 && rng.chance(0.4) {
                        0.0
                    } else {
                        (rng.unit() * 8.0) as f32
                    }
                })
                .collect();
            let t = (row[0] as f64).exp2() * (1.0 + row[1] as f64) / (1.0 + row[2] as f64);
            x.push(row);
            y.push(t * (task + 1) as f64);
            g.push(task);
        }
        (x, y, g)
    }

    fn params() -> XgbParams {
        XgbParams {
            rounds: 30,
            max_depth: 6,
            warmup_rows: 0,
            ..XgbParams::default()
        }
    }

    #[test]
    fn xgb_learns_a_monotone_relation_and_is_deterministic() {
        let (x, y, g) = synthetic(600, 24, 7);
        let (train, test) = (400, 600);
        let mut m = XgbModel::new(params());
        m.train(&x[..train], &y[..train], &g[..train])
            .expect("trains");
        assert!(m.is_trained());
        let pred = m.predict(&x[train..test]).expect("predicts");
        let acc = pairwise_accuracy_grouped(&pred, &y[train..test], &g[train..test]);
        assert!(acc > 0.8, "held-out pairwise accuracy {acc}");
        // Same rows, same parameters: the same model.
        let mut m2 = XgbModel::new(params());
        m2.train(&x[..train], &y[..train], &g[..train])
            .expect("trains");
        assert_eq!(pred, m2.predict(&x[train..test]).expect("predicts"));
        // Retraining replaces the model (online use): same result again.
        m2.train(&x[..train], &y[..train], &g[..train])
            .expect("trains");
        assert_eq!(pred, m2.predict(&x[train..test]).expect("predicts"));
    }

    #[test]
    fn xgb_uses_the_configured_objective() {
        let (x, y, g) = synthetic(80, 5, 1);
        let mut m = XgbModel::new(params());
        m.train(&x, &y, &g).expect("trains");
        let cfg = m.config_json().expect("trained");
        assert!(cfg.contains("rank:pairwise"), "{cfg}");
        assert!(cfg.contains("\"max_depth\":\"6\""), "{cfg}");
        assert!(cfg.contains("\"nthread\":\"1\""), "{cfg}");
    }

    #[test]
    fn xgb_zero_is_a_value_not_missing() {
        // Trained on x in {0, 2} (0 better): a split between them lies at 1, so 0.5 ranks with 0.
        // Were 0.0 read as missing, the only split would put every present value (0.5 too)
        // with 2.
        let x: Vec<Vec<f32>> = (0..60).map(|i| vec![(i % 2 * 2) as f32]).collect();
        let y: Vec<f64> = x.iter().map(|r| 2.0 - r[0] as f64).collect();
        let g = vec![0; x.len()];
        let mut m = XgbModel::new(params());
        m.train(&x, &y, &g).expect("trains");
        let p = m
            .predict(&[vec![0.0], vec![0.5], vec![2.0]])
            .expect("predicts");
        assert!(p[0] > p[2] && p[1] == p[0], "{p:?}");
    }

    #[test]
    fn xgb_warmup_and_errors() {
        let (x, y, g) = synthetic(20, 4, 3);
        let mut m = XgbModel::new(XgbParams {
            warmup_rows: 50,
            ..params()
        });
        m.train(&x, &y, &g).expect("trains");
        assert!(!m.is_trained());
        // Untrained: the seeded random fallback.
        let r = RandomModel::new(m.params().seed)
            .predict(&x)
            .expect("random");
        assert_eq!(m.predict(&x).expect("predicts"), r);
        assert!(matches!(
            m.train(&x, &y[1..], &g),
            Err(CostModelError::LengthMismatch { .. })
        ));
        let mut bad = y.clone();
        bad[3] = f64::NAN;
        assert!(matches!(
            m.train(&x, &bad, &g),
            Err(CostModelError::BadThroughput { row: 3, .. })
        ));
        let mut ragged = x.clone();
        ragged[5].push(1.0);
        assert!(matches!(
            m.train(&ragged, &y, &g),
            Err(CostModelError::FeatureLength { row: 5, .. })
        ));
        let mut m = XgbModel::new(params());
        m.train(&x, &y, &g).expect("trains");
        assert!(matches!(
            m.predict(&[vec![0.0; 3]]),
            Err(CostModelError::FeatureLength { expected: 4, .. })
        ));
        assert_eq!(m.predict(&[]).expect("empty"), Vec::<f64>::new());
    }

    #[test]
    fn random_model_is_chance_and_reproducible() {
        let (x, y, g) = synthetic(400, 6, 11);
        let mut m = RandomModel::new(5);
        m.train(&x, &y, &g).expect("trains");
        let p = m.predict(&x).expect("predicts");
        assert!(p.iter().all(|s| (0.0..1.0).contains(s)));
        let acc = pairwise_accuracy_grouped(&p, &y, &g);
        assert!((acc - 0.5).abs() < 0.06, "random accuracy {acc}");
        assert_eq!(p, RandomModel::new(5).predict(&x).expect("predicts"));
        assert_ne!(p, RandomModel::new(6).predict(&x).expect("predicts"));
    }

    #[test]
    fn metrics_on_hand_examples() {
        let truth = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(pairwise_accuracy(&[10.0, 20.0, 30.0, 40.0], &truth), 1.0);
        assert_eq!(pairwise_accuracy(&[4.0, 3.0, 2.0, 1.0], &truth), 0.0);
        // One swapped pair of six.
        assert!((pairwise_accuracy(&[1.0, 3.0, 2.0, 4.0], &truth) - 5.0 / 6.0).abs() < 1e-12);
        // A tie in pred counts half; ties in truth are skipped.
        assert_eq!(pairwise_accuracy(&[1.0, 1.0], &[1.0, 2.0]), 0.5);
        assert_eq!(pairwise_accuracy(&[1.0, 2.0], &[3.0, 3.0]), 0.5);
        assert_eq!(pairwise_accuracy(&[], &[]), 0.5);
        // Grouped: the cross-group pair (0, 2) is ignored.
        let acc = pairwise_accuracy_grouped(&[1.0, 2.0, 0.0, 5.0], &truth, &[0, 0, 1, 1]);
        assert_eq!(acc, 1.0);

        let truth = [5.0, 1.0, 4.0, 2.0, 3.0];
        // True top 2: rows 0 and 2.
        assert_eq!(top_k_recall(&[9.0, 0.0, 8.0, 0.0, 0.0], &truth, 2), 1.0);
        assert_eq!(top_k_recall(&[9.0, 0.0, 0.0, 0.0, 8.0], &truth, 2), 0.5);
        assert_eq!(top_k_recall(&[0.0, 9.0, 0.0, 8.0, 0.0], &truth, 2), 0.0);
        assert_eq!(top_k_recall(&[0.0; 5], &truth, 5), 1.0);
        assert_eq!(top_k_recall(&[1.0, 2.0], &[1.0, 2.0], 0), 1.0);
        assert_eq!(top_k_recall(&[1.0, 2.0], &[1.0, 2.0], 9), 1.0);
        // Ties in truth at the boundary all count.
        assert_eq!(top_k_recall(&[0.0, 1.0, 2.0], &[3.0, 3.0, 3.0], 1), 1.0);
    }

    #[test]
    fn records_round_trip_into_a_training_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("records.json");
        std::fs::write(
            &path,
            r#"[
                {"features": [1.0, 0.0], "latency_s": 2e-3, "task": 0},
                {"features": [2.0, 0.0], "latency_s": 1e-3, "task": 0},
                {"features": [3.0, 1.0], "latency_s": null, "task": 0},
                {"features": [4.0, 1.0], "latency_s": 5.0, "task": 1}
            ]"#,
        )
        .expect("write");
        let records = load_records(&path).expect("loads");
        let (x, y, g) = training_set(&records);
        assert_eq!(x[2], vec![3.0, 1.0]);
        assert_eq!(y, vec![0.5, 1.0, 0.0, 1.0]);
        assert_eq!(g, vec![0, 0, 0, 1]);
        assert!(matches!(
            load_records(dir.path().join("missing.json")),
            Err(CostModelError::Records { .. })
        ));
    }
}
