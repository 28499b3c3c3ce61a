//! The graph MetaTune reads, built from a schedule's feature vector.
//!
//! [`features::extract`](crate::features::extract) already describes a lowered program as
//! blocks: the program's totals, its two heaviest statements, and up to six buffers. Each
//! statement and each buffer becomes a node with its own block as its features. The program
//! block becomes the *super node* that MetaTune's super-graph augmentation adds: it is linked
//! to every node, so each node sees the whole program within one hop. Statements and buffers
//! are linked to each other. The flat vector does not record which statement touches which
//! buffer, so every present statement is linked to every present buffer. Absent blocks (their
//! `present` flag is 0) are masked out, so programs with fewer statements or buffers get
//! smaller graphs.
//!
//! Feature values are standardised with the mean and standard deviation of the meta-training
//! rows ([`Norm`]). Those statistics ship with the weights.

use crate::features::{BUFFER_LEN, FEATURE_LEN, MAX_BUFFERS, MAX_STMTS, PROGRAM_LEN, STMT_LEN};
use burn::tensor::{Device, Tensor, TensorData};
use serde::{Deserialize, Serialize};

/// Per-feature standardisation, fitted on the meta-training rows.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Norm {
    /// Mean of each feature.
    pub mean: Vec<f32>,
    /// Standard deviation of each feature (1 where a feature never varies).
    pub std: Vec<f32>,
}

impl Norm {
    /// The statistics of `rows` (each [`FEATURE_LEN`] long). With no rows, mean 0 and std 1.
    pub fn fit(rows: &[Vec<f32>]) -> Norm {
        let n = rows.len().max(1) as f64;
        let mut mean = vec![0.0f64; FEATURE_LEN];
        for r in rows {
            for (m, &v) in mean.iter_mut().zip(r) {
                *m += f64::from(v);
            }
        }
        mean.iter_mut().for_each(|m| *m /= n);
        let mut var = vec![0.0f64; FEATURE_LEN];
        for r in rows {
            for ((s, &v), m) in var.iter_mut().zip(r).zip(&mean) {
                *s += (f64::from(v) - m).powi(2);
            }
        }
        let std = var
            .iter()
            .map(|s| {
                let sd = (s / n).sqrt();
                if sd > 1e-6 {
                    sd as f32
                } else {
                    1.0
                }
            })
            .collect();
        Norm {
            mean: mean.into_iter().map(|m| m as f32).collect(),
            std,
        }
    }

    /// Whether it has one finite mean and one positive finite std per feature.
    pub fn is_valid(&self) -> bool {
        self.mean.len() == FEATURE_LEN
            && self.std.len() == FEATURE_LEN
            && self.mean.iter().all(|m| m.is_finite())
            && self.std.iter().all(|s| s.is_finite() && *s > 0.0)
    }
}

const STMTS_AT: usize = PROGRAM_LEN;
const BUFFERS_AT: usize = PROGRAM_LEN + MAX_STMTS * STMT_LEN;

/// A batch of program graphs as tensors: `B` graphs, `S` statement and `M` buffer slots.
pub(super) struct Batch {
    /// Super-node features `[B, PROGRAM_LEN]`.
    pub prog: Tensor<2>,
    /// Statement features `[B, S, STMT_LEN]`.
    pub stmt: Tensor<3>,
    /// Buffer features `[B, M, BUFFER_LEN]`.
    pub buf: Tensor<3>,
    /// 1 for a present statement, 0 for an empty slot `[B, S, 1]`.
    pub stmt_mask: Tensor<3>,
    /// 1 for a present buffer `[B, M, 1]`.
    pub buf_mask: Tensor<3>,
    /// A statement's neighbours: the present buffers and the super node, `1 / (buffers + 1)`,
    /// `[B, 1, 1]`.
    pub stmt_norm: Tensor<3>,
    /// A buffer's neighbours: the present statements and the super node `[B, 1, 1]`.
    pub buf_norm: Tensor<3>,
    /// The super node's neighbours: every present node, `1 / max(1, nodes)` `[B, 1]`.
    pub prog_norm: Tensor<2>,
    /// `1 / max(1, statements)` for the mean over statements `[B, 1]`.
    pub stmt_pool: Tensor<2>,
    /// `1 / max(1, buffers)` `[B, 1]`.
    pub buf_pool: Tensor<2>,
}

impl Batch {
    /// The graphs of `rows` (each [`FEATURE_LEN`] long; the caller checks), standardised
    /// with `norm`, on `device`.
    pub fn new(rows: &[&[f32]], norm: &Norm, device: &Device) -> Batch {
        let b = rows.len();
        let mut prog = Vec::with_capacity(b * PROGRAM_LEN);
        let mut stmt = Vec::with_capacity(b * MAX_STMTS * STMT_LEN);
        let mut buf = Vec::with_capacity(b * MAX_BUFFERS * BUFFER_LEN);
        let mut stmt_mask = Vec::with_capacity(b * MAX_STMTS);
        let mut buf_mask = Vec::with_capacity(b * MAX_BUFFERS);
        let mut counts = Vec::with_capacity(b);
        for row in rows {
            let z: Vec<f32> = row
                .iter()
                .zip(norm.mean.iter().zip(&norm.std))
                .map(|(&v, (m, s))| (v - m) / s)
                .collect();
            prog.extend_from_slice(&z[..PROGRAM_LEN]);
            let present = |at: usize| if row[at] > 0.5 { 1.0f32 } else { 0.0 };
            let (mut ns, mut nb) = (0.0f32, 0.0f32);
            for k in 0..MAX_STMTS {
                let at = STMTS_AT + k * STMT_LEN;
                stmt.extend_from_slice(&z[at..at + STMT_LEN]);
                stmt_mask.push(present(at));
                ns += present(at);
            }
            for k in 0..MAX_BUFFERS {
                let at = BUFFERS_AT + k * BUFFER_LEN;
                buf.extend_from_slice(&z[at..at + BUFFER_LEN]);
                buf_mask.push(present(at));
                nb += present(at);
            }
            counts.push((ns, nb));
        }
        let t2 = |v: Vec<f32>, d: [usize; 2]| Tensor::<2>::from_data(TensorData::new(v, d), device);
        let t3 = |v: Vec<f32>, d: [usize; 3]| Tensor::<3>::from_data(TensorData::new(v, d), device);
        let per_row = |f: &dyn Fn(f32, f32) -> f32| -> Vec<f32> {
            counts.iter().map(|&(s, m)| f(s, m)).collect()
        };
        Batch {
            prog: t2(prog, [b, PROGRAM_LEN]),
            stmt: t3(stmt, [b, MAX_STMTS, STMT_LEN]),
            buf: t3(buf, [b, MAX_BUFFERS, BUFFER_LEN]),
            stmt_mask: t3(stmt_mask, [b, MAX_STMTS, 1]),
            buf_mask: t3(buf_mask, [b, MAX_BUFFERS, 1]),
            stmt_norm: t3(per_row(&|_, m| 1.0 / (m + 1.0)), [b, 1, 1]),
            buf_norm: t3(per_row(&|s, _| 1.0 / (s + 1.0)), [b, 1, 1]),
            prog_norm: t2(per_row(&|s, m| 1.0 / (s + m).max(1.0)), [b, 1]),
            stmt_pool: t2(per_row(&|s, _| 1.0 / s.max(1.0)), [b, 1]),
            buf_pool: t2(per_row(&|_, m| 1.0 / m.max(1.0)), [b, 1]),
        }
    }
}

/// The pairs a ranking loss compares: an `n x n` 0/1 matrix, 1 where rows `i` and `j` are of
/// one task and `i` was measured faster than `j`, and how many pairs that is.
pub(super) struct Pairs {
    /// The matrix `[n, n]`.
    pub mask: Tensor<2>,
    /// Its ones.
    pub count: usize,
}

impl Pairs {
    /// The pairs of `n` rows with `throughput` in `groups`; `None` when no two rows of one
    /// group differ.
    pub fn new(throughput: &[f64], groups: &[usize], device: &Device) -> Option<Pairs> {
        let n = throughput.len();
        let mut mask = vec![0.0f32; n * n];
        let mut count = 0;
        for i in 0..n {
            for j in 0..n {
                if groups[i] == groups[j] && throughput[i] > throughput[j] {
                    mask[i * n + j] = 1.0;
                    count += 1;
                }
            }
        }
        (count > 0).then(|| Pairs {
            mask: Tensor::<2>::from_data(TensorData::new(mask, [n, n]), device),
            count,
        })
    }
}
