//! The limits that make a schedule (or a cache file) from someone else's crate release safe to
//! replay: each bounds work or memory that hostile data could otherwise make unbounded.
//!
//! A record over any limit is rejected exactly like a corrupt one: a warning naming the limit,
//! and the next-best record or the default schedule. No real schedule comes near them: the
//! tuner's sketches write tens of steps, split into at most four factors, and nest under
//! twenty loops per stage; the op library's kernels emit a few hundred kilobytes of Rust at most.
//! Shapes have their own limits in [`harl_te::limits`], which keep every product of extents
//! inside `usize` (arithmetic on sizes is checked here as well).

/// Steps in one schedule. Each step costs a replay, and some a pass over the stage's loops.
pub const MAX_STEPS: usize = 4096;
/// Factors of one split step (a split makes `factors + 1` loops).
pub const MAX_SPLIT_FACTORS: usize = 16;
/// Loops of one stage after any step: bounds the emitted nest's depth (emission recurses once
/// per loop) and the size of its source.
pub const MAX_LOOPS_PER_STAGE: usize = 64;
/// Iterations of one stage's whole loop nest (the product of its loops' extents, remainders
/// included). Splits that do not divide an extent round it up, so a nest can exceed its
/// stage's domain; bounding the product keeps every extent, stride and tile size of the
/// nest (each a product of a subset) inside `usize`.
pub const MAX_NEST_ITERATIONS: usize = 1 << 48;

/// Stages one schedule may add (each rfactor and cache_read adds one, with a buffer and a pass
/// over it): a chain of thousands of copies would lower in seconds and run that many passes.
pub const MAX_ADDED_STAGES: usize = 32;
/// Expression nodes of one stage's body after inlining: inlining a producer copies its body
/// into every load of it, so a chain of stages that each read the previous one twice would
/// double the body per stage.
pub const MAX_BODY_NODES: usize = 1 << 16;
/// Nesting depth of one stage's body after inlining (an inlined body nests inside its
/// consumer's): the same bound as a declared body's. Lowering, partitioning and codegen
/// recurse once per level, and a level of codegen's expression emitter takes about 5 KiB of
/// stack in a debug build, so 256 levels stay under 1.5 MiB, inside the 2 MiB of a spawned
/// thread.
pub const MAX_BODY_DEPTH: usize = harl_te::limits::MAX_EXPR_DEPTH;
/// Elements of scratch (the buffers of intermediate stages, including those rfactor and
/// cache_read add) one call may allocate, as a multiple of the kernel's largest declared
/// tensor, with [`MIN_SCRATCH_ELEMS`] allowed whatever the kernel. An rfactor of a large
/// reduction multiplies its output by the factor; a record may not make the user's binary
/// allocate gigabytes per call.
pub const MAX_SCRATCH_FACTOR: usize = 16;
/// Scratch elements always allowed (small kernels with wide rfactors).
pub const MIN_SCRATCH_ELEMS: usize = 1 << 22;
/// Bytes of generated Rust for one kernel (all its ISA variants). Unrolling multiplies source
/// size; the codegen keeps an unrolled loop a loop past 64 KiB, and this is the backstop.
pub const MAX_SOURCE_BYTES: usize = 16 << 20;
/// Bytes of one tuning-cache file. A larger file is not read at all (one warning).
pub const MAX_CACHE_FILE_BYTES: u64 = 64 << 20;
/// Records of one workload a lookup validates (best first) before it gives up: validation
/// replays the schedule, and a file may hold a million copies of a failing record.
pub const MAX_VALIDATIONS: usize = 32;
/// Warnings one lookup reports about a file; the rest are counted in one more line.
pub const MAX_LOOKUP_WARNINGS: usize = 16;
/// Bytes of one line of a cache file. A longer line is skipped unparsed.
pub const MAX_RECORD_LINE_BYTES: usize = 1 << 20;
