//! The build-time half of harl: lowering, schedules, Rust codegen, the tuning cache, and the
//! `Builder` a downstream crate calls from `build.rs`.

#![warn(missing_docs)]

pub mod affine;
pub mod builder;
pub mod cache;
pub mod codegen;
pub mod cuda;
pub mod default_schedule;
pub mod directive;
pub mod gpu_sketch;
pub mod layout;
pub mod limits;
pub mod loop_ir;
pub mod lower;
pub mod manifest;
#[cfg(feature = "cuda")]
pub mod nvrtc;
pub mod partition;
pub mod prepare;
pub mod register_tile;
pub mod rng;
pub mod rows;
pub mod scan;
pub mod schedule;
pub mod shared_read;
pub mod simplify;
pub mod slide;
pub mod target;
pub mod tuner_tool;

pub use builder::{BuildError, Builder, ModelWeights, Report, ScheduleSource, TuneMode};
pub use harl_te as te;
