//! Targets, in one place: the ISA [`Variant`]s kernels are emitted in, the [`CpuTarget`] plan
//! (vector width, registers, threads) each implies, and the [`TargetFingerprint`] of the machine
//! a tuning record was measured on, with its ISA class (one cache file per class).

mod cpu;
mod fingerprint;
mod variant;

pub use cpu::CpuTarget;
pub use fingerprint::*;
pub use variant::Variant;
