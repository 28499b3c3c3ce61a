//! XGBoost with the rank objective: Ansor's and HARL's model.

use super::{check_rows, check_training_set, CostModel, CostModelError, RandomModel};
use serde::{Deserialize, Serialize};
use std::collections::HashMap;
use xgboost_rs::{Booster, DMatrix};

/// Settings of [`XgbModel`]. The defaults follow Ansor's XGBoost settings (depth 10, eta 0.2,
/// gamma 0.001, min child weight 0) with a fixed number of rounds instead of early stopping.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct XgbParams {
    /// Boosting rounds (trees) per training.
    pub rounds: u32,
    /// Maximum tree depth.
    pub max_depth: u32,
    /// Learning rate.
    pub eta: f64,
    /// Minimum loss reduction to split.
    pub gamma: f64,
    /// Minimum hessian sum in a child.
    pub min_child_weight: f64,
    /// L2 regularisation of leaf weights.
    pub lambda: f64,
    /// XGBoost's `tree_method`: `exact` (default here) or `hist`.
    pub tree_method: String,
    /// XGBoost's seed.
    pub seed: u64,
    /// Threads XGBoost may use (1 gives steady, reproducible timings).
    pub nthread: u32,
    /// Below this many training rows the model is not fitted and predicts like a
    /// [`RandomModel`] with the same seed (Ansor's warm-up; 0 fits from the first row).
    pub warmup_rows: usize,
}

impl Default for XgbParams {
    fn default() -> Self {
        XgbParams {
            rounds: 60,
            max_depth: 10,
            eta: 0.2,
            gamma: 0.001,
            min_child_weight: 0.0,
            lambda: 1.0,
            tree_method: "exact".into(),
            seed: 43,
            nthread: 1,
            warmup_rows: 64,
        }
    }
}

/// Gradient-boosted trees ranking schedules within each task (XGBoost `rank:pairwise`).
///
/// Each [`CostModel::train`] call fits a new booster on all the rows it is given (rows are
/// grouped by task for the ranking objective). Training and prediction are deterministic for
/// given parameters and rows. Features are passed to XGBoost with NaN as the missing value, so
/// an exact 0.0 is an ordinary value (the `xgboost-rs` dense constructor would read it as
/// missing).
pub struct XgbModel {
    params: XgbParams,
    booster: Option<Booster>,
    n_features: usize,
    fallback: RandomModel,
}

impl std::fmt::Debug for XgbModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("XgbModel")
            .field("params", &self.params)
            .field("trained", &self.booster.is_some())
            .field("n_features", &self.n_features)
            .finish()
    }
}

impl XgbModel {
    /// An untrained model with these settings.
    pub fn new(params: XgbParams) -> Self {
        let fallback = RandomModel::new(params.seed);
        XgbModel {
            params,
            booster: None,
            n_features: 0,
            fallback,
        }
    }

    /// An untrained model with the default settings and this seed.
    pub fn with_seed(seed: u64) -> Self {
        XgbModel::new(XgbParams {
            seed,
            ..XgbParams::default()
        })
    }

    /// The settings.
    pub fn params(&self) -> &XgbParams {
        &self.params
    }

    /// Whether a booster has been fitted (otherwise predictions are random).
    pub fn is_trained(&self) -> bool {
        self.booster.is_some()
    }

    /// XGBoost's view of the booster's configuration (JSON), if trained.
    pub fn config_json(&self) -> Option<String> {
        self.booster.as_ref().map(Booster::save_config)
    }
}

impl XgbParams {
    /// XGBoost's configuration for these settings.
    fn booster_config(&self) -> HashMap<String, String> {
        [
            ("objective", "rank:pairwise".to_string()),
            ("eta", self.eta.to_string()),
            ("max_depth", self.max_depth.to_string()),
            ("gamma", self.gamma.to_string()),
            ("min_child_weight", self.min_child_weight.to_string()),
            ("lambda", self.lambda.to_string()),
            ("tree_method", self.tree_method.clone()),
            // XGBoost reads a signed 64-bit seed; any u64 seed (HARL_SEED) maps into it.
            ("seed", (self.seed & i64::MAX as u64).to_string()),
            ("nthread", self.nthread.max(1).to_string()),
            ("verbosity", "0".to_string()),
            ("disable_default_eval_metric", "1".to_string()),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    }
}

/// A dense row-major matrix with NaN (not 0.0) as XGBoost's missing value.
fn dmatrix(rows: &[&[f32]], n_features: usize, nthread: u32) -> Result<DMatrix, CostModelError> {
    let mut data = Vec::with_capacity(rows.len() * n_features);
    for r in rows {
        data.extend_from_slice(r);
    }
    let elem = std::mem::size_of::<f32>();
    Ok(DMatrix::from_col_major_f32(
        &data,
        n_features * elem,
        elem,
        rows.len(),
        n_features,
        nthread.max(1) as i32,
        f32::NAN,
    )?)
}

impl CostModel for XgbModel {
    fn name(&self) -> &str {
        "xgboost"
    }

    fn train(
        &mut self,
        features: &[Vec<f32>],
        throughput: &[f64],
        groups: &[usize],
    ) -> Result<(), CostModelError> {
        let n_features = check_training_set(features, throughput, groups)?;
        if features.is_empty() || n_features == 0 || features.len() < self.params.warmup_rows {
            self.booster = None;
            return Ok(());
        }
        let booster = fit_ranker(&self.params, features, throughput, groups, n_features, None)?;
        self.booster = Some(booster);
        self.n_features = n_features;
        Ok(())
    }

    fn predict(&self, features: &[Vec<f32>]) -> Result<Vec<f64>, CostModelError> {
        let Some(booster) = &self.booster else {
            return self.fallback.predict(features);
        };
        check_rows(features, self.n_features)?;
        predict_ranker(booster, features, self.n_features, &self.params, None)
    }
}

/// Fits a ranking booster with `params` on rows grouped by task (each row's score starting
/// from `prior`'s margin, when there is one: the booster then learns what the prior misses).
pub(crate) fn fit_ranker(
    params: &XgbParams,
    features: &[Vec<f32>],
    throughput: &[f64],
    groups: &[usize],
    n_features: usize,
    prior: Option<&XgbModel>,
) -> Result<Booster, CostModelError> {
    let (order, sizes) = group_sizes(groups);
    let labels = ranking_labels(&order, throughput, groups);
    let rows: Vec<&[f32]> = order.iter().map(|&i| features[i].as_slice()).collect();
    let mut dtrain = dmatrix(&rows, n_features, params.nthread)?;
    dtrain.set_labels(&labels)?;
    dtrain.set_group(&sizes)?;
    if let Some(prior) = prior {
        let margin = prior_margin(prior, features)?;
        let ordered: Vec<f32> = order.iter().map(|&i| margin[i]).collect();
        dtrain.set_base_margin(&ordered)?;
    }
    // Booster::train would build a fixed 16 trees; one update per round instead.
    let mut booster = Booster::new_with_json_config(&[&dtrain], params.booster_config())?;
    for round in 0..params.rounds {
        booster.update(&dtrain, round as i32)?;
    }
    Ok(booster)
}

/// Scores `features` (checked to have `n_features` each) with `booster`, on top of `prior`'s
/// margin when it was fitted on one.
pub(crate) fn predict_ranker(
    booster: &Booster,
    features: &[Vec<f32>],
    n_features: usize,
    params: &XgbParams,
    prior: Option<&XgbModel>,
) -> Result<Vec<f64>, CostModelError> {
    if features.is_empty() {
        return Ok(vec![]);
    }
    let rows: Vec<&[f32]> = features.iter().map(Vec::as_slice).collect();
    let mut dtest = dmatrix(&rows, n_features, params.nthread)?;
    if let Some(prior) = prior {
        dtest.set_base_margin(&prior_margin(prior, features)?)?;
    }
    let out = booster.predict(&dtest)?;
    if out.len() != features.len() {
        return Err(CostModelError::Xgboost(format!(
            "{} predictions for {} rows",
            out.len(),
            features.len()
        )));
    }
    Ok(out.into_iter().map(f64::from).collect())
}

/// `prior`'s scores of `features`, as the base margin of a booster fitted on top of it.
fn prior_margin(prior: &XgbModel, features: &[Vec<f32>]) -> Result<Vec<f32>, CostModelError> {
    Ok(prior
        .predict(features)?
        .into_iter()
        .map(|x| x as f32)
        .collect())
}

/// The row order that makes each group contiguous (a stable sort keeps the given order within,
/// as XGBoost's ranking wants), and the group sizes in that order.
fn group_sizes(groups: &[usize]) -> (Vec<usize>, Vec<u32>) {
    let mut order: Vec<usize> = (0..groups.len()).collect();
    order.sort_by_key(|&i| groups[i]);
    let mut sizes: Vec<u32> = Vec::new();
    for (k, &i) in order.iter().enumerate() {
        if k == 0 || groups[i] != groups[order[k - 1]] {
            sizes.push(0);
        }
        if let Some(last) = sizes.last_mut() {
            *last += 1;
        }
    }
    (order, sizes)
}

/// Labels in `order`: throughput over its group's best (only the order within a group
/// matters; this keeps values in f32 range).
fn ranking_labels(order: &[usize], throughput: &[f64], groups: &[usize]) -> Vec<f32> {
    let mut scale: HashMap<usize, f64> = HashMap::new();
    for (&g, &t) in groups.iter().zip(throughput) {
        let s = scale.entry(g).or_insert(0.0);
        *s = s.max(t.abs());
    }
    order
        .iter()
        .map(|&i| {
            let s = scale.get(&groups[i]).copied().unwrap_or(1.0);
            (if s > 0.0 { throughput[i] / s } else { 0.0 }) as f32
        })
        .collect()
}
