//! kernels.
