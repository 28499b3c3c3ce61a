//! Tuning (feature `tune`): the search space (sketches and their parameters), the measurer,
//! schedule features and the cost model, search strategies and the task scheduler.
//!
//! Each concept is a module; strategies only see the space through [`sketch`] and the cost
//! model through [`cost_model::CostModel`], so HARL's own search plugs in beside the baselines.

pub mod bandit;
pub mod cost_model;
pub mod features;
pub mod gpu_harl;
#[cfg(feature = "cuda")]
pub mod gpu_measure;
pub mod gpu_search;
pub mod harl;
pub mod measure;
pub mod ppo;
/// The seeded generator (shared with the GPU sketch, which needs no tuning stack).
pub use crate::rng;
pub mod search;
pub mod sketch;
pub mod stopping;
pub mod task_scheduler;
pub mod track_start;
pub mod tuner;
