//! The kernel DSL.
