//! Meta-training (first-order MAML) and adaptation.
//!
//! Each iteration draws one task (a workload of the dataset), a support set of 0, 8, 16 or 32
//! of its trials and a disjoint query set. The current weights take
//! [`MetaTuneConfig::inner_steps`] SGD steps on the support set's ranking loss. The gradient of
//! the query loss *at the adapted weights* then moves the meta weights (Adam). This is
//! first-order MAML: the paper's second-order term (the gradient through the inner steps) is
//! dropped. burn can differentiate through an optimizer step only by rebuilding it by hand.
//! An empty support set trains the weights as they rank before a task has any trial, which is
//! how a tune starts.

use super::graph::{Batch, Norm, Pairs};
use super::net::rank_loss;
use super::net::Net;
use super::{MetaTuneConfig, MetaTuneWeights, WEIGHTS_VERSION};
use crate::cost_model::dataset::Rows;
use crate::cost_model::CostModelError;
use crate::features::{FEATURE_LEN, FEATURE_NAMES};
use burn::optim::{AdamConfig, GradientsParams, SgdConfig};
use burn::tensor::Device;
use harl_build::rng::Rng;
use std::collections::BTreeMap;

/// How meta-training went: the mean query loss of each window of 100 iterations.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct MetaTrainStats {
    /// Tasks (workloads) with at least two distinct throughputs.
    pub tasks: usize,
    /// Rows over those tasks.
    pub rows: usize,
    /// Mean query loss per window of 100 iterations.
    pub loss_curve: Vec<f64>,
}

/// `config.inner_steps` SGD steps at rate `config.inner_lr` of the ranking loss over `rows`
/// (`throughput`, `groups`: pairs are formed within a group) starting from `net`. Without a
/// pair, `net` unchanged.
pub(super) fn adapt(
    mut net: Net,
    rows: &[&[f32]],
    throughput: &[f64],
    groups: &[usize],
    norm: &Norm,
    config: &MetaTuneConfig,
    device: &Device,
) -> Net {
    let Some(pairs) = Pairs::new(throughput, groups, device).filter(|_| config.inner_steps > 0)
    else {
        return net;
    };
    let batch = Batch::new(rows, norm, device);
    let mut sgd = SgdConfig::new().init();
    for _ in 0..config.inner_steps {
        let loss = rank_loss(net.forward(&batch), &pairs);
        let mut grads = loss.backward();
        let grads = GradientsParams::from_module(&mut grads, &net);
        net = sgd.step(config.inner_lr, net, grads);
    }
    net
}

/// Meta-trains MetaTune's weights on `rows` (a group per task) with `config`, for ISA class
/// `isa_class`; `note` says how (it goes into the weights file).
///
/// # Errors
///
/// When `rows`' vectors differ in length or a row is not [`FEATURE_LEN`] long, when it has
/// fewer than two tasks with two distinct throughputs, or burn cannot read
/// the trained weights back.
pub fn meta_train(
    rows: &Rows,
    config: &MetaTuneConfig,
    isa_class: &str,
    note: String,
) -> Result<(MetaTuneWeights, MetaTrainStats), CostModelError> {
    let bad = |why: String| CostModelError::Records {
        path: "meta-training rows".into(),
        why,
    };
    crate::cost_model::check_training_set(&rows.features, &rows.throughput, &rows.groups)?;
    crate::cost_model::check_rows(&rows.features, FEATURE_LEN)?;
    let mut by_group: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for (i, &g) in rows.groups.iter().enumerate() {
        by_group.entry(g).or_default().push(i);
    }
    let mut tasks: Vec<Vec<usize>> = by_group.into_values().collect();
    tasks.retain(|t| {
        let first = rows.throughput[t[0]];
        t.iter().any(|&i| rows.throughput[i] != first)
    });
    if tasks.len() < 2 {
        return Err(bad(format!(
            "{} task(s) with distinct throughputs; meta-training needs two",
            tasks.len()
        )));
    }
    let stats_rows = tasks.iter().map(Vec::len).sum();
    let norm = Norm::fit(&rows.features);
    let device = Device::flex().autodiff();
    let mut rng = Rng::new(config.seed);
    let mut net = Net::from_layers(&Net::random(config.hidden, &mut rng), &device);
    let mut adam = AdamConfig::new().init();
    let (mut window, mut curve) = (Vec::new(), Vec::new());
    for _ in 0..config.iterations {
        let task = &tasks[rng.below(tasks.len())];
        let mut order = task.clone();
        for i in (1..order.len()).rev() {
            order.swap(i, rng.below(i + 1));
        }
        let support = match config.support_rows.len() {
            0 => 0,
            k => config.support_rows[rng.below(k)],
        }
        .min(order.len().saturating_sub(2));
        let query_end = (support + config.query_rows).min(order.len());
        let pick = |idx: &[usize]| -> (Vec<&[f32]>, Vec<f64>) {
            (
                idx.iter().map(|&i| rows.features[i].as_slice()).collect(),
                idx.iter().map(|&i| rows.throughput[i]).collect(),
            )
        };
        let (s_rows, s_y) = pick(&order[..support]);
        let (q_rows, q_y) = pick(&order[support..query_end]);
        // A query set with no pair to order teaches nothing: skip it before adapting.
        let Some(pairs) = Pairs::new(&q_y, &vec![0; q_y.len()], &device) else {
            continue;
        };
        let adapted = adapt(
            net.clone(),
            &s_rows,
            &s_y,
            &vec![0; s_y.len()],
            &norm,
            config,
            &device,
        );
        let batch = Batch::new(&q_rows, &norm, &device);
        let loss = rank_loss(adapted.forward(&batch), &pairs);
        window.push(f64::from(
            loss.clone().try_into_scalar::<f32>().unwrap_or(f32::NAN),
        ));
        let mut grads = loss.backward();
        // The adapted copy's parameters keep the meta weights' ids, so its gradients apply to
        // the meta weights: the first-order MAML update.
        let grads = GradientsParams::from_module(&mut grads, &adapted);
        net = adam.step(config.outer_lr, net, grads);
        if window.len() == 100 {
            curve.push(window.iter().sum::<f64>() / 100.0);
            window.clear();
        }
    }
    let layers = net
        .layers()
        .ok_or_else(|| bad("burn could not read the trained weights back".into()))?;
    let weights = MetaTuneWeights {
        version: WEIGHTS_VERSION,
        isa_class: isa_class.to_string(),
        note,
        features: FEATURE_NAMES.iter().map(|s| s.to_string()).collect(),
        config: config.clone(),
        norm,
        layers,
    };
    Ok((
        weights,
        MetaTrainStats {
            tasks: tasks.len(),
            rows: stats_rows,
            loss_curve: curve,
        },
    ))
}
