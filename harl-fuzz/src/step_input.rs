//! The structure-aware input of the steps target: a mirror of [`Step`] that [`arbitrary`]
//! decodes from the fuzzer's bytes, with numbers biased toward what a schedule really holds.
//!
//! Random bytes decoded as plain `usize`s would almost never name an existing stage or loop, so
//! almost every schedule would fail at its first step. [`Num`] spends most of its values on
//! small indices and tile sizes, and the rest on the values that break arithmetic (0, 2^32,
//! `usize::MAX`, ...). A base schedule (the graph's default one, possibly edited) starts many
//! inputs from a schedule that lowers, so the fuzzer explores the steps after a realistic prefix.

use arbitrary::{Arbitrary, Result, Unstructured};
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::schedule::{Schedule, Step};
use harl_te::Graph;

/// A number for a step field: mostly small, sometimes a power of two up to 2^16, sometimes a
/// value at an arithmetic edge.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Num(pub usize);

/// Values that overflow products, shifts, `as i64`/`as u32` conversions or allocations.
const EDGES: [usize; 12] = [
    0,
    1,
    usize::MAX,
    usize::MAX - 1,
    usize::MAX / 2 + 1,
    isize::MAX as usize,
    1 << 32,
    (1 << 32) + 1,
    u32::MAX as usize,
    i32::MAX as usize,
    (i32::MAX as usize) + 1,
    1 << 20,
];

impl<'a> Arbitrary<'a> for Num {
    fn arbitrary(u: &mut Unstructured<'a>) -> Result<Self> {
        let tag = u8::arbitrary(u)?;
        Ok(Num(match tag {
            // Stage and loop indices, small factors.
            0..=159 => usize::from(tag % 8),
            // Tile sizes: powers of two up to 2^16.
            160..=215 => 1 << (tag % 17),
            // Any moderate value (odd factors, extents plus one).
            216..=235 => u.int_in_range(0..=4096)?,
            236..=247 => EDGES[usize::from(tag - 236)],
            _ => usize::arbitrary(u)?,
        }))
    }

    fn size_hint(_depth: usize) -> (usize, Option<usize>) {
        (1, Some(1 + std::mem::size_of::<usize>()))
    }
}

/// An order field (reorder, cache_read): either arbitrary numbers or a valid permutation.
#[derive(Clone, Debug, Arbitrary)]
pub enum Order {
    /// Any list (duplicates, out-of-range positions, wrong length).
    Raw(Vec<Num>),
    /// A permutation of `0..n % 24`, built by applying the swaps to the identity.
    Perm {
        /// The length, modulo 24.
        n: u8,
        /// Transpositions applied in order (positions modulo the length).
        swaps: Vec<(u8, u8)>,
    },
}

impl Order {
    fn build(&self) -> Vec<usize> {
        match self {
            Order::Raw(v) => v.iter().map(|n| n.0).collect(),
            Order::Perm { n, swaps } => {
                let n = usize::from(*n % 24);
                let mut order: Vec<usize> = (0..n).collect();
                if n > 0 {
                    for &(a, b) in swaps {
                        order.swap(usize::from(a) % n, usize::from(b) % n);
                    }
                }
                order
            }
        }
    }
}

/// Mirror of [`Step`], variant for variant.
#[derive(Clone, Debug, Arbitrary)]
#[allow(missing_docs)] // Fields mean what they mean on `Step`.
pub enum FuzzStep {
    Split {
        stage: Num,
        at: Num,
        factors: Vec<Num>,
    },
    Reorder {
        stage: Num,
        order: Order,
    },
    Fuse {
        stage: Num,
        at: Num,
    },
    ComputeAt {
        stage: Num,
        target: Num,
        at: Num,
    },
    ComputeWithin {
        stage: Num,
        target: Num,
        at: Num,
    },
    PackAt {
        stage: Num,
        target: Num,
        at: Num,
    },
    ComputeInline {
        stage: Num,
    },
    Slide {
        stage: Num,
    },
    CacheWrite {
        stage: Num,
        at: Num,
    },
    Rfactor {
        stage: Num,
        factor: Num,
    },
    CacheRead {
        stage: Num,
        input: Num,
        order: Order,
        panel: Option<Num>,
    },
    Parallel {
        stage: Num,
        at: Num,
    },
    Vectorize {
        stage: Num,
        at: Num,
    },
    Unroll {
        stage: Num,
        at: Num,
    },
    SharedRead {
        stage: Num,
        input: Num,
        at: Num,
    },
    BindBlock {
        stage: Num,
        at: Num,
    },
    BindThread {
        stage: Num,
        at: Num,
    },
}

impl FuzzStep {
    /// The real step.
    pub fn build(&self) -> Step {
        match self {
            FuzzStep::Split { stage, at, factors } => Step::Split {
                stage: stage.0,
                at: at.0,
                factors: factors.iter().map(|f| f.0).collect(),
            },
            FuzzStep::Reorder { stage, order } => Step::Reorder {
                stage: stage.0,
                order: order.build(),
            },
            FuzzStep::Fuse { stage, at } => Step::Fuse {
                stage: stage.0,
                at: at.0,
            },
            FuzzStep::ComputeAt { stage, target, at } => Step::ComputeAt {
                stage: stage.0,
                target: target.0,
                at: at.0,
            },
            FuzzStep::ComputeWithin { stage, target, at } => Step::ComputeWithin {
                stage: stage.0,
                target: target.0,
                at: at.0,
            },
            FuzzStep::PackAt { stage, target, at } => Step::PackAt {
                stage: stage.0,
                target: target.0,
                at: at.0,
            },
            FuzzStep::ComputeInline { stage } => Step::ComputeInline { stage: stage.0 },
            FuzzStep::Slide { stage } => Step::Slide { stage: stage.0 },
            FuzzStep::CacheWrite { stage, at } => Step::CacheWrite {
                stage: stage.0,
                at: at.0,
            },
            FuzzStep::Rfactor { stage, factor } => Step::Rfactor {
                stage: stage.0,
                factor: factor.0,
            },
            FuzzStep::CacheRead {
                stage,
                input,
                order,
                panel,
            } => Step::CacheRead {
                stage: stage.0,
                input: input.0,
                order: order.build(),
                panel: panel.map(|p| p.0),
            },
            FuzzStep::Parallel { stage, at } => Step::Parallel {
                stage: stage.0,
                at: at.0,
            },
            FuzzStep::Vectorize { stage, at } => Step::Vectorize {
                stage: stage.0,
                at: at.0,
            },
            FuzzStep::Unroll { stage, at } => Step::Unroll {
                stage: stage.0,
                at: at.0,
            },
            FuzzStep::SharedRead { stage, input, at } => Step::SharedRead {
                stage: stage.0,
                input: input.0,
                at: at.0,
            },
            FuzzStep::BindBlock { stage, at } => Step::BindBlock {
                stage: stage.0,
                at: at.0,
            },
            FuzzStep::BindThread { stage, at } => Step::BindThread {
                stage: stage.0,
                at: at.0,
            },
        }
    }
}

/// The CPUs a default schedule can be planned for (the ones `Builder` plans for, and the
/// portable fallback). Not fuzzed beyond these: a `CpuTarget` comes from probing the build host,
/// never from untrusted data.
#[derive(Clone, Copy, Debug, Arbitrary)]
pub enum FuzzTarget {
    /// [`CpuTarget::portable`].
    Portable,
    /// 64-byte vectors, 16 accumulator registers.
    Avx512,
    /// 32-byte vectors, 12 accumulator registers.
    Avx2,
    /// 16-byte vectors, one thread.
    Narrow,
}

impl FuzzTarget {
    fn cpu(self) -> CpuTarget {
        let (vector_bytes, acc_registers, vector_registers, threads) = match self {
            FuzzTarget::Portable => return CpuTarget::portable(),
            FuzzTarget::Avx512 => (64, 16, 32, 8),
            FuzzTarget::Avx2 => (32, 12, 16, 4),
            FuzzTarget::Narrow => (16, 12, 16, 1),
        };
        CpuTarget {
            vector_bytes,
            acc_registers,
            vector_registers,
            threads,
        }
    }
}

/// One edit of a base schedule's step list (positions modulo its length).
#[derive(Clone, Debug, Arbitrary)]
#[allow(missing_docs)]
pub enum Edit {
    Remove(Num),
    Insert(Num, FuzzStep),
    Replace(Num, FuzzStep),
    Swap(Num, Num),
    Truncate(Num),
}

/// Where the schedule starts before [`StepsInput::steps`] are appended.
#[derive(Clone, Debug, Arbitrary)]
pub enum Base {
    /// No steps.
    Naive,
    /// The graph's default schedule for a target.
    Default(FuzzTarget),
    /// The default schedule with edits applied.
    Edited(FuzzTarget, Vec<Edit>),
}

/// The whole input of the steps target.
#[derive(Clone, Debug, Arbitrary)]
pub struct StepsInput {
    /// Which graph (modulo the list's length).
    pub graph: u8,
    /// The starting schedule.
    pub base: Base,
    /// Steps appended after the base.
    pub steps: Vec<FuzzStep>,
}

impl StepsInput {
    /// The schedule this input describes for `graph`.
    pub fn schedule(&self, graph: &Graph) -> Schedule {
        let mut steps = match &self.base {
            Base::Naive => Vec::new(),
            Base::Default(t) => default_schedule(graph, &t.cpu()).steps,
            Base::Edited(t, edits) => {
                let mut steps = default_schedule(graph, &t.cpu()).steps;
                for e in edits {
                    apply(&mut steps, e);
                }
                steps
            }
        };
        steps.extend(self.steps.iter().map(FuzzStep::build));
        Schedule { steps }
    }
}

fn apply(steps: &mut Vec<Step>, edit: &Edit) {
    let n = steps.len();
    match edit {
        Edit::Remove(i) if n > 0 => {
            steps.remove(i.0 % n);
        }
        Edit::Insert(i, s) => steps.insert(i.0 % (n + 1), s.build()),
        Edit::Replace(i, s) if n > 0 => steps[i.0 % n] = s.build(),
        Edit::Swap(a, b) if n > 0 => steps.swap(a.0 % n, b.0 % n),
        Edit::Truncate(i) => steps.truncate(i.0 % (n + 1)),
        _ => {}
    }
}
