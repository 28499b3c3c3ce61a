//! harl's tuning stack: the search space (sketches and their parameters), the measurer,
//! schedule features and the cost model, search strategies and the task scheduler, and
//! [`job`], which tunes the kernels of a crate's manifest and records the winners.
//!
//! It is its own crate so that a crate which only consumes tuning records (through
//! `harl-build`) never builds XGBoost or burn: `cargo-harl` links this, build scripts call
//! `cargo-harl`.
//!
//! Each concept is a module; strategies only see the space through [`sketch`] and the cost
//! model through [`cost_model::CostModel`], so HARL's own search plugs in beside the baselines.

#![warn(missing_docs)]

pub mod bandit;
pub mod cost_model;
pub mod features;
pub mod gpu_harl;
#[cfg(feature = "cuda")]
pub mod gpu_measure;
pub mod gpu_search;
pub mod harl;
pub mod job;
pub mod measure;
pub mod ppo;
/// The seeded generator (shared with the GPU sketch, which needs no tuning stack).
pub use harl_build::rng;
pub mod search;
pub mod sketch;
pub mod stopping;
pub mod task_scheduler;
pub mod track_start;
pub mod tuner;
