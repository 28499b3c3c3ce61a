//! The build-time half of harl: lowering, schedules, Rust codegen, the tuning cache, and the
//! [`Builder`] a downstream crate calls from `build.rs`.

#![warn(missing_docs)]

pub mod schedule;

pub use harl_te as te;
