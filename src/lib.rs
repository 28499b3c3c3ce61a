//! # harl
//!
//! Tensor kernels tuned ahead of time and compiled into your binary.
//!
//! Declare a kernel with [`kernel`] (or register ops with `harl_build::Builder` in `build.rs`);
//! the build script lowers it with a schedule from the tuning cache (or a good default), emits Rust
//! with per-ISA multiversions, and the attribute expands to a typed, safe function that runs it.
//!
//! ```text
//! #[harl::kernel(M = 64, K = 128, N = 256)]
//! fn dense_relu(a: Tensor<f32, M, K>, w: Tensor<f32, K, N>, bias: Tensor<f32, N>) -> Tensor<f32, M, N> {
//!     relu(matmul(a, w) + bias)
//! }
//! ```
//! expands to `fn dense_relu(a: &[f32], w: &[f32], bias: &[f32], out: &mut [f32]) -> Result<(), harl::KernelError>`.
//! See the README for the DSL and the build-script setup.

#![warn(missing_docs)]

#[cfg(feature = "cuda")]
pub mod gpu;
pub mod runtime;
pub mod weights;

pub use harl_macros::kernel;

/// What a kernel or model call can go wrong with: the buffers you pass it, and a model's weights file.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KernelError {
    /// A slice has the wrong number of elements for the kernel's static shape.
    #[error("kernel `{kernel}`: argument `{arg}` has {got} elements, but its shape {shape} needs {want}")]
    Length {
        /// The kernel.
        kernel: &'static str,
        /// The argument.
        arg: &'static str,
        /// Elements given.
        got: usize,
        /// Elements needed.
        want: usize,
        /// The declared shape, e.g. `[64, 128]`.
        shape: &'static str,
    },
    /// The kernel was built without code for this CPU's instruction set (only in modules built
    /// for some variants, as harl's measurer does; a normal build always has a portable one).
    #[error("kernel `{kernel}` has no code for this CPU")]
    UnsupportedCpu {
        /// The kernel.
        kernel: &'static str,
    },
    /// A model's weights file is missing, unreadable, or not the one the model was built with
    /// (see [`weights`]).
    #[error("model `{model}`: {why}")]
    Weights {
        /// The model.
        model: &'static str,
        /// What is wrong with the file.
        why: String,
    },
}

/// Includes the kernels registered with `harl_build::Builder::kernel` in `build.rs`, as one
/// module per kernel, each with a `run` function.
#[macro_export]
macro_rules! include_kernels {
    () => {
        include!(concat!(env!("OUT_DIR"), "/harl/kernels.rs"));
    };
}
