//! MetaTune's network: a graph convolutional network over a [`Batch`] of program graphs
//! and an MLP on the pooled embedding, with a ranking loss. It is a burn module on the CPU
//! `flex` backend with autodiff, like PPO's networks.
//!
//! * Embedding: each node type has its own linear map into `hidden` features, then ReLU.
//! * Two graph convolutions, with weights shared by every node:
//!   `h' = h + relu(W_self h + W_nbr mean(neighbours))`, masked to the present nodes.
//! * Readout: the super node, the mean of the statements and the mean of the buffers are
//!   concatenated. Then `relu(Linear(3 hidden -> hidden))` and a `Linear(hidden -> 1)` score.

use super::graph::{Batch, Pairs};
use crate::dense::Dense;
use crate::features::{BUFFER_LEN, PROGRAM_LEN, STMT_LEN};
use burn::module::Module;
use burn::nn::Linear;
use burn::tensor::activation::{relu, softplus};
use burn::tensor::{Device, Tensor};
use harl_build::rng::Rng;

/// The network. Field order is the order of [`LAYERS`].
#[derive(Module, Debug)]
pub(super) struct Net {
    embed_prog: Linear,
    embed_stmt: Linear,
    embed_buf: Linear,
    self1: Linear,
    nbr1: Linear,
    self2: Linear,
    nbr2: Linear,
    head: Linear,
    out: Linear,
}

/// The layers' names in a weights file, in order.
pub(super) const LAYERS: [&str; 9] = [
    "embed_prog",
    "embed_stmt",
    "embed_buf",
    "self1",
    "nbr1",
    "self2",
    "nbr2",
    "head",
    "out",
];

/// Each layer's `(inputs, outputs)` for `hidden` features, in [`LAYERS`] order.
pub(super) fn layer_dims(hidden: usize) -> [(usize, usize); 9] {
    let h = hidden;
    [
        (PROGRAM_LEN, h),
        (STMT_LEN, h),
        (BUFFER_LEN, h),
        (h, h),
        (h, h),
        (h, h),
        (h, h),
        (3 * h, h),
        (h, 1),
    ]
}

impl Net {
    /// Fresh weights of `hidden` features drawn from `rng`, as plain layers.
    pub fn random(hidden: usize, rng: &mut Rng) -> Vec<Dense> {
        layer_dims(hidden)
            .iter()
            .map(|&(i, o)| Dense::random(i, o, 1.0, rng))
            .collect()
    }

    /// The network with `layers` (in [`LAYERS`] order, dimensions checked by the caller).
    pub fn from_layers(layers: &[Dense], device: &Device) -> Net {
        let l = |i: usize| layers[i].to_linear(device);
        Net {
            embed_prog: l(0),
            embed_stmt: l(1),
            embed_buf: l(2),
            self1: l(3),
            nbr1: l(4),
            self2: l(5),
            nbr2: l(6),
            head: l(7),
            out: l(8),
        }
    }

    /// The current weights as plain layers (`None` if burn cannot read them back).
    pub fn layers(&self) -> Option<Vec<Dense>> {
        [
            &self.embed_prog,
            &self.embed_stmt,
            &self.embed_buf,
            &self.self1,
            &self.nbr1,
            &self.self2,
            &self.nbr2,
            &self.head,
            &self.out,
        ]
        .into_iter()
        .map(Dense::from_linear)
        .collect()
    }

    /// Scores `[B, 1]`: higher is predicted faster.
    pub fn forward(&self, b: &Batch) -> Tensor<2> {
        let [n, s, _] = b.stmt.dims();
        let [_, m, _] = b.buf.dims();
        let h = self.self1.weight.val().dims()[0];
        let hp = relu(self.embed_prog.forward(b.prog.clone()));
        let hs =
            relu(self.embed_stmt.forward(b.stmt.clone())) * b.stmt_mask.clone().expand([n, s, h]);
        let hb = relu(self.embed_buf.forward(b.buf.clone())) * b.buf_mask.clone().expand([n, m, h]);
        let (hp, hs, hb) = propagate(&self.self1, &self.nbr1, hp, hs, hb, b);
        let (hp, hs, hb) = propagate(&self.self2, &self.nbr2, hp, hs, hb, b);
        let ps = hs.sum_dim(1).reshape([n, h]) * b.stmt_pool.clone().expand([n, h]);
        let pb = hb.sum_dim(1).reshape([n, h]) * b.buf_pool.clone().expand([n, h]);
        let z = Tensor::cat(vec![hp, ps, pb], 1);
        self.out.forward(relu(self.head.forward(z)))
    }
}

/// One graph convolution: every node adds `relu(W_self h + W_nbr mean(neighbours))`.
fn propagate(
    w_self: &Linear,
    w_nbr: &Linear,
    hp: Tensor<2>,
    hs: Tensor<3>,
    hb: Tensor<3>,
    b: &Batch,
) -> (Tensor<2>, Tensor<3>, Tensor<3>) {
    let [n, s, h] = hs.dims();
    let [_, m, _] = hb.dims();
    let sum_s = hs.clone().sum_dim(1);
    let sum_b = hb.clone().sum_dim(1);
    let hp3 = hp.clone().reshape([n, 1, h]);
    let nbr_s =
        (sum_b.clone() + hp3.clone()).expand([n, s, h]) * b.stmt_norm.clone().expand([n, s, h]);
    let nbr_b = (sum_s.clone() + hp3).expand([n, m, h]) * b.buf_norm.clone().expand([n, m, h]);
    let nbr_p = (sum_s + sum_b).reshape([n, h]) * b.prog_norm.clone().expand([n, h]);
    let step = |x: Tensor<3>, nbr: Tensor<3>| relu(w_self.forward(x) + w_nbr.forward(nbr));
    let hs2 = (hs.clone() + step(hs, nbr_s)) * b.stmt_mask.clone().expand([n, s, h]);
    let hb2 = (hb.clone() + step(hb, nbr_b)) * b.buf_mask.clone().expand([n, m, h]);
    let hp2 = hp.clone() + relu(w_self.forward(hp) + w_nbr.forward(nbr_p));
    (hp2, hs2, hb2)
}

/// RankNet's loss: the mean over `pairs` (row `i` faster than row `j`) of
/// `log(1 + exp(s_j - s_i))`.
pub(super) fn rank_loss(scores: Tensor<2>, pairs: &Pairs) -> Tensor<1> {
    let n = scores.dims()[0];
    let si = scores.clone().expand([n, n]);
    let sj = scores.reshape([1, n]).expand([n, n]);
    (softplus(sj - si, 1.0) * pairs.mask.clone())
        .sum()
        .div_scalar(pairs.count as f32)
}
