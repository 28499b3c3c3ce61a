//! Tensor expressions (te) for harl.
//!
//! A [`Graph`] is a list of placeholders and compute stages with static shapes; each stage computes
//! one element from loads of earlier tensors, optionally reduced over reduce axes. The op library
//! ([`ops`]) builds common operators; [`interp`] is the naive reference every emitted kernel is
//! checked against; with the `dsl` feature, [`dsl`] parses `#[harl::kernel]` items into graphs; with the `onnx`
//! feature, `onnx` imports ONNX models as networks of such graphs.

#![warn(missing_docs)]

#[cfg(feature = "dsl")]
pub mod dsl;
pub mod expr;
pub mod graph;
pub mod interp;
pub mod limits;
pub mod merge;
#[cfg(feature = "onnx")]
pub mod onnx;
pub mod ops;

pub use expr::{BinaryOp, CmpOp, DType, Expr, TensorRef, UnaryOp};
pub use graph::{load, Graph, GraphBuilder, GraphError, Placeholder, ReduceOp, Reduction, Stage};
