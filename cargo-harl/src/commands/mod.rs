//! One module per command group.

pub mod cache;
pub mod krate;
pub mod progress;
pub mod report;
pub mod retime;
pub mod tune;
