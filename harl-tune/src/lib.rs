//! harl's tuning stack: the search space (sketches and their parameters), the measurer,
//! schedule features and the cost model, search strategies and the task scheduler, and
//! [`job`], which tunes the kernels of a crate's manifest and records the winners.
//!
//! It is its own crate so that a crate which only consumes tuning records (through
//! `harl-build`) never builds XGBoost or burn: `cargo-harl` links this, build scripts call
//! `cargo-harl`.
//!
//! One concept a module or folder: [`space`] (what schedules a task can take: the
//! [`space::SearchSpace`] trait, the CPU and GPU sketch spaces), [`task`] (a
//! task's measured history), [`strategy`] (random, evolutionary, annealing, HARL), [`tuner`]
//! (the loop), [`task_scheduler`] (which task next: round robin, gradient, SW-UCB),
//! [`cost_model`] (XGBoost, random) over [`features`], [`measure`] (the `Measure` trait, CPU and
//! GPU measurers), [`job`] and [`retime`] (shipped records timed again beside the default). Strategies see the space only through [`task::TaskState`] and the
//! cost model through [`cost_model::CostModel`], so HARL's own search plugs in beside the
//! baselines and every strategy and the one loop serve the CPU and the GPU alike.

#![warn(missing_docs)]

pub mod bandit;
pub mod cost_model;
pub mod dense;
pub mod features;
pub mod job;
pub mod measure;
pub mod retime;
/// The seeded generator (shared with the GPU sketch, which needs no tuning stack).
pub use harl_build::rng;
pub mod space;
pub mod strategy;
pub mod task;
pub mod task_scheduler;
pub mod tuner;
