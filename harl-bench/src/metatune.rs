//! `harl-bench metatune --isa-class CLASS --out FILE`: meta-trains MetaTune's weights on the
//! shipped dataset of an ISA class (the file `harl-tune/data/metatune-<class>.json.gz`
//! ships).

use crate::Error;
use harl_tune::cost_model::dataset::{Measured, Rows};
use harl_tune::cost_model::metatune::{meta_train, MetaTuneConfig, MetaTuneWeights};
use harl_tune::cost_model::{pairwise_accuracy, CostModel, MetaTuneModel, TransferModel};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Instant;

/// Options of `metatune`.
#[derive(Debug, Clone, clap::Args)]
pub struct Options {
    /// The ISA class whose shipped dataset to train on (`x86_64-avx512`, `x86_64-avx2`).
    #[arg(long, default_value = "x86_64-avx512")]
    pub isa_class: String,
    /// Meta-training iterations (one task each).
    #[arg(long)]
    pub iterations: Option<usize>,
    /// Seed of the initial weights and task draws.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Hidden width.
    #[arg(long)]
    pub hidden: Option<usize>,
    /// Inner (adaptation) SGD steps.
    #[arg(long)]
    pub inner_steps: Option<usize>,
    /// Inner SGD rate.
    #[arg(long)]
    pub inner_lr: Option<f64>,
    /// Hold every fourth workload out of training and report how the weights rank it after 0
    /// and 16 of its trials (to choose settings without the evaluation workloads).
    #[arg(long)]
    pub validate: bool,
    /// Where to write the weights (gzipped JSON).
    #[arg(long)]
    pub out: PathBuf,
}

/// Splits `rows` into training rows and held-out groups (every fourth group).
fn split(rows: &Rows) -> (Rows, Vec<Vec<Measured>>) {
    let (mut train, mut held) = (Rows::default(), Vec::new());
    let mut groups: Vec<(usize, Vec<Measured>)> = Vec::new();
    for ((f, &t), &g) in rows.features.iter().zip(&rows.throughput).zip(&rows.groups) {
        if groups.last().map(|l| l.0) != Some(g) {
            groups.push((g, Vec::new()));
        }
        // Throughput relative to the group's best is a latency up to a scale.
        let latency = (t > 0.0).then(|| 1.0 / t);
        if let Some(last) = groups.last_mut() {
            last.1.push((f.clone(), latency));
        }
    }
    for (i, (_, g)) in groups.into_iter().enumerate() {
        if i % 4 == 3 {
            held.push(g);
        } else {
            train.push_group(g);
        }
    }
    (train, held)
}

/// Mean pairwise accuracy over `held` after 0 and 16 of each group's trials.
fn validate(weights: &MetaTuneWeights, held: &[Vec<Measured>]) -> Result<[f64; 2], Error> {
    let weights = Arc::new(weights.clone());
    let mut acc = [0.0; 2];
    for g in held {
        for (k, seen) in [0usize, 16].into_iter().enumerate() {
            let mut model = MetaTuneModel::new(weights.clone());
            let (train, test) = g.split_at(seen.min(g.len()));
            let mut own = Rows::default();
            own.push_group(train.iter().cloned());
            model.train(&own.features, &own.throughput, &own.groups)?;
            let test: Vec<&Measured> = test.iter().filter(|r| r.1.is_some()).collect();
            let feats: Vec<Vec<f32>> = test.iter().map(|r| r.0.clone()).collect();
            let truth: Vec<f64> = test.iter().map(|r| 1.0 / r.1.unwrap_or(f64::MAX)).collect();
            acc[k] += pairwise_accuracy(&model.predict(&feats)?, &truth) / held.len() as f64;
        }
    }
    Ok(acc)
}

/// Meta-trains and writes the weights.
pub fn run(o: &Options) -> Result<(), Error> {
    let defaults = MetaTuneConfig::default();
    let config = MetaTuneConfig {
        iterations: o.iterations.unwrap_or(defaults.iterations),
        hidden: o.hidden.unwrap_or(defaults.hidden),
        inner_steps: o.inner_steps.unwrap_or(defaults.inner_steps),
        inner_lr: o.inner_lr.unwrap_or(defaults.inner_lr),
        seed: o.seed,
        ..defaults
    };
    if o.validate {
        let (train, held) = split(TransferModel::shipped_rows(&o.isa_class));
        let (weights, _) = meta_train(&train, &config, &o.isa_class, "validation".into())?;
        let [a0, a16] = validate(&weights, &held)?;
        println!(
            "held-out workloads: {}; pairwise accuracy after 0 trials {a0:.3}, after 16 {a16:.3}",
            held.len()
        );
        return Ok(());
    }
    let rows = TransferModel::shipped_rows(&o.isa_class);
    let start = Instant::now();
    let note = format!(
        "harl-bench metatune --isa-class {} --iterations {} --seed {}: first-order MAML on the shipped dataset of {} ({} rows)",
        o.isa_class,
        config.iterations,
        o.seed,
        o.isa_class,
        rows.len()
    );
    let (weights, stats) = meta_train(rows, &config, &o.isa_class, note)?;
    let secs = start.elapsed().as_secs_f64();
    weights.write(&o.out)?;
    let curve: Vec<String> = stats.loss_curve.iter().map(|l| format!("{l:.3}")).collect();
    println!(
        "meta-trained on {} tasks, {} rows, {} iterations in {secs:.1} s; query loss per 100 iterations: {}",
        stats.tasks,
        stats.rows,
        config.iterations,
        curve.join(" ")
    );
    println!(
        "wrote {} ({} bytes)",
        o.out.display(),
        std::fs::metadata(&o.out)?.len()
    );
    Ok(())
}
