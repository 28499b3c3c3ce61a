//! MetaTune (`HARL_COST_MODEL=metatune`): a graph neural network over the schedule's program,
//! meta-trained with MAML on harl's own dataset of measured trials, shipped as weights inside
//! this crate, and adapted online to each tune's own trials.
//!
//! * [`graph`]: the program graph (statements and buffers as nodes, the program as the super
//!   node of the paper's super-graph augmentation), built from the feature vector.
//! * `net`: a two-layer GCN and an MLP head (burn), trained with a pairwise ranking loss.
//! * [`meta_train`]: first-order MAML over the dataset's workloads (`harl-bench metatune`).
//! * [`MetaTuneModel`]: the [`CostModel`]. Before a tune has any trial it ranks with the
//!   meta-trained weights. Each [`CostModel::train`] starts again from those weights and takes
//!   the few SGD steps MAML trained for on the task's trials.
//!
//! The weights file (`data/metatune-<isa-class>.json.gz`) is gzipped JSON: the feature names
//! it was trained on (a file made for other features is refused, not misread), the
//! standardisation, the configuration and the layers. Reading checks every dimension and
//! value, so a hand-made file gets a clear error.

pub mod graph;
pub mod meta_train;
mod net;

pub use meta_train::{meta_train, MetaTrainStats};

use super::{check_rows, check_training_set, gz, CostModel, CostModelError};
use crate::dense::Dense;
use crate::features::{FEATURE_LEN, FEATURE_NAMES};
use burn::tensor::Device;
use graph::{Batch, Norm};
use net::{layer_dims, Net, LAYERS};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

/// The weights format this harl reads and writes.
pub const WEIGHTS_VERSION: u32 = 1;
/// The largest weights file (uncompressed) a reader accepts.
pub const MAX_WEIGHTS_BYTES: u64 = 64 << 20;
/// The largest hidden width a weights file may ask for.
pub const MAX_HIDDEN: usize = 1024;

/// The shipped weights, gzipped, by the ISA class their dataset was measured on.
pub const SHIPPED_WEIGHTS: [(&str, &[u8]); 2] = [
    (
        "x86_64-avx512",
        include_bytes!("../../../data/metatune-x86_64-avx512.json.gz"),
    ),
    (
        "x86_64-avx2",
        include_bytes!("../../../data/metatune-x86_64-avx2.json.gz"),
    ),
];

/// MetaTune's hyper-parameters: the network's width, MAML's inner and outer loops, and how
/// many of a tune's trials adaptation reads.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetaTuneConfig {
    /// Width of every hidden layer (32).
    pub hidden: usize,
    /// SGD rate of the inner (adaptation) steps (0.05).
    pub inner_lr: f64,
    /// Inner steps, in meta-training and at tune time (5).
    pub inner_steps: usize,
    /// Adam rate of the meta update (1e-3).
    pub outer_lr: f64,
    /// Meta-training iterations, one task each (4000).
    pub iterations: usize,
    /// Support-set sizes drawn from in meta-training ([0, 8, 16, 32]).
    pub support_rows: Vec<usize>,
    /// Query rows per iteration (48).
    pub query_rows: usize,
    /// At tune time, adaptation reads at most this many of the latest trials (512).
    pub max_adapt_rows: usize,
    /// Seed of the initial weights and of the task draws.
    pub seed: u64,
}

impl Default for MetaTuneConfig {
    fn default() -> Self {
        MetaTuneConfig {
            hidden: 32,
            inner_lr: 0.05,
            inner_steps: 5,
            outer_lr: 1e-3,
            iterations: 4000,
            support_rows: vec![0, 8, 16, 32],
            query_rows: 48,
            max_adapt_rows: 512,
            seed: 0,
        }
    }
}

/// A weights file: what the network was trained on and its layers.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MetaTuneWeights {
    /// [`WEIGHTS_VERSION`].
    pub version: u32,
    /// The ISA class of the dataset it was meta-trained on.
    pub isa_class: String,
    /// How it was made (command, dataset, date).
    pub note: String,
    /// The feature names it was trained on, in order ([`FEATURE_NAMES`] when it was made).
    pub features: Vec<String>,
    /// The configuration it was trained with (tune-time adaptation uses it too).
    pub config: MetaTuneConfig,
    /// The input standardisation.
    pub norm: Norm,
    /// The layers, in the network's order.
    pub layers: Vec<Dense>,
}

impl MetaTuneWeights {
    /// Checks the version, the feature names against today's, and every layer's dimensions
    /// and values. The error says what is wrong.
    pub fn validate(&self) -> Result<(), String> {
        if self.version != WEIGHTS_VERSION {
            return Err(format!(
                "weights version {} (this harl reads {WEIGHTS_VERSION})",
                self.version
            ));
        }
        if self.features.len() != FEATURE_LEN
            || self.features.iter().zip(FEATURE_NAMES).any(|(a, b)| a != b)
        {
            return Err(
                "trained on another feature set; regenerate it with `harl-bench metatune`".into(),
            );
        }
        let c = &self.config;
        if c.hidden == 0 || c.hidden > MAX_HIDDEN {
            return Err(format!("hidden width {} (1..={MAX_HIDDEN})", c.hidden));
        }
        if !(c.inner_lr.is_finite() && c.inner_lr >= 0.0) || c.inner_steps > 1000 {
            return Err("inner rate or steps out of range".into());
        }
        if !self.norm.is_valid() {
            return Err("the standardisation is malformed".into());
        }
        let dims = layer_dims(c.hidden);
        if self.layers.len() != dims.len() {
            return Err(format!("{} layers, want {}", self.layers.len(), dims.len()));
        }
        for ((layer, &(i, o)), name) in self.layers.iter().zip(&dims).zip(LAYERS) {
            if !layer.is_valid(i, o) {
                return Err(format!(
                    "layer `{name}` is not {i} x {o} with finite values"
                ));
            }
        }
        Ok(())
    }

    /// Writes the weights gzipped.
    pub fn write(&self, path: &Path) -> Result<(), CostModelError> {
        let text = serde_json::to_string(self).map_err(|e| gz::records_error(path, e))?;
        gz::write(path, &text)
    }

    /// Reads and validates a gzipped weights file.
    pub fn read(path: &Path) -> Result<MetaTuneWeights, CostModelError> {
        MetaTuneWeights::from_gz(&gz::read(path)?, path)
    }

    /// Parses and validates gzipped weights (`path` names them in errors).
    pub fn from_gz(bytes: &[u8], path: &Path) -> Result<MetaTuneWeights, CostModelError> {
        let bad = |why: String| gz::records_error(path, why);
        let text = gz::text(bytes, MAX_WEIGHTS_BYTES, path)?;
        let w: MetaTuneWeights = serde_json::from_str(&text).map_err(|e| bad(e.to_string()))?;
        w.validate().map_err(bad)?;
        Ok(w)
    }

    /// The shipped weights for ISA class `isa_class` (the AVX-512 ones for a class without its
    /// own), parsed once.
    pub fn shipped(isa_class: &str) -> Result<Arc<MetaTuneWeights>, CostModelError> {
        type Parsed = Result<Arc<MetaTuneWeights>, String>;
        static PARSED: [OnceLock<Parsed>; SHIPPED_WEIGHTS.len()] =
            [const { OnceLock::new() }; SHIPPED_WEIGHTS.len()];
        let i = SHIPPED_WEIGHTS
            .iter()
            .position(|(class, _)| *class == isa_class)
            .unwrap_or(0);
        let (class, bytes) = SHIPPED_WEIGHTS[i];
        let name = PathBuf::from(format!("data/metatune-{class}.json.gz"));
        PARSED[i]
            .get_or_init(|| {
                MetaTuneWeights::from_gz(bytes, &name)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
            .map_err(|why| CostModelError::Records { path: name, why })
    }
}

/// Rows a forward pass scores at once (bounds the batch's memory).
const PREDICT_CHUNK: usize = 2048;

/// MetaTune as a [`CostModel`]: the meta-trained network, and its copy adapted to the
/// current tune's trials.
pub struct MetaTuneModel {
    weights: Arc<MetaTuneWeights>,
    device: Device,
    meta: Net,
    adapted: Option<Net>,
}

impl std::fmt::Debug for MetaTuneModel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MetaTuneModel")
            .field("isa_class", &self.weights.isa_class)
            .field("adapted", &self.adapted.is_some())
            .finish_non_exhaustive()
    }
}

impl MetaTuneModel {
    /// A model over `weights` (validated when read).
    pub fn new(weights: Arc<MetaTuneWeights>) -> MetaTuneModel {
        let device = Device::flex().autodiff();
        let meta = Net::from_layers(&weights.layers, &device);
        MetaTuneModel {
            weights,
            device,
            meta,
            adapted: None,
        }
    }

    /// A model over the shipped weights of `isa_class` ([`MetaTuneWeights::shipped`]).
    pub fn shipped(isa_class: &str) -> Result<MetaTuneModel, CostModelError> {
        Ok(MetaTuneModel::new(MetaTuneWeights::shipped(isa_class)?))
    }

    /// The weights it started from.
    pub fn weights(&self) -> &MetaTuneWeights {
        &self.weights
    }
}

impl CostModel for MetaTuneModel {
    fn name(&self) -> &str {
        "metatune"
    }

    fn train(
        &mut self,
        features: &[Vec<f32>],
        throughput: &[f64],
        groups: &[usize],
    ) -> Result<(), CostModelError> {
        check_training_set(features, throughput, groups)?;
        check_rows(features, FEATURE_LEN)?;
        let c = &self.weights.config;
        let from = features.len().saturating_sub(c.max_adapt_rows);
        let rows: Vec<&[f32]> = features[from..].iter().map(Vec::as_slice).collect();
        self.adapted = Some(meta_train::adapt(
            self.meta.clone(),
            &rows,
            &throughput[from..],
            &groups[from..],
            &self.weights.norm,
            c,
            &self.device,
        ));
        Ok(())
    }

    fn predict(&self, features: &[Vec<f32>]) -> Result<Vec<f64>, CostModelError> {
        check_rows(features, FEATURE_LEN)?;
        let net = self.adapted.as_ref().unwrap_or(&self.meta);
        let mut scores = Vec::with_capacity(features.len());
        for chunk in features.chunks(PREDICT_CHUNK) {
            let rows: Vec<&[f32]> = chunk.iter().map(Vec::as_slice).collect();
            let batch = Batch::new(&rows, &self.weights.norm, &self.device);
            let out = net.forward(&batch).into_data();
            scores.extend(out.iter::<f32>().map(f64::from));
        }
        Ok(scores)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost_model::dataset::{Measured, Rows};
    use crate::cost_model::pairwise_accuracy;
    use crate::features::{BUFFER_LEN, MAX_STMTS, PROGRAM_LEN, STMT_LEN};
    use harl_build::rng::Rng;

    /// A program of one or two statements and two to six buffers, every seventh feature
    /// random (the rest constant), and a speed law shared by every task: faster with the first
    /// statement's feature 5 and the first buffer's feature 7, slower with the program's
    /// feature 3; `scale` is the task's.
    fn row(rng: &mut Rng) -> Vec<f32> {
        let law = [3, PROGRAM_LEN + 5, PROGRAM_LEN + MAX_STMTS * STMT_LEN + 7];
        let mut f: Vec<f32> = (0..FEATURE_LEN)
            .map(|i| {
                if i % 7 == 0 || law.contains(&i) {
                    rng.unit() as f32
                } else {
                    0.5
                }
            })
            .collect();
        let stmts = 1 + rng.below(2);
        let buffers = 2 + rng.below(5);
        for k in 0..MAX_STMTS {
            let at = PROGRAM_LEN + k * STMT_LEN;
            f[at] = if k < stmts { 1.0 } else { 0.0 };
            if k >= stmts {
                f[at..at + STMT_LEN].iter_mut().for_each(|v| *v = 0.0);
            }
        }
        for k in 0..6 {
            let at = PROGRAM_LEN + MAX_STMTS * STMT_LEN + k * BUFFER_LEN;
            f[at] = if k < buffers { 1.0 } else { 0.0 };
            if k >= buffers {
                f[at..at + BUFFER_LEN].iter_mut().for_each(|v| *v = 0.0);
            }
        }
        f
    }

    fn speed(f: &[f32]) -> f64 {
        let stmt0 = PROGRAM_LEN;
        let buf0 = PROGRAM_LEN + MAX_STMTS * STMT_LEN;
        f64::from(2.0 * f[stmt0 + 5] + f[buf0 + 7] - f[3]) + 2.0
    }

    fn task(rng: &mut Rng, n: usize, scale: f64) -> Vec<Measured> {
        (0..n)
            .map(|_| {
                let f = row(rng);
                let latency = 1.0 / (speed(&f) * scale);
                (f, Some(latency))
            })
            .collect()
    }

    fn small() -> MetaTuneConfig {
        MetaTuneConfig {
            hidden: 8,
            iterations: 500,
            query_rows: 24,
            support_rows: vec![0, 8],
            inner_steps: 2,
            outer_lr: 3e-3,
            ..MetaTuneConfig::default()
        }
    }

    fn trained(seed: u64) -> (MetaTuneWeights, MetaTrainStats) {
        let mut rng = Rng::new(seed);
        let mut rows = Rows::default();
        for t in 0..6 {
            rows.push_group(task(&mut rng, 40, 1.0 + t as f64));
        }
        meta_train(&rows, &small(), "x86_64-test", "test".into()).expect("meta-trains")
    }

    fn accuracy(model: &dyn CostModel, test: &[Measured]) -> f64 {
        let feats: Vec<Vec<f32>> = test.iter().map(|t| t.0.clone()).collect();
        let truth: Vec<f64> = test.iter().map(|t| 1.0 / t.1.expect("ok")).collect();
        pairwise_accuracy(&model.predict(&feats).expect("predicts"), &truth)
    }

    #[test]
    fn meta_training_learns_a_law_shared_by_tasks_and_is_reproducible() {
        let (weights, stats) = trained(1);
        assert_eq!((stats.tasks, stats.rows), (6, 240));
        assert!(weights.validate().is_ok());
        let curve = &stats.loss_curve;
        assert_eq!(curve.len(), 5);
        assert!(curve[4] < curve[0], "query loss did not fall: {curve:?}");
        let mut model = MetaTuneModel::new(Arc::new(weights.clone()));
        let mut rng = Rng::new(99);
        let unseen = task(&mut rng, 80, 7.5);
        let before = accuracy(&model, &unseen);
        assert!(before > 0.75, "zero-shot pairwise accuracy {before}");
        // Adapting on the task's first trials keeps the ranking of the rest.
        let mut own = Rows::default();
        own.push_group(unseen[..16].iter().cloned());
        model
            .train(&own.features, &own.throughput, &own.groups)
            .expect("adapts");
        let after = accuracy(&model, &unseen[16..]);
        assert!(after > 0.7, "adapted pairwise accuracy {after}");
        // Same rows, same seed: the same weights.
        assert_eq!(trained(1).0, weights);
    }

    #[test]
    fn weights_round_trip_and_bad_files_are_refused() {
        let (weights, _) = trained(2);
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("w.json.gz");
        weights.write(&path).expect("writes");
        assert_eq!(MetaTuneWeights::read(&path).expect("reads"), weights);
        let refused = |w: &MetaTuneWeights| {
            w.write(&path).expect("writes");
            match MetaTuneWeights::read(&path) {
                Err(CostModelError::Records { why, .. }) => why,
                other => panic!("accepted: {other:?}"),
            }
        };
        let mut w = weights.clone();
        w.features[4] = "prog.renamed".into();
        assert!(refused(&w).contains("feature set"));
        let mut w = weights.clone();
        w.layers[3].w.pop();
        assert!(refused(&w).contains("self1"));
        let mut w = weights.clone();
        w.layers.pop();
        assert!(refused(&w).contains("layers"));
        let mut w = weights.clone();
        w.config.hidden = 9;
        assert!(refused(&w).contains("embed_prog"));
        let mut w = weights.clone();
        w.version = 7;
        assert!(refused(&w).contains("version"));
        let mut w = weights;
        w.norm.std[0] = 0.0;
        assert!(refused(&w).contains("standardisation"));
        std::fs::write(&path, b"not gzip").expect("writes");
        assert!(MetaTuneWeights::read(&path).is_err());
    }

    #[test]
    fn the_shipped_weights_load_and_rows_of_the_wrong_length_are_errors() {
        for (class, _) in SHIPPED_WEIGHTS {
            let w = MetaTuneWeights::shipped(class).expect("the shipped weights are valid");
            assert_eq!(w.isa_class, class);
        }
        // A class without weights of its own gets the first class's.
        let other = MetaTuneWeights::shipped("aarch64-neon").expect("falls back");
        assert_eq!(other.isa_class, SHIPPED_WEIGHTS[0].0);
        let mut model = MetaTuneModel::new(other);
        assert!(matches!(
            model.predict(&[vec![0.0; 3]]),
            Err(CostModelError::FeatureLength { .. })
        ));
        assert!(matches!(
            model.train(&[vec![0.0; 3]], &[1.0], &[0]),
            Err(CostModelError::FeatureLength { .. })
        ));
        assert_eq!(model.predict(&[]).expect("empty"), Vec::<f64>::new());
    }

    #[test]
    fn the_shipped_weights_rank_their_own_dataset() {
        let rows = crate::cost_model::TransferModel::shipped_rows("x86_64-avx512");
        let model = MetaTuneModel::shipped("x86_64-avx512").expect("shipped");
        let pred = model.predict(&rows.features).expect("predicts");
        let acc =
            crate::cost_model::pairwise_accuracy_grouped(&pred, &rows.throughput, &rows.groups);
        assert!(acc > 0.75, "in-sample pairwise accuracy {acc}");
    }
}
