//! The baseline model: reproducible random scores.

use super::{check_training_set, CostModel, CostModelError};
use harl_build::rng::Rng;

/// The baseline: a uniform pseudo-random score in `[0, 1)` per row, a pure function of the
/// seed and the row's features (so predictions are reproducible and training does nothing).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RandomModel {
    /// Seed of the scores.
    pub seed: u64,
}

impl RandomModel {
    /// A random model with this seed.
    pub fn new(seed: u64) -> Self {
        RandomModel { seed }
    }

    fn score(&self, row: &[f32]) -> f64 {
        // FNV-1a over the feature bits, then SplitMix.
        let mut h = 0xcbf2_9ce4_8422_2325u64;
        for x in row {
            for b in x.to_bits().to_le_bytes() {
                h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
            }
        }
        Rng::new(self.seed ^ h).unit()
    }
}

impl CostModel for RandomModel {
    fn name(&self) -> &str {
        "random"
    }

    fn train(
        &mut self,
        features: &[Vec<f32>],
        throughput: &[f64],
        groups: &[usize],
    ) -> Result<(), CostModelError> {
        check_training_set(features, throughput, groups).map(|_| ())
    }

    fn predict(&self, features: &[Vec<f32>]) -> Result<Vec<f64>, CostModelError> {
        Ok(features.iter().map(|r| self.score(r)).collect())
    }
}
