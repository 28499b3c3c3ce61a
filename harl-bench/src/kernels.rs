//! The kernels harl-bench times, registered in `build.rs` and built from the workspace's
//! `tuning-cache/` (default schedules where it has no record).

harl::include_kernels!();
