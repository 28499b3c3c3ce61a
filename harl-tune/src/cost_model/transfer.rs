//! XGBoost warm-started from earlier measurements (AutoTVM's transfer learning): a *prior*
//! booster fitted once on a dataset of other workloads' trials ([`super::dataset`]: the
//! shipped one, plus whatever the caller adds), and per task a booster fitted on the task's own
//! trials on top of the prior's scores (its margin is the task booster's base margin). Before a
//! task has a trial the prior ranks alone, so no ranking is ever random; as trials come in,
//! the task booster corrects the prior where this workload differs.

use super::dataset::{Dataset, Rows, SHIPPED};
use super::xgb::{fit_ranker, predict_ranker};
use super::{check_rows, check_training_set, CostModel, CostModelError, XgbModel, XgbParams};
use std::cell::RefCell;
use std::collections::HashMap;
use std::mem::ManuallyDrop;
use std::path::PathBuf;
use std::rc::Rc;
use std::sync::OnceLock;
use xgboost_rs::Booster;

/// Fitted priors by (seed, ISA class).
type Priors = HashMap<(u64, String), Rc<XgbModel>>;

/// A prior booster with a task booster on top of it.
pub struct TransferModel {
    prior: Rc<XgbModel>,
    params: XgbParams,
    task: Option<Booster>,
}

impl TransferModel {
    /// A model over `prior` (trained; shared by the tasks of a job), whose task boosters use
    /// `params`.
    pub fn new(prior: Rc<XgbModel>, params: XgbParams) -> Self {
        TransferModel {
            prior,
            params,
            task: None,
        }
    }

    /// A prior fitted on `rows` (a group per workload) with `params`; `warmup_rows` is ignored.
    pub fn fit_prior(rows: &Rows, params: &XgbParams) -> Result<XgbModel, CostModelError> {
        let mut prior = XgbModel::new(XgbParams {
            warmup_rows: 0,
            ..params.clone()
        });
        prior.train(&rows.features, &rows.throughput, &rows.groups)?;
        Ok(prior)
    }

    /// A model for tuning on ISA class `isa_class` over a prior fitted with `seed` on the
    /// shipped dataset of that class, or on all shipped datasets when none is of that class
    /// (once per thread, seed and class), with the default task booster
    /// ([`TransferModel::task_params`]).
    pub fn shipped(seed: u64, isa_class: &str) -> Result<TransferModel, CostModelError> {
        thread_local! {
            // Never dropped: a booster freed by a thread-local destructor at process exit can
            // run after XGBoost's own statics are gone (a crash on exit). The OS frees it.
            static PRIORS: ManuallyDrop<RefCell<Priors>> =
                ManuallyDrop::new(RefCell::new(HashMap::new()));
        }
        let params = XgbParams {
            seed,
            ..XgbParams::default()
        };
        let key = (seed, isa_class.to_string());
        let prior = match PRIORS.with(|p| p.borrow().get(&key).cloned()) {
            Some(p) => p,
            None => {
                let rows = TransferModel::shipped_rows(isa_class);
                if rows.is_empty() {
                    return Err(CostModelError::Records {
                        path: PathBuf::from("data"),
                        why: "the shipped datasets have no usable trials".into(),
                    });
                }
                let p = Rc::new(TransferModel::fit_prior(rows, &params)?);
                PRIORS.with(|m| m.borrow_mut().insert(key, p.clone()));
                p
            }
        };
        Ok(TransferModel::new(prior, TransferModel::task_params(seed)))
    }

    /// The task booster's settings: gentler than the prior's (shallower trees, half the rounds,
    /// half the step), so a few of the task's own trials correct the prior rather than replace
    /// it, yet enough to overrule a prior that is wrong for this workload or machine.
    pub fn task_params(seed: u64) -> XgbParams {
        XgbParams {
            seed,
            rounds: 30,
            max_depth: 6,
            eta: 0.1,
            ..XgbParams::default()
        }
    }

    /// The same prior with other task booster settings.
    pub fn with_task_params(self, params: XgbParams) -> TransferModel {
        TransferModel {
            params,
            task: None,
            ..self
        }
    }

    /// Training rows for ISA class `isa_class`: the shipped dataset of that class, or all of
    /// them when none is; extracted once per process (features of today's feature set).
    pub fn shipped_rows(isa_class: &str) -> &'static Rows {
        static ROWS: [OnceLock<Rows>; SHIPPED.len()] = [const { OnceLock::new() }; SHIPPED.len()];
        static ALL: OnceLock<Rows> = OnceLock::new();
        let sets = Dataset::shipped();
        match SHIPPED.iter().position(|(class, _)| *class == isa_class) {
            Some(i) => {
                ROWS[i].get_or_init(|| sets[i].as_ref().map(Dataset::rows).unwrap_or_default())
            }
            None => ALL.get_or_init(|| {
                let mut all = Rows::default();
                for d in sets.iter().flatten() {
                    all.append(d.rows());
                }
                all
            }),
        }
    }
}

impl CostModel for TransferModel {
    fn name(&self) -> &str {
        "xgb-transfer"
    }

    fn train(
        &mut self,
        features: &[Vec<f32>],
        throughput: &[f64],
        groups: &[usize],
    ) -> Result<(), CostModelError> {
        let n_features = check_training_set(features, throughput, groups)?;
        if features.len() < 2 || n_features == 0 {
            self.task = None;
            return Ok(());
        }
        let booster = fit_ranker(
            &self.params,
            features,
            throughput,
            groups,
            n_features,
            Some(&self.prior),
        )?;
        self.task = Some(booster);
        Ok(())
    }

    fn predict(&self, features: &[Vec<f32>]) -> Result<Vec<f64>, CostModelError> {
        let Some(booster) = &self.task else {
            return self.prior.predict(features);
        };
        let n = features.first().map_or(0, Vec::len);
        check_rows(features, n)?;
        predict_ranker(booster, features, n, &self.params, Some(&self.prior))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cost_model::dataset::Measured;
    use crate::cost_model::pairwise_accuracy;
    use harl_build::rng::Rng;

    /// A synthetic law shared by every workload: throughput rises with feature 0 and falls
    /// with feature 1; the other features are noise.
    fn group(rng: &mut Rng, n: usize) -> Vec<Measured> {
        (0..n)
            .map(|_| {
                let f: Vec<f32> = (0..6).map(|_| rng.unit() as f32).collect();
                let throughput = 1.0 + 2.0 * f64::from(f[0]) - f64::from(f[1]);
                (f, Some(1.0 / throughput))
            })
            .collect()
    }

    fn accuracy(model: &dyn CostModel, test: &[Measured]) -> f64 {
        let feats: Vec<Vec<f32>> = test.iter().map(|t| t.0.clone()).collect();
        let truth: Vec<f64> = test.iter().map(|t| 1.0 / t.1.expect("ok")).collect();
        pairwise_accuracy(&model.predict(&feats).expect("predict"), &truth)
    }

    #[test]
    fn the_prior_ranks_an_unseen_workload_before_any_of_its_trials() {
        let mut rng = Rng::new(1);
        let mut rows = Rows::default();
        for _ in 0..8 {
            rows.push_group(group(&mut rng, 40));
        }
        let params = XgbParams::default();
        let prior = Rc::new(TransferModel::fit_prior(&rows, &params).expect("prior"));
        let model = TransferModel::new(prior.clone(), params.clone());
        let test = group(&mut rng, 60);
        let cold = XgbModel::with_seed(0);
        let (warm_acc, cold_acc) = (accuracy(&model, &test), accuracy(&cold, &test));
        assert!(warm_acc > 0.8, "transfer at 0 trials: {warm_acc}");
        assert!(cold_acc < 0.65, "cold at 0 trials is random: {cold_acc}");
        // The same prior and trials give the same scores.
        let again = TransferModel::new(prior, params);
        let feats: Vec<Vec<f32>> = test.iter().map(|t| t.0.clone()).collect();
        assert_eq!(
            model.predict(&feats).expect("a"),
            again.predict(&feats).expect("b")
        );
    }

    #[test]
    fn own_trials_correct_a_prior_that_is_wrong_for_this_workload() {
        let mut rng = Rng::new(2);
        let mut rows = Rows::default();
        for _ in 0..6 {
            rows.push_group(group(&mut rng, 40));
        }
        let params = XgbParams::default();
        let prior = Rc::new(TransferModel::fit_prior(&rows, &params).expect("prior"));
        let mut model = TransferModel::new(prior, params);
        // This workload's law is the opposite on feature 0.
        let flipped = |g: Vec<Measured>| -> Vec<Measured> {
            g.into_iter()
                .map(|(f, _)| {
                    let t = 3.0 - 2.0 * f64::from(f[0]) - f64::from(f[1]);
                    (f, Some(1.0 / t))
                })
                .collect()
        };
        let own = flipped(group(&mut rng, 64));
        let test = flipped(group(&mut rng, 60));
        let before = accuracy(&model, &test);
        let mut task = Rows::default();
        task.push_group(own);
        model
            .train(&task.features, &task.throughput, &task.groups)
            .expect("train");
        let after = accuracy(&model, &test);
        assert!(before < 0.5, "the prior is wrong here: {before}");
        assert!(after > before + 0.2, "own trials: {before} -> {after}");
    }

    #[test]
    fn every_shipped_dataset_gives_training_rows_of_its_class() {
        for ((class, _), data) in SHIPPED.iter().zip(Dataset::shipped()) {
            let data = data.as_ref().expect("the shipped dataset parses");
            assert_eq!(data.header.target.isa_class, *class);
            assert!(data.workloads.len() >= 16, "{}", data.workloads.len());
            let rows = TransferModel::shipped_rows(class);
            assert!(
                rows.len() * 10 >= data.trials() * 9,
                "{class}: {} of {} trials lower today",
                rows.len(),
                data.trials()
            );
            assert_eq!(
                rows.groups.last().map(|g| g + 1),
                Some(data.workloads.len())
            );
        }
        // A class with no dataset of its own gets them all.
        let all = TransferModel::shipped_rows("aarch64-neon");
        let each: usize = SHIPPED
            .iter()
            .map(|(c, _)| TransferModel::shipped_rows(c).len())
            .sum();
        assert_eq!(all.len(), each);
    }
}
