//! A dense layer's weights in plain Rust, and their way in and out of burn: PPO's networks
//! keep an inference mirror of them, MetaTune ships them in a file.

use burn::module::Param;
use burn::nn::Linear;
use burn::tensor::{Device, TensorData};
use harl_build::rng::Rng;
use serde::{Deserialize, Serialize};

/// `y = x W + b`, `W` row-major `[d_in][d_out]` as burn stores it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Dense {
    /// The weights, `d_in * d_out` values.
    pub w: Vec<f32>,
    /// The biases, `d_out` values.
    pub b: Vec<f32>,
    /// Outputs.
    pub d_out: usize,
}

impl Dense {
    /// Weights uniform in ±`scale`/√`d_in` (PyTorch's default range), biases zero.
    pub fn random(d_in: usize, d_out: usize, scale: f64, rng: &mut Rng) -> Dense {
        let k = scale / (d_in as f64).sqrt();
        let w = (0..d_in * d_out)
            .map(|_| ((rng.unit() * 2.0 - 1.0) * k) as f32)
            .collect();
        Dense {
            w,
            b: vec![0.0; d_out],
            d_out,
        }
    }

    /// Inputs (0 for a layer without outputs).
    pub fn d_in(&self) -> usize {
        self.w.len().checked_div(self.d_out).unwrap_or(0)
    }

    /// Whether the layer is `d_in x d_out` with a bias per output and only finite values.
    pub fn is_valid(&self, d_in: usize, d_out: usize) -> bool {
        self.d_out == d_out
            && d_in.checked_mul(d_out) == Some(self.w.len())
            && self.b.len() == d_out
            && self.w.iter().chain(&self.b).all(|v| v.is_finite())
    }

    /// The same numbers as a burn layer on `device`.
    pub fn to_linear(&self, device: &Device) -> Linear {
        Linear {
            weight: Param::from_data(
                TensorData::new(self.w.clone(), [self.d_in(), self.d_out]),
                device,
            ),
            bias: Some(Param::from_data(
                TensorData::new(self.b.clone(), [self.d_out]),
                device,
            )),
        }
    }

    /// A burn layer's numbers (`None` if burn cannot read them back).
    pub fn from_linear(linear: &Linear) -> Option<Dense> {
        let weight = linear.weight.val();
        let [_, d_out] = weight.dims();
        let w: Vec<f32> = weight.try_into_data().ok()?.iter::<f32>().collect();
        let b: Vec<f32> = match &linear.bias {
            Some(b) => b.val().try_into_data().ok()?.iter::<f32>().collect(),
            None => vec![0.0; d_out],
        };
        Some(Dense { w, b, d_out })
    }

    /// `x W + b` for one input row.
    pub fn forward(&self, x: &[f32]) -> Vec<f32> {
        let mut y = self.b.clone();
        for (&xi, row) in x.iter().zip(self.w.chunks_exact(self.d_out)) {
            for (yj, &wij) in y.iter_mut().zip(row) {
                *yj += xi * wij;
            }
        }
        y
    }
}
