//! Ready-made tensor kernels, built by harl from the tuning cache this package ships
//! (`tuning-cache/` inside it; harl's default schedule where the cache has no record).
//!
//! Each kernel is a module with `run(inputs.., out) -> Result<(), harl::KernelError>` (inputs in
//! the order below, all row-major `f32`; the call checks every slice length), plus
//! `WORKLOAD_KEY`, `SCHEDULE_SOURCES` and `schedule_source()` (where the schedule of each ISA variant came from).
//!
//! | module | computes | inputs | output |
//! |---|---|---|---|
//! | [`gemm_128`] | `a x b` | `a [128, 128]`, `b [128, 128]` | `[128, 128]` |
//! | [`gemm_256`] | `a x b` | `a [256, 256]`, `b [256, 256]` | `[256, 256]` |
//! | [`batch_matmul`] | `a[i] x b[i]` for each of 12 batches | `a [12, 64, 64]`, `b [12, 64, 64]` | `[12, 64, 64]` |
//! | [`dense_bias_relu`] | `relu(x x w + bias)` | `x [64, 256]`, `w [256, 512]`, `bias [512]` | `[64, 512]` |
//! | [`conv2d_3x3`] | 2-D convolution, NCHW, stride 1, pad 1 | `data [1, 16, 28, 28]`, `weight [32, 16, 3, 3]` | `[1, 32, 28, 28]` |
//! | [`softmax`] | softmax over the last axis | `x [128, 128]` | `[128, 128]` |
//! | [`layer_norm`] | layer norm over the last axis, eps 1e-5 | `x [128, 768]`, `gamma [768]`, `beta [768]` | `[128, 768]` |
//!
//! The shapes are examples, small enough that the test suite checks every kernel against harl's
//! reference interpreter in seconds; the list lives in `registry.rs`. For other shapes, register
//! ops in your own `build.rs` the same way:
//!
//! ```text
//! // build.rs
//! harl_build::Builder::new()
//!     .kernel("gemm_512", harl_te::ops::workloads::matmul(512, 512, 512)?)
//!     .compile();
//! // lib.rs
//! harl::include_kernels!();
//! ```
//!
//! ```
//! let (a, b) = (vec![1.0f32; 128 * 128], vec![0.5f32; 128 * 128]);
//! let mut out = vec![0.0f32; 128 * 128];
//! harl_kernels::gemm_128::run(&a, &b, &mut out)?;
//! assert_eq!(out[0], 64.0);
//! # Ok::<(), harl::KernelError>(())
//! ```

harl::include_kernels!();
