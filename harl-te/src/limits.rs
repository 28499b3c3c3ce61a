//! The limits every graph must stay within, checked by [`Graph::validate`](crate::Graph::validate)
//! (and so by the DSL and by `Builder::kernel`, which both validate).
//!
//! Why limits at all: shapes come from user input (a `#[harl::kernel]` attribute, a graph built in
//! a build script) and every later pass multiplies them: element counts, strides, loop-nest
//! iterations, byte offsets, split factors that round extents up. An unchecked product that
//! wraps turns a safe length check into an out-of-bounds access (a `Tensor<f32, N, N>` with
//! `N = 2^32` has `N * N == 0` in 64-bit arithmetic), and deep expressions overflow the stack of
//! the recursive passes (validation, the interpreter, hashing, codegen) inside a proc macro.
//!
//! How they were chosen: far above any real model, yet leaving a wide margin inside a 64-bit
//! `usize` so that the passes after validation can multiply without thinking about it.
//!
//! - An extent is at most [`MAX_EXTENT`] (`i32::MAX`): axes and index arithmetic are `i32` in
//!   the te semantics (the interpreter wraps at 32 bits), so a larger extent could not be
//!   indexed.
//! - A tensor has at most [`MAX_TENSOR_ELEMS`] = 2^34 elements (64 GiB of f32, 128 GiB of f64):
//!   times 8 bytes per element that is 2^37, and its flat offsets and strides all fit in
//!   2^34 with 2^29 to spare.
//! - One stage iterates at most [`MAX_DOMAIN`] = 2^46 points (spatial times reduce extents;
//!   a 32768^3 GEMM is 2^45). Every product of a subset of a stage's extents (a stride, a
//!   tile, a loop nest) is then below 2^46, 2^18 under `usize::MAX`; harl-build bounds a
//!   scheduled nest at 2^48 iterations, which leaves splits that round extents up a factor of
//!   4 of headroom.
//! - [`MAX_RANK`] dimensions per tensor and reduce axes per stage; [`MAX_STAGES`] stages and
//!   [`MAX_INPUTS`] inputs per graph; [`MAX_EXPR_NODES`] nodes and [`MAX_EXPR_DEPTH`] nesting
//!   per stage body. The depth bound is what keeps the recursive passes within a proc macro's
//!   stack: each level costs a few hundred bytes per pass, so 256 levels is well under 1 MiB.

/// Largest extent of one dimension or iteration axis (axes are `i32` values).
pub const MAX_EXTENT: usize = i32::MAX as usize;

/// Most elements of one tensor (input or stage output): 2^34.
pub const MAX_TENSOR_ELEMS: usize = 1 << 34;

/// Most iterations of one stage: the product of its spatial and reduce extents, 2^46.
pub const MAX_DOMAIN: usize = 1 << 46;

/// Most dimensions of one tensor, and most reduce axes of one stage.
pub const MAX_RANK: usize = 16;

/// Most compute stages of one graph.
pub const MAX_STAGES: usize = 4096;

/// Most inputs (placeholders) of one graph.
pub const MAX_INPUTS: usize = 1024;

/// Most expression nodes in one stage body.
pub const MAX_EXPR_NODES: usize = 1 << 16;

/// Deepest nesting of one stage body (a leaf alone has depth 1).
pub const MAX_EXPR_DEPTH: usize = 256;

/// Most tokens of one `#[harl::kernel]` item (a real kernel has a few hundred). syn parses a
/// left-associated chain `a + a + ...` into a tree as deep as the chain, and builds, prints
/// and drops it recursively, so the item's length bounds that depth.
pub const MAX_KERNEL_TOKENS: usize = 1 << 12;

/// Deepest nesting of `()`, `[]` and `{}` groups in one kernel item; syn recurses once per
/// group (about 10 KiB of stack per level in a debug build).
pub const MAX_TOKEN_NESTING: usize = 64;

/// Longest run of prefix-operator punctuation (`- - - x`, `!!!x`) in one kernel item; syn
/// recurses once per unary operator.
pub const MAX_PUNCT_RUN: usize = 64;

/// Checked product of extents: `None` if it overflows `usize`.
pub fn checked_product(extents: &[usize]) -> Option<usize> {
    extents
        .iter()
        .try_fold(1usize, |acc, &n| acc.checked_mul(n))
}
