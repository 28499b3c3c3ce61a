//! Search spaces: what schedules a task can take. [`cpu`] is Ansor's sketch space (multi-level
//! tiling, inlining, rfactor, layout sketches) with its parameters; [`gpu`] is the GPU sketch
//! (whose structure lives in harl-build, because the build emits its default schedule).
//!
//! A [`SearchSpace`] is all that CPU and GPU differ in: the tuning loop
//! ([`crate::tuner`]), the strategies ([`crate::strategy`]), the measurer trait and the cost
//! models serve both. HARL's episode is written once; each space gives it a [`Moves`] layout
//! of its parameters.

pub mod cpu;
pub mod gpu;

pub use cpu::CpuSpace;
pub use gpu::GpuSpace;

use harl_build::rng::Rng;
use harl_build::schedule::Schedule;
use harl_te::Graph;
use std::fmt::Debug;
use std::hash::Hash;

/// The schedules of one task: sketches (structures) and the parameters that fill them.
pub trait SearchSpace {
    /// A complete parameter set of one sketch.
    type Params: Clone + Debug + Eq + Hash;
    /// HARL's view of one sketch's parameters.
    type Moves: Moves<Self>;

    /// The graph every schedule of the space schedules.
    fn graph(&self) -> &Graph;
    /// How many sketches the space has (0: nothing to search).
    fn sketch_count(&self) -> usize;
    /// The sketch `params` fill.
    fn sketch_of(&self, params: &Self::Params) -> usize;
    /// A random complete parameter set of sketch `sketch` (`sketch < sketch_count()`).
    fn sample(&self, sketch: usize, rng: &mut Rng) -> Self::Params;
    /// A random neighbour of `params` in its sketch.
    fn mutate(&self, params: &Self::Params, rng: &mut Rng) -> Self::Params;
    /// The schedule `params` give, or `None` if they give no valid one.
    fn to_schedule(&self, params: &Self::Params) -> Option<Schedule>;
    /// The points of the space nearest the default schedule, measured first so that a search
    /// starts where the untuned build is.
    fn defaults(&self) -> Vec<Self::Params>;
    /// The move layout of sketch `sketch`, for HARL's agent.
    fn moves(&self, sketch: usize) -> Self::Moves;
}

/// How HARL's agent sees and changes one sketch's parameters: its action heads (each with a
/// no-op at 0), its state encoding, and the move each action makes.
pub trait Moves<S: SearchSpace + ?Sized> {
    /// Choices per action head (each head's action 0 is a no-op).
    fn heads(&self) -> Vec<usize>;
    /// Length of [`Moves::encode`]'s vector.
    fn state_dim(&self) -> usize;
    /// The agent's state: the normalised parameters and the cost model's score.
    fn encode(&self, params: &S::Params, score: f64) -> Vec<f32>;
    /// Applies one action per head, each only if legal (an illegal move is a no-op).
    fn apply(&self, space: &S, params: &S::Params, action: &[usize]) -> S::Params;
}
