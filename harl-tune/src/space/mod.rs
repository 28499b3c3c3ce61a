//! Search spaces: what CPU and GPU schedules a task can take. [`cpu`] is Ansor's sketch space
//! (multi-level tiling, inlining, rfactor, layout sketches) with its parameters; [`gpu`] is the
//! GPU sketch, which lives in harl-build because the build emits its default schedule.

pub mod cpu;
pub use harl_build::gpu_sketch as gpu;
