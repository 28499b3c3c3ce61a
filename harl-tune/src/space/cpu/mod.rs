//! The search space: sketches (loop structures made by rules, as in Ansor) and their parameters.
//!
//! [`generate_sketches`] derives, from the graph alone, one or more *sketches* per task. A sketch
//! fixes the structure of every stage (inlined, fused as an epilogue, multi-level tiled, factored
//! with rfactor, or a simple nest); [`Params`] fill in what it leaves open (tile sizes, the
//! accumulator / epilogue position, how many outer loops run in parallel, the unroll depth and the
//! vector width). [`Sketch::to_schedule`] turns a sketch and its parameters into the validated
//! [`Schedule`] that lowering replays.
//!
//! The rules, for the CPU:
//! 1. Elementwise producers without a select are inlined; stages with selects (padding) and the
//!    output stay materialised.
//! 2. A reduction whose output's last axis is read along the last dimension of some operand, and
//!    that reuses data (some operand does not depend on some spatial axis, as in a GEMM or a
//!    convolution; not a row reduction), is tiled "SSRSRS": every spatial axis in four levels
//!    `S0 S1 S2 S3`, every reduce axis in two
//!    `R0 R1`, in the loop order `S0.. S1.. R0.. S2.. R1.. S3..`. Three variants: with a register
//!    accumulator (`cache_write`) at the end of `S1` or `S2`; the same with the elementwise
//!    consumer fused as an epilogue at the end of `S0` or `S1` (when there is one); and without
//!    an accumulator.
//!    A fourth variant, for a tiled stage whose last axis reads an operand with a stride (a
//!    strided convolution, whose vector loop over output columns would gather every other input
//!    element): vectorise instead a spatial axis that indexes a whole dimension of a graph
//!    input no other operand depends on (the filter axis), reading that input through a
//!    `cache_read` copy with the dimension moved last, with a register accumulator at the end
//!    of `S1` or `S2`. The vector loop then loads contiguous filter rows and broadcasts the
//!    input, as hand-written first-layer convolutions do.
//! 3. A reduction with little output parallelism (under 64 elements per thread) and a long
//!    reduction (32 or more, first reduce extent not prime) also gets an `rfactor` variant: the
//!    partials axis is split in two, its outer part runs in parallel with the outer spatial
//!    loops and its inner part is vectorised innermost, in a register accumulator; the final
//!    reduction of the partials is a simple nest.
//! 4. Every other stage is a simple nest: its outer spatial loops fused and run in parallel, the
//!    last spatial axis (of an elementwise stage) split by the vector width and vectorised.
//! 5. Last, the `default` sketch ([`DEFAULT_SKETCH`]): the default schedule's own structure
//!    (weight panels, layouts, row chains, epilogues), its register and cache tiles open. Its
//!    seed is the default schedule itself, so the search can always move from where an untuned
//!    build is, which the rule sketches cannot express in full.
//!
//! A graph with several stages gets the cartesian product of the stages' choices (at most 16
//! sketches). The scalar knobs apply to every root stage of a sketch, each stage taking what it
//! can use: `parallel` fuses `min(parallel, what the stage allows)` outer loops, so a large value
//! is a no-op on a stage with few loops (and two parameter sets can give the same schedule; the
//! moves and mutations never return such a no-op). The knobs only choose among legal structures:
//! a [`Params`] that [`Sketch::to_schedule`] accepts always lowers.

mod base;
mod moves;

pub use base::DEFAULT_SKETCH;
pub use moves::CpuMoves;

use crate::space::SearchSpace;
use harl_build::default_schedule::{guarded_axes, plan_tiles, CpuTarget};
use harl_build::layout::{copy_steps, layout_choice, panel_layout, Layout};
use harl_build::lower::{lower, ScheduleError, MAX_ACC_ELEMS, MAX_UNROLL};
use harl_build::rng::Rng;
use harl_build::schedule::{Schedule, Step};
use harl_te::{DType, Expr, Graph, TensorRef};
use serde::{Deserialize, Serialize};

/// The unroll depths the `unroll` knob indexes, as Ansor's `auto_unroll_max_step`: loops are
/// unrolled from the innermost outwards while their cumulative trip count stays within it.
pub const UNROLL_STEPS: [usize; 4] = [0, 16, 64, 512];
// Every unrolled loop is within the deepest step, so lowering always accepts it.
const _: () = assert!(UNROLL_STEPS[UNROLL_STEPS.len() - 1] <= MAX_UNROLL);

/// Largest vector loop a sketch offers (elements).
const MAX_VECTOR: usize = 64;
/// Innermost tile levels are sampled at most this large (Ansor's `max_innermost_split_factor`).
const MAX_INNER_TILE: usize = 64;
/// A reduction this long (product of reduce extents) or longer may be factored with rfactor.
const RFACTOR_MIN_REDUCE: usize = 32;
/// ... when its output has fewer than this many elements per thread.
const RFACTOR_MAX_SPACE_PER_THREAD: usize = 64;
/// At most this many sketches per task (the first ones in rule order are kept).
const MAX_SKETCHES: usize = 16;
/// How often a sampled tiling gets a factor that does not divide its extent (remainder guards).
const NON_DIVIDING_CHANCE: f64 = 0.1;
/// Sampling attempts before falling back to a safe parameter set.
const SAMPLE_ATTEMPTS: usize = 64;
/// Mutation attempts before giving up and returning the input.
const MUTATE_ATTEMPTS: usize = 64;

/// One subgraph to tune, with its weight (how many times the network runs it).
#[derive(Clone, Debug)]
pub struct Task {
    /// A name for reports.
    pub name: String,
    /// The subgraph.
    pub graph: Graph,
    /// How many times one run of the network executes it.
    pub weight: f64,
}

impl Task {
    /// A task of weight `weight`.
    pub fn new(name: impl Into<String>, graph: Graph, weight: f64) -> Self {
        Task {
            name: name.into(),
            graph,
            weight,
        }
    }

    /// The workload key that identifies the task in the cache (the graph's).
    pub fn key(&self) -> String {
        self.graph.workload_key()
    }
}

/// A task's CPU search space: its sketches, and the default schedule's counterpart in each.
pub struct CpuSpace {
    graph: Graph,
    sketches: Vec<Sketch>,
    defaults: Vec<Params>,
}

impl CpuSpace {
    /// The sketches of `graph` for `target` ([`generate_sketches`]).
    pub fn new(graph: &Graph, target: &CpuTarget) -> Self {
        let sketches = generate_sketches(graph, target);
        let defaults = sketches
            .iter()
            .enumerate()
            .filter_map(|(i, s)| s.default_params(i, target))
            .collect();
        CpuSpace {
            graph: graph.clone(),
            sketches,
            defaults,
        }
    }

    /// The sketches, in rule order (a [`Params::sketch`] indexes them).
    pub fn sketches(&self) -> &[Sketch] {
        &self.sketches
    }
}

impl SearchSpace for CpuSpace {
    type Params = Params;
    type Moves = CpuMoves;

    fn graph(&self) -> &Graph {
        &self.graph
    }
    fn sketch_count(&self) -> usize {
        self.sketches.len()
    }
    fn sketch_of(&self, params: &Params) -> usize {
        params.sketch
    }
    fn sample(&self, sketch: usize, rng: &mut Rng) -> Params {
        self.sketches[sketch].sample(sketch, rng)
    }
    fn mutate(&self, params: &Params, rng: &mut Rng) -> Params {
        match self.sketches.get(params.sketch) {
            Some(s) => s.mutate(params, rng),
            None => params.clone(),
        }
    }
    fn to_schedule(&self, params: &Params) -> Option<Schedule> {
        self.sketches.get(params.sketch)?.to_schedule(params).ok()
    }
    fn defaults(&self) -> Vec<Params> {
        self.defaults.clone()
    }
    fn moves(&self, sketch: usize) -> CpuMoves {
        CpuMoves::new(&self.sketches[sketch])
    }
}

/// A complete parameter set for one sketch of a task.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Params {
    /// Index of the sketch in the task's sketch list (bookkeeping for the caller; the sketch
    /// that receives the params does not check it).
    pub sketch: usize,
    /// Per tiled axis ([`Knobs::tiled_axes`]): the inner level extents, outer to inner; the
    /// outermost level is `ceil(extent / product)`. Four spatial levels give three numbers.
    /// Axes come stage by stage: a tiled stage's spatial axes (`S1 S2 S3`) then its reduce
    /// axes (`R1`); an rfactor stage's reduction as `[outer partials, inner partials]` (their
    /// product, the rfactor factor, must divide the extent).
    pub tiles: Vec<Vec<usize>>,
    /// Index into the sketch's accumulator / epilogue positions ([`Knobs::compute_at_choices`]),
    /// sorted by depth: with an accumulator only, `[end of S1, end of S2]`; with an epilogue
    /// too, (epilogue, accumulator) at `[(S0, S1), (S0, S2), (S1, S1), (S1, S2)]`.
    pub compute_at: usize,
    /// How many outermost loops are fused and run in parallel (0: serial), per root stage at
    /// most what the stage allows.
    pub parallel: usize,
    /// Index into [`UNROLL_STEPS`].
    pub unroll: usize,
    /// Index into the sketch's vector widths (0: no vectorisation). Width `w` vectorises a
    /// tiled stage's innermost tile (`S3` of the last axis) when it has `2..=w` elements and
    /// the axis is split without remainder, an elementwise stage's last axis split by its
    /// largest divisor within `w`, and an rfactor's inner partials when `2..=w`.
    pub vector: usize,
}

/// The size of each sub-space of a sketch (RL action spaces, mutation ranges).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Knobs {
    /// Per tiled axis: (extent, number of levels including the derived outermost one).
    pub tiled_axes: Vec<(usize, usize)>,
    /// Number of accumulator / epilogue positions (1 when there is nothing to choose).
    pub compute_at_choices: usize,
    /// Largest useful `parallel` value.
    pub parallel_max: usize,
    /// Number of unroll depths ([`UNROLL_STEPS`]).
    pub unroll_choices: usize,
    /// Number of vector choices, "none" included.
    pub vector_choices: usize,
}

/// What a sketch does with one stage of the graph.
#[derive(Clone, Debug, PartialEq)]
enum Plan {
    /// Inlined into its consumers.
    Inline,
    /// Computed inside a tiled producer's loops.
    Epilogue,
    /// A plain nest with annotations.
    Simple,
    /// SSRSRS multi-level tiling; `first_axis` indexes the params' tiles (spatial axes, then
    /// reduce axes).
    Tiled {
        cache_write: bool,
        epilogue: Option<usize>,
        first_axis: usize,
        layout: Option<Layout>,
    },
    /// Rfactor on the first reduce axis, with the partials axis split (tiles entry `axis`).
    Rfactor { axis: usize },
}

/// One tiled axis of the sketch.
#[derive(Clone, Debug)]
struct TiledAxis {
    extent: usize,
    /// Levels, including the derived outermost.
    levels: usize,
    /// The rfactor partials axis: the product must divide the extent and lie in `2..extent`.
    rfactor: bool,
}

/// An accumulator / epilogue position choice: the accumulator block at the end of level
/// `acc` (1: S1, 2: S2) and the epilogue at the end of level `epi` (0: S0, 1: S1).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Attach {
    acc: usize,
    epi: Option<usize>,
}

/// A loop structure made by the sketch rules, with its parameters left open.
#[derive(Clone, Debug)]
pub struct Sketch {
    name: String,
    graph: Graph,
    plans: Vec<Plan>,
    axes: Vec<TiledAxis>,
    attach: Vec<Attach>,
    widths: Vec<usize>,
    parallel_max: usize,
    /// The default schedule's structure, for the default sketch ([`DEFAULT_SKETCH`]).
    base: Option<base::Base>,
}

/// The sketches of `graph` for `target`, in rule order (at least one for a valid graph; none for
/// an invalid one).
pub fn generate_sketches(graph: &Graph, target: &CpuTarget) -> Vec<Sketch> {
    if graph.validate().is_err() {
        return vec![];
    }
    let n = graph.stages.len();
    let inlined: Vec<bool> = (0..n)
        .map(|s| {
            s + 1 < n && graph.stages[s].reduce.is_none() && !has_select(&graph.stages[s].body)
        })
        .collect();
    // The structural options of each stage, best guess first.
    let options: Vec<Vec<Plan>> = (0..n)
        .map(|s| {
            if inlined[s] {
                return vec![Plan::Inline];
            }
            let stage = &graph.stages[s];
            if stage.reduce.is_none() {
                return vec![Plan::Simple];
            }
            let tiled = tileable(graph, s);
            let mut v = Vec::new();
            if tiled {
                let tile = |cache_write, epilogue, layout| Plan::Tiled {
                    cache_write,
                    epilogue,
                    first_axis: 0,
                    layout,
                };
                v.push(tile(true, None, None));
                if let Some(c) = epilogue_consumer(graph, s, &inlined) {
                    v.push(tile(true, Some(c), None));
                }
                v.push(tile(false, None, None));
                if let Some(l) = layout_choice(graph, s, target) {
                    v.push(tile(true, None, Some(l)));
                }
            } else {
                v.push(Plan::Simple);
            }
            if rfactor_fits(graph, s, target, tiled) {
                v.push(Plan::Rfactor { axis: 0 });
            }
            v
        })
        .collect();
    let mut combos = Vec::new();
    enumerate(&options, &mut vec![], &mut combos);
    // Name rules by stage when more than one stage has a structural choice.
    let qualify = options
        .iter()
        .filter(|o| o.len() > 1 || o.iter().any(|p| !matches!(p, Plan::Simple | Plan::Inline)))
        .count()
        > 1;
    let lanes = (target.vector_bytes / elem_bytes(graph.stages[n - 1].dtype)).max(1);
    let mut widths: Vec<usize> = [lanes, 2 * lanes, 4 * lanes]
        .into_iter()
        .filter(|&w| (2..=MAX_VECTOR).contains(&w))
        .collect();
    widths.dedup();
    combos
        .into_iter()
        .take(MAX_SKETCHES)
        .map(|plans| Sketch::new(graph, plans, widths.clone(), qualify))
        .chain(Sketch::default_form(graph, target))
        .collect()
}

/// Cartesian product of the options, in order; an epilogue choice claims its consumer.
fn enumerate(options: &[Vec<Plan>], cur: &mut Vec<Plan>, out: &mut Vec<Vec<Plan>>) {
    if out.len() >= MAX_SKETCHES {
        return;
    }
    let s = cur.len();
    if s == options.len() {
        out.push(cur.clone());
        return;
    }
    let claimed = cur.iter().any(|p| {
        matches!(p, Plan::Tiled {
            epilogue: Some(c),
            ..
        } if *c == s)
    });
    if claimed {
        cur.push(Plan::Epilogue);
        enumerate(options, cur, out);
        cur.pop();
        return;
    }
    for p in &options[s] {
        cur.push(p.clone());
        enumerate(options, cur, out);
        cur.pop();
    }
}

impl Sketch {
    fn new(graph: &Graph, mut plans: Vec<Plan>, widths: Vec<usize>, qualify: bool) -> Self {
        let mut axes = Vec::new();
        let mut parallel_max = 0;
        let mut any_cw = false;
        let mut any_epi = false;
        for (s, plan) in plans.iter_mut().enumerate() {
            let stage = &graph.stages[s];
            let ns = stage.n_spatial();
            let red = stage.reduce.as_ref().map_or(&[][..], |r| &r.extents[..]);
            match plan {
                Plan::Tiled {
                    first_axis,
                    cache_write,
                    epilogue,
                    ..
                } => {
                    *first_axis = axes.len();
                    any_cw |= *cache_write;
                    any_epi |= epilogue.is_some();
                    for &e in &stage.shape {
                        axes.push(TiledAxis {
                            extent: e,
                            levels: 4,
                            rfactor: false,
                        });
                    }
                    for &e in red {
                        axes.push(TiledAxis {
                            extent: e,
                            levels: 2,
                            rfactor: false,
                        });
                    }
                    parallel_max = parallel_max.max(2 * ns);
                }
                Plan::Rfactor { axis } => {
                    *axis = axes.len();
                    axes.push(TiledAxis {
                        extent: red.first().copied().unwrap_or(1),
                        levels: 3,
                        rfactor: true,
                    });
                    parallel_max = parallel_max.max(ns + 1);
                }
                Plan::Simple => parallel_max = parallel_max.max(ns),
                Plan::Inline | Plan::Epilogue => {}
            }
        }
        // Positions sorted by loop depth (epilogue first, then the accumulator).
        let attach = match (any_cw, any_epi) {
            (true, true) => [(0, 1), (0, 2), (1, 1), (1, 2)]
                .into_iter()
                .map(|(e, a)| Attach {
                    acc: a,
                    epi: Some(e),
                })
                .collect(),
            (true, false) => vec![Attach { acc: 1, epi: None }, Attach { acc: 2, epi: None }],
            _ => vec![Attach { acc: 2, epi: None }],
        };
        let rules: Vec<(String, &str)> = plans
            .iter()
            .zip(&graph.stages)
            .filter_map(|(p, st)| {
                let rule = match p {
                    Plan::Tiled {
                        cache_write: true,
                        epilogue: Some(_),
                        ..
                    } => "tile+cache_write+fuse_epilogue",
                    Plan::Tiled {
                        layout: Some(_), ..
                    } => "tile+cache_read+cache_write",
                    Plan::Tiled {
                        cache_write: true, ..
                    } => "tile+cache_write",
                    Plan::Tiled { .. } => "tile",
                    Plan::Rfactor { .. } => "rfactor",
                    _ => return None,
                };
                Some((rule.to_string(), st.name.as_str()))
            })
            .collect();
        let name = match rules.len() {
            0 => "simple".to_string(),
            1 if !qualify => rules[0].0.clone(),
            _ => rules
                .iter()
                .map(|(r, n)| format!("{r}@{n}"))
                .collect::<Vec<_>>()
                .join("+"),
        };
        Sketch {
            name,
            graph: graph.clone(),
            plans,
            axes,
            attach,
            widths,
            parallel_max,
            base: None,
        }
    }

    /// The sketch's name, from its rules: `tile+cache_write+fuse_epilogue`, `tile+cache_write`,
    /// `tile`, `rfactor`, `simple`, or `rule@stage+...` when several stages have a choice.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The graph the sketch schedules.
    pub fn graph(&self) -> &Graph {
        &self.graph
    }

    /// The sizes of the sketch's sub-spaces.
    pub fn knobs(&self) -> Knobs {
        Knobs {
            tiled_axes: self.axes.iter().map(|a| (a.extent, a.levels)).collect(),
            compute_at_choices: self.attach.len(),
            parallel_max: self.parallel_max,
            unroll_choices: self.unroll_choices(),
            vector_choices: self.widths.len() + 1,
        }
    }

    /// A random complete and valid parameter set, recorded as belonging to sketch `index`.
    /// Tilings are random factorisations, mostly into divisors, sometimes (about one axis in
    /// ten) with a factor that does not divide; the innermost levels stay within 64.
    pub fn sample(&self, index: usize, rng: &mut Rng) -> Params {
        for _ in 0..SAMPLE_ATTEMPTS {
            let p = Params {
                sketch: index,
                tiles: self.axes.iter().map(|a| sample_axis(a, rng)).collect(),
                compute_at: rng.below(self.attach.len()),
                parallel: rng.below(self.parallel_max + 1),
                unroll: rng.below(self.unroll_choices()),
                vector: rng.below(self.widths.len() + 1),
            };
            if self.to_schedule(&p).is_ok() {
                return p;
            }
        }
        self.fallback(index)
    }

    /// A parameter set that is always valid: unit tiles (the smallest factor for rfactor), the
    /// innermost accumulator, no annotation.
    fn fallback(&self, index: usize) -> Params {
        if let Some(b) = &self.base {
            return b.params(index);
        }
        let tiles = self
            .axes
            .iter()
            .map(|a| {
                let mut t = vec![1; a.levels - 1];
                if a.rfactor {
                    if let Some(last) = t.last_mut() {
                        *last = smallest_prime_factor(a.extent).unwrap_or(1);
                    }
                }
                t
            })
            .collect();
        Params {
            sketch: index,
            tiles,
            compute_at: self.attach.len() - 1,
            parallel: 0,
            unroll: 0,
            vector: 0,
        }
    }

    /// The point of this sketch closest to the hand-written default schedule
    /// ([`harl_build::default_schedule`]): for each tiled stage the default's register and cache
    /// tiles (the first reduce axis cache-blocked in `R1`, the other reduce axes whole in `R1`),
    /// the accumulator at the end of `S2`, an epilogue at the end of `S0`; all outer spatial
    /// loops in parallel, the narrowest vector width that covers the register tile, the deepest
    /// unroll. `None` when that point is not a valid schedule of the sketch. The tuner measures
    /// these first, so a search starts where the default is rather than from random samples.
    pub fn default_params(&self, index: usize, target: &CpuTarget) -> Option<Params> {
        let mut p = self.fallback(index);
        if self.base.is_some() {
            // The default sketch's fallback is the default's own tiles.
            return self.to_schedule(&p).ok().map(|_| p);
        }
        let mut register_tile: Option<usize> = None;
        let mut epilogue_level = None;
        for (s, plan) in self.plans.iter().enumerate() {
            let stage = &self.graph.stages[s];
            let ns = stage.n_spatial();
            let red = stage.reduce.as_ref().map_or(&[][..], |r| &r.extents[..]);
            match *plan {
                Plan::Tiled {
                    layout: Some(ref l),
                    first_axis,
                    ..
                } => {
                    // No default schedule has this layout: seed it with the default's tiles
                    // for it (`layout_tiles`), every outer loop parallel.
                    p.parallel = p.parallel.max(ns);
                    for (j, &e) in red.iter().enumerate() {
                        p.tiles[first_axis + ns + j] = vec![e];
                    }
                    let tp = harl_build::default_schedule::layout_tiles(&self.graph, s, target, l);
                    let (nr, mr) = (tp.vec[2], tp.row[2]);
                    p.tiles[first_axis + l.vec_axis] = vec![1, 1, nr];
                    p.tiles[first_axis + ns - 1] = vec![1, 1, mr];
                    if let Some((a, rows)) = tp.block {
                        p.tiles[first_axis + a] = vec![1, 1, rows];
                    }
                    register_tile = Some(register_tile.unwrap_or(0).max(nr));
                }
                Plan::Tiled {
                    first_axis,
                    epilogue,
                    ..
                } => {
                    p.parallel = p.parallel.max(ns);
                    if epilogue.is_some() {
                        epilogue_level = Some(0);
                    }
                    for (j, &e) in red.iter().enumerate() {
                        p.tiles[first_axis + ns + j] = vec![e];
                    }
                    if let Some(tp) = plan_tiles(&self.graph, s, target) {
                        p.tiles[first_axis + tp.vec_axis] = vec![1, tp.vec[1], tp.vec[2]];
                        if let Some(r) = tp.row_axis {
                            p.tiles[first_axis + r] = vec![1, tp.row[1], tp.row[2]];
                        }
                        if !red.is_empty() {
                            p.tiles[first_axis + ns] = vec![tp.red[1]];
                        }
                        register_tile = Some(register_tile.unwrap_or(0).max(tp.vec[2]));
                    }
                }
                Plan::Rfactor { axis } => {
                    let extent = self.axes[axis].extent;
                    let inner = (2..extent)
                        .rev()
                        .find(|&d| d <= MAX_INNER_TILE && extent.is_multiple_of(d))
                        .unwrap_or(1);
                    p.tiles[axis] = vec![1, inner];
                    p.parallel = p.parallel.max(ns + 1);
                }
                Plan::Simple => p.parallel = p.parallel.max(ns),
                Plan::Inline | Plan::Epilogue => {}
            }
        }
        p.parallel = p.parallel.min(self.parallel_max);
        if let Some(i) = self
            .attach
            .iter()
            .position(|a| a.acc == 2 && a.epi == epilogue_level)
        {
            p.compute_at = i;
        }
        let lanes = self.widths.first().copied().unwrap_or(1);
        let want = register_tile.unwrap_or(2 * lanes);
        p.vector = self
            .widths
            .iter()
            .position(|&w| w >= want)
            .map_or(self.widths.len(), |i| i + 1);
        p.unroll = UNROLL_STEPS.len() - 1;
        self.to_schedule(&p).ok().map(|_| p)
    }

    /// The schedule of this sketch with parameters `p`; an error only if `p` is invalid for the
    /// sketch (wrong shape of tiles, a knob out of range, a tiling that overruns its extent or
    /// an accumulator over [`MAX_ACC_ELEMS`]). The result is checked by lowering.
    pub fn to_schedule(&self, p: &Params) -> Result<Schedule, ScheduleError> {
        self.check(p).map_err(|(step, why)| ScheduleError::Step {
            index: 0,
            step,
            why: format!("parameters: {why}"),
        })?;
        if let Some(b) = &self.base {
            return b.schedule(&self.graph, p);
        }
        let schedule = Schedule {
            steps: self.build(p),
        };
        lower(&self.graph, &schedule)?;
        Ok(schedule)
    }

    /// One random valid mutation of `p` (a tile factor moved or an axis resampled, or a new
    /// parallel / unroll / compute-at / vector value) that changes the schedule. Returns `p`
    /// unchanged only when no such mutation was found.
    pub fn mutate(&self, p: &Params, rng: &mut Rng) -> Params {
        let current = self.to_schedule(p).ok();
        for _ in 0..MUTATE_ATTEMPTS {
            let mut q = p.clone();
            match rng.below(5) {
                0 => {
                    if self.axes.is_empty() || q.tiles.len() != self.axes.len() {
                        continue;
                    }
                    let axis = rng.below(self.axes.len());
                    let a = &self.axes[axis];
                    if q.tiles[axis].len() + 1 != a.levels {
                        continue;
                    }
                    if rng.chance(0.2) {
                        q.tiles[axis] = sample_axis(a, rng);
                    } else {
                        let from = rng.below(a.levels);
                        let to = (from + 1 + rng.below(a.levels - 1)) % a.levels;
                        let Some(levels) = full_levels(&q.tiles[axis], a.extent) else {
                            continue;
                        };
                        let primes = factorize(levels[from]);
                        let Some(&f) = rng.pick(&primes) else {
                            continue;
                        };
                        move_factor(&mut q.tiles[axis], from, to, f);
                    }
                }
                1 => q.parallel = rng.below(self.parallel_max + 1),
                2 => q.unroll = rng.below(self.unroll_choices()),
                3 => q.compute_at = rng.below(self.attach.len()),
                _ => q.vector = rng.below(self.widths.len() + 1),
            }
            if q == *p {
                continue;
            }
            if let Ok(s) = self.to_schedule(&q) {
                if current.as_ref() != Some(&s) {
                    return q;
                }
            }
        }
        p.clone()
    }

    /// HARL's tile action: moves the smallest prime factor of level `from` of tiled axis `axis`
    /// to level `to` (level 0 is the derived outermost one). `None` if the move is illegal (no
    /// factor to move, or the result is invalid) or changes nothing.
    pub fn tile_move(&self, p: &Params, axis: usize, from: usize, to: usize) -> Option<Params> {
        let a = self.axes.get(axis)?;
        if from == to || from >= a.levels || to >= a.levels {
            return None;
        }
        let tiles = p.tiles.get(axis).filter(|t| t.len() + 1 == a.levels)?;
        let levels = full_levels(tiles, a.extent)?;
        let f = smallest_prime_factor(levels[from])?;
        let mut q = p.clone();
        move_factor(&mut q.tiles[axis], from, to, f);
        self.moved(p, q)
    }

    /// HARL's compute-at action: moves `delta` positions in the accumulator / epilogue list.
    pub fn step_compute_at(&self, p: &Params, delta: i32) -> Option<Params> {
        let v = shifted(p.compute_at, delta, self.attach.len())?;
        self.moved(
            p,
            Params {
                compute_at: v,
                ..p.clone()
            },
        )
    }

    /// HARL's parallel action: fuses `delta` more (or fewer) outer loops into the parallel loop.
    pub fn step_parallel(&self, p: &Params, delta: i32) -> Option<Params> {
        let v = shifted(p.parallel, delta, self.parallel_max + 1)?;
        self.moved(
            p,
            Params {
                parallel: v,
                ..p.clone()
            },
        )
    }

    /// HARL's unroll action: moves `delta` steps in [`UNROLL_STEPS`].
    pub fn step_unroll(&self, p: &Params, delta: i32) -> Option<Params> {
        let v = shifted(p.unroll, delta, self.unroll_choices())?;
        self.moved(
            p,
            Params {
                unroll: v,
                ..p.clone()
            },
        )
    }

    /// Vector-width action: moves `delta` steps in the sketch's vector choices.
    pub fn step_vector(&self, p: &Params, delta: i32) -> Option<Params> {
        let v = shifted(p.vector, delta, self.widths.len() + 1)?;
        self.moved(
            p,
            Params {
                vector: v,
                ..p.clone()
            },
        )
    }

    /// How many unroll depths the sketch offers: the default sketch keeps the default's.
    fn unroll_choices(&self) -> usize {
        if self.base.is_some() {
            1
        } else {
            UNROLL_STEPS.len()
        }
    }

    /// `Some(q)` if `q` is valid and schedules differently from `p`.
    fn moved(&self, p: &Params, q: Params) -> Option<Params> {
        if q == *p {
            return None;
        }
        let new = self.to_schedule(&q).ok()?;
        (self.to_schedule(p).ok().as_ref() != Some(&new)).then_some(q)
    }

    /// Checks `p` against the sketch; on error, the step the bad knob feeds and why.
    fn check(&self, p: &Params) -> Result<(), (Step, String)> {
        let bad = |step: Step, why: String| Err((step, why));
        if p.tiles.len() != self.axes.len() {
            return bad(
                Step::Split {
                    stage: 0,
                    at: 0,
                    factors: vec![],
                },
                format!(
                    "{} tiled axes given, the sketch has {}",
                    p.tiles.len(),
                    self.axes.len()
                ),
            );
        }
        for (i, (t, a)) in p.tiles.iter().zip(&self.axes).enumerate() {
            let split = || Step::Split {
                stage: 0,
                at: 0,
                factors: t.clone(),
            };
            if t.len() + 1 != a.levels {
                return bad(
                    split(),
                    format!("axis {i} has {} levels, not {}", a.levels, t.len() + 1),
                );
            }
            if t.contains(&0) {
                return bad(split(), format!("axis {i} has a zero tile"));
            }
            let prod = t.iter().try_fold(1usize, |acc, &x| acc.checked_mul(x));
            let Some(prod) = prod.filter(|&p| p <= a.extent) else {
                return bad(
                    split(),
                    format!("tiles of axis {i} exceed its extent {}", a.extent),
                );
            };
            let inner = t.last().copied().unwrap_or(1);
            if a.rfactor && inner > MAX_ACC_ELEMS {
                return bad(
                    Step::CacheWrite { stage: 0, at: 0 },
                    format!("{inner} partials exceed the accumulator limit {MAX_ACC_ELEMS}"),
                );
            }
            if a.rfactor && (prod < 2 || prod >= a.extent || !a.extent.is_multiple_of(prod)) {
                return bad(
                    Step::Rfactor {
                        stage: 0,
                        factor: prod,
                    },
                    format!(
                        "the rfactor factor {prod} must divide {} and lie in 2..{}",
                        a.extent, a.extent
                    ),
                );
            }
        }
        let Some(attach) = self.attach.get(p.compute_at) else {
            return bad(
                Step::CacheWrite { stage: 0, at: 0 },
                format!(
                    "compute_at {} of {} choices",
                    p.compute_at,
                    self.attach.len()
                ),
            );
        };
        for (s, plan) in self.plans.iter().enumerate() {
            if let Plan::Tiled {
                cache_write: true,
                first_axis,
                ..
            } = plan
            {
                let ns = self.graph.stages[s].n_spatial();
                let elems: usize = p.tiles[*first_axis..*first_axis + ns]
                    .iter()
                    .map(|t| t[attach.acc..].iter().product::<usize>())
                    .try_fold(1usize, |acc, x| acc.checked_mul(x))
                    .unwrap_or(usize::MAX);
                if elems > MAX_ACC_ELEMS {
                    return bad(
                        Step::CacheWrite { stage: s, at: 0 },
                        format!("accumulator of {elems} elements exceeds {MAX_ACC_ELEMS}"),
                    );
                }
            }
        }
        if p.parallel > self.parallel_max {
            return bad(
                Step::Parallel { stage: 0, at: 0 },
                format!("parallel {} exceeds {}", p.parallel, self.parallel_max),
            );
        }
        if p.unroll >= self.unroll_choices() {
            return bad(
                Step::Unroll { stage: 0, at: 0 },
                format!("unroll {} of {} choices", p.unroll, self.unroll_choices()),
            );
        }
        if p.vector > self.widths.len() {
            return bad(
                Step::Vectorize { stage: 0, at: 0 },
                format!("vector {} of {} choices", p.vector, self.widths.len() + 1),
            );
        }
        Ok(())
    }

    /// The copy a tiled stage `s` reads a graph input through under `p`: its plan's layout, or
    /// a weight in panels ([`panel_layout`]); panels as wide as `p`'s innermost tile along the
    /// vector axis, so that the vector loop reads one panel contiguously.
    fn copy_layout(&self, s: usize, p: &Params) -> Option<Layout> {
        let Plan::Tiled {
            first_axis,
            ref layout,
            ..
        } = self.plans[s]
        else {
            return None;
        };
        let stage = &self.graph.stages[s];
        let vec_axis = layout
            .as_ref()
            .map_or(stage.n_spatial() - 1, |l| l.vec_axis);
        let inner = p
            .tiles
            .get(first_axis + vec_axis)
            .and_then(|t| t.last().copied())
            .unwrap_or(1);
        let extent = stage.shape[vec_axis];
        match layout {
            Some(l) => Some(Layout {
                panel: l
                    .panel
                    .and(Some(inner))
                    .filter(|&w| w > 1 && w < extent && extent.is_multiple_of(w)),
                ..l.clone()
            }),
            None => panel_layout(&self.graph, s, inner),
        }
    }

    /// The steps of a checked parameter set.
    fn build(&self, p: &Params) -> Vec<Step> {
        let n = self.plans.len();
        // The copy each tiled stage reads a graph input through, if any.
        let copies: Vec<Option<Layout>> = (0..n).map(|s| self.copy_layout(s, p)).collect();
        // Stages whose plan inserts a stage before them (rfactor's partials, cache_read's copy).
        let inserting: Vec<usize> = (0..n)
            .filter(|&s| matches!(self.plans[s], Plan::Rfactor { .. }) || copies[s].is_some())
            .collect();
        // Index of original stage `s` once the inserted stages are in.
        let new_index = |s: usize| s + inserting.iter().filter(|&&r| r <= s).count();
        let width = p.vector.checked_sub(1).map(|i| self.widths[i]);
        let unroll = UNROLL_STEPS[p.unroll];
        let attach = self.attach[p.compute_at];
        let mut steps = Vec::new();
        for (k, &r) in inserting.iter().enumerate() {
            match &self.plans[r] {
                Plan::Rfactor { axis } => steps.push(Step::Rfactor {
                    stage: r + k,
                    factor: p.tiles[*axis].iter().product(),
                }),
                Plan::Tiled { .. } => {
                    if let Some(l) = &copies[r] {
                        steps.push(Step::CacheRead {
                            stage: r + k,
                            input: l.input,
                            order: l.order.clone(),
                            panel: l.panel,
                        });
                    }
                }
                _ => {}
            }
        }
        for (s, plan) in self.plans.iter().enumerate() {
            if *plan == Plan::Inline {
                steps.push(Step::ComputeInline {
                    stage: new_index(s),
                });
            }
        }
        for (s, plan) in self.plans.iter().enumerate() {
            let stage = &self.graph.stages[s];
            let red = stage.reduce.as_ref().map_or(&[][..], |r| &r.extents[..]);
            let ann = Annotations {
                parallel: p.parallel,
                width,
                unroll,
            };
            match *plan {
                Plan::Inline | Plan::Epilogue => {}
                Plan::Simple => emit_simple(
                    &mut steps,
                    new_index(s),
                    (&stage.shape, &guarded_axes(stage)),
                    red,
                    &ann,
                ),
                Plan::Rfactor { axis } => {
                    let t = &p.tiles[axis];
                    let factor: usize = t.iter().product();
                    let mut partial_red = red.to_vec();
                    if let Some(first) = partial_red.first_mut() {
                        *first /= factor.max(1);
                    }
                    emit_partial(
                        &mut steps,
                        new_index(s) - 1,
                        &stage.shape,
                        factor,
                        t.last().copied().unwrap_or(1),
                        &partial_red,
                        &ann,
                    );
                    let free = vec![false; stage.shape.len()];
                    emit_simple(
                        &mut steps,
                        new_index(s),
                        (&stage.shape, &free),
                        &[factor],
                        &ann,
                    );
                }
                Plan::Tiled {
                    cache_write,
                    epilogue,
                    first_axis,
                    ref layout,
                } => {
                    let n_axes = stage.axis_extents().len();
                    let ns = stage.n_spatial();
                    if let Some(l) = &copies[s] {
                        steps.extend(copy_steps(new_index(s) - 1, &self.graph, s, l));
                    }
                    let tiled = TiledStage {
                        stage: new_index(s),
                        extents: stage.axis_extents(),
                        ns,
                        vec_axis: layout.as_ref().map_or(ns - 1, |l| l.vec_axis),
                        tiles: &p.tiles[first_axis..first_axis + n_axes],
                        acc: cache_write.then_some(attach.acc),
                        epilogue: epilogue.map(|c| (new_index(c), attach.epi.unwrap_or(0))),
                    };
                    emit_tiled(&mut steps, &tiled, &ann);
                }
            }
        }
        steps
    }
}

/// The annotation knobs, resolved.
struct Annotations {
    parallel: usize,
    width: Option<usize>,
    unroll: usize,
}

/// Tracks loop positions and extents while steps are appended, mirroring lowering's rules.
struct Loops {
    stage: usize,
    /// (axis, level) of each loop; a fused loop keeps its first tag.
    tags: Vec<(usize, usize)>,
    extents: Vec<usize>,
}

impl Loops {
    fn new(stage: usize, extents: &[usize]) -> Self {
        Loops {
            stage,
            tags: (0..extents.len()).map(|a| (a, 0)).collect(),
            extents: extents.to_vec(),
        }
    }

    fn pos(&self, tag: (usize, usize)) -> usize {
        self.tags.iter().position(|&t| t == tag).unwrap_or(0)
    }

    fn split(&mut self, steps: &mut Vec<Step>, axis: usize, factors: &[usize]) {
        let at = self.pos((axis, 0));
        steps.push(Step::Split {
            stage: self.stage,
            at,
            factors: factors.to_vec(),
        });
        let inner: usize = factors.iter().product();
        let mut ext = vec![self.extents[at].div_ceil(inner.max(1))];
        ext.extend_from_slice(factors);
        let tags: Vec<_> = (0..=factors.len()).map(|l| (axis, l)).collect();
        self.tags.splice(at..=at, tags);
        self.extents.splice(at..=at, ext);
    }

    fn reorder(&mut self, steps: &mut Vec<Step>, order: &[(usize, usize)]) {
        let order: Vec<usize> = order.iter().map(|&t| self.pos(t)).collect();
        if order.iter().enumerate().all(|(i, &o)| i == o) {
            return;
        }
        steps.push(Step::Reorder {
            stage: self.stage,
            order: order.clone(),
        });
        self.tags = order.iter().map(|&i| self.tags[i]).collect();
        self.extents = order.iter().map(|&i| self.extents[i]).collect();
    }

    /// Fuses the first `n` loops into one and runs it in parallel (nothing for `n == 0`).
    fn parallel_prefix(&mut self, steps: &mut Vec<Step>, n: usize) {
        for _ in 1..n {
            steps.push(Step::Fuse {
                stage: self.stage,
                at: 0,
            });
            self.tags.remove(1);
            let e = self.extents.remove(1);
            self.extents[0] *= e;
        }
    }

    /// Marks the innermost loops unrolled while their cumulative trip count stays within
    /// `max`, skipping unit loops, the vector loop and the parallel loop.
    fn unroll(&self, steps: &mut Vec<Step>, max: usize, parallel: bool, vector: bool) {
        let n = self.extents.len();
        let mut cum = 1usize;
        for i in (0..n).rev() {
            if parallel && i == 0 {
                break;
            }
            cum = cum.saturating_mul(self.extents[i]);
            if cum > max {
                break;
            }
            if (vector && i + 1 == n) || self.extents[i] <= 1 {
                continue;
            }
            steps.push(Step::Unroll {
                stage: self.stage,
                at: i,
            });
        }
    }
}

/// A simple nest: outer spatial loops fused in parallel, an elementwise stage's last axis split
/// by the vector width (by its largest divisor within the width, so no remainder) and
/// vectorised, innermost loops unrolled.
fn emit_simple(
    steps: &mut Vec<Step>,
    s: usize,
    (shape, guarded): (&[usize], &[bool]),
    reduce: &[usize],
    ann: &Annotations,
) {
    let ns = shape.len();
    let mut extents = shape.to_vec();
    extents.extend_from_slice(reduce);
    let mut loops = Loops::new(s, &extents);
    let mut spatial_loops = ns;
    let mut vector = false;
    // Axes a select tests stay plain loops for loop partitioning (see `guarded_axes`).
    let free_prefix = guarded.iter().position(|&g| g).unwrap_or(ns);
    let last_free = !guarded.last().copied().unwrap_or(false);
    if let (Some(w), true, Some(&last), true) =
        (ann.width, reduce.is_empty(), shape.last(), last_free)
    {
        if (2..=w).contains(&last) {
            vector = true;
        } else if last > w {
            let v = largest_divisor_at_most(last, w);
            if v >= 2 {
                loops.split(steps, ns - 1, &[v]);
                spatial_loops += 1;
                vector = true;
            }
        }
    }
    let fused = ann
        .parallel
        .min(spatial_loops - usize::from(vector))
        .min(free_prefix);
    loops.parallel_prefix(steps, fused);
    if fused > 0 {
        steps.push(Step::Parallel { stage: s, at: 0 });
    }
    if vector {
        steps.push(Step::Vectorize {
            stage: s,
            at: loops.tags.len() - 1,
        });
    }
    // Padding axes stay rolled too: the compiler's loop vectoriser copies a partitioned
    // interior far better than straight-line code.
    if free_prefix == ns {
        loops.unroll(steps, ann.unroll, fused > 0, vector);
    }
}

/// The partial stage of an rfactor: axes `shape ++ [factor]`, reduce `reduce`; the partials
/// axis split into (outer, `inner`), loops ordered `outer, spatial.., reduce.., inner`, the
/// outer ones parallel, `inner` vectorised and accumulated in registers over the reduction.
fn emit_partial(
    steps: &mut Vec<Step>,
    s: usize,
    shape: &[usize],
    factor: usize,
    inner: usize,
    reduce: &[usize],
    ann: &Annotations,
) {
    let ns = shape.len();
    let mut extents = shape.to_vec();
    extents.push(factor);
    extents.extend_from_slice(reduce);
    let mut loops = Loops::new(s, &extents);
    loops.split(steps, ns, &[inner]);
    let mut order = vec![(ns, 0)];
    order.extend((0..ns).map(|a| (a, 0)));
    order.extend((ns + 1..extents.len()).map(|a| (a, 0)));
    order.push((ns, 1));
    loops.reorder(steps, &order);
    let fused = ann.parallel.min(ns + 1);
    loops.parallel_prefix(steps, fused);
    // Accumulate the `inner` partials in registers across the whole reduction.
    steps.push(Step::CacheWrite {
        stage: s,
        at: ns - fused.saturating_sub(1),
    });
    if fused > 0 {
        steps.push(Step::Parallel { stage: s, at: 0 });
    }
    let vector = ann.width.is_some_and(|w| (2..=w).contains(&inner));
    if vector {
        steps.push(Step::Vectorize {
            stage: s,
            at: loops.tags.len() - 1,
        });
    }
    loops.unroll(steps, ann.unroll, fused > 0, vector);
}

/// A tiled stage, resolved from the params.
struct TiledStage<'a> {
    stage: usize,
    extents: Vec<usize>,
    ns: usize,
    /// The spatial axis whose `S3` tile is innermost (and vectorised).
    vec_axis: usize,
    /// Inner tiles of each axis (3 per spatial axis, 1 per reduce axis).
    tiles: &'a [Vec<usize>],
    /// Accumulator at the end of this level (1 or 2), if any.
    acc: Option<usize>,
    /// The epilogue stage and the level (0 or 1) at whose end it is computed.
    epilogue: Option<(usize, usize)>,
}

/// SSRSRS tiling, the accumulator, the epilogue, and the annotations.
fn emit_tiled(steps: &mut Vec<Step>, t: &TiledStage<'_>, ann: &Annotations) {
    let (ns, s) = (t.ns, t.stage);
    let nr = t.extents.len() - ns;
    let mut loops = Loops::new(s, &t.extents);
    for (a, tiles) in t.tiles.iter().enumerate() {
        loops.split(steps, a, tiles);
    }
    let spatial = |l: usize| (0..ns).map(move |a| (a, l));
    let reduce = |l: usize| (ns..ns + nr).map(move |a| (a, l));
    let vec_axis = t.vec_axis;
    let innermost = (0..ns)
        .filter(|&a| a != vec_axis)
        .chain([vec_axis])
        .map(|a| (a, 3));
    let order: Vec<(usize, usize)> = spatial(0)
        .chain(spatial(1))
        .chain(reduce(0))
        .chain(spatial(2))
        .chain(reduce(1))
        .chain(innermost)
        .collect();
    loops.reorder(steps, &order);
    // Ends of the levels, before fusion.
    let level_end = |l: usize| match l {
        0 => ns - 1,
        1 => 2 * ns - 1,
        _ => 3 * ns + nr - 1,
    };
    let epi_end = t.epilogue.map(|(_, l)| level_end(l));
    let fused = ann.parallel.min(epi_end.map_or(2 * ns, |e| e + 1));
    loops.parallel_prefix(steps, fused);
    let shift = fused.saturating_sub(1);
    if let Some(l) = t.acc {
        steps.push(Step::CacheWrite {
            stage: s,
            at: level_end(l) - shift,
        });
    }
    if fused > 0 {
        steps.push(Step::Parallel { stage: s, at: 0 });
    }
    let last = &t.tiles[vec_axis];
    let exact = t.extents[vec_axis].is_multiple_of(last.iter().product::<usize>());
    let inner = last.last().copied().unwrap_or(1);
    let vector = exact && ann.width.is_some_and(|w| (2..=w).contains(&inner));
    if vector {
        steps.push(Step::Vectorize {
            stage: s,
            at: loops.tags.len() - 1,
        });
    }
    loops.unroll(steps, ann.unroll, fused > 0, vector);
    if let (Some((c, _)), Some(e)) = (t.epilogue, epi_end) {
        steps.push(Step::ComputeAt {
            stage: c,
            target: s,
            at: e - shift,
        });
    }
}

/// A random factorisation of an axis into its inner levels.
fn sample_axis(a: &TiledAxis, rng: &mut Rng) -> Vec<usize> {
    let primes = factorize(a.extent);
    for _ in 0..16 {
        let mut levels = vec![1usize; a.levels];
        for &p in &primes {
            levels[rng.below(a.levels)] *= p;
        }
        if !a.rfactor && a.extent >= 3 && rng.chance(NON_DIVIDING_CHANCE) {
            let j = 1 + rng.below(a.levels - 1);
            levels[j] = 2 + rng.below(a.extent.min(16) - 1);
        }
        let inner = levels[1..].to_vec();
        let prod: usize = inner.iter().product();
        let innermost = inner.last().copied().unwrap_or(1);
        let ok = prod <= a.extent
            && innermost <= MAX_INNER_TILE
            && (!a.rfactor || (prod >= 2 && prod < a.extent && a.extent.is_multiple_of(prod)));
        if ok {
            return inner;
        }
    }
    let mut t = vec![1; a.levels - 1];
    if a.rfactor {
        if let Some(last) = t.last_mut() {
            *last = smallest_prime_factor(a.extent).unwrap_or(1);
        }
    }
    t
}

/// All levels of a tiled axis, the derived outermost first; `None` if the tiles overrun.
fn full_levels(tiles: &[usize], extent: usize) -> Option<Vec<usize>> {
    let prod = tiles
        .iter()
        .try_fold(1usize, |acc, &x| acc.checked_mul(x))
        .filter(|&p| p >= 1 && p <= extent)?;
    let mut v = vec![extent.div_ceil(prod)];
    v.extend_from_slice(tiles);
    Some(v)
}

/// Moves factor `f` from level `from` to level `to` (level 0, the derived one, just gives or
/// takes).
fn move_factor(tiles: &mut [usize], from: usize, to: usize, f: usize) {
    if from > 0 {
        tiles[from - 1] /= f;
    }
    if to > 0 {
        tiles[to - 1] = tiles[to - 1].saturating_mul(f);
    }
}

fn shifted(v: usize, delta: i32, n: usize) -> Option<usize> {
    let w = v as i64 + i64::from(delta);
    (delta != 0 && w >= 0 && (w as u64) < n as u64).then_some(w as usize)
}

fn factorize(mut n: usize) -> Vec<usize> {
    let mut out = Vec::new();
    let mut d = 2;
    while d * d <= n {
        while n.is_multiple_of(d) {
            out.push(d);
            n /= d;
        }
        d += 1;
    }
    if n > 1 {
        out.push(n);
    }
    out
}

fn smallest_prime_factor(n: usize) -> Option<usize> {
    factorize(n).first().copied()
}

fn largest_divisor_at_most(n: usize, cap: usize) -> usize {
    (1..=cap.min(n).max(1))
        .rev()
        .find(|d| n.is_multiple_of(*d))
        .unwrap_or(1)
}

fn has_select(e: &Expr) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= matches!(x, Expr::Select(..)));
    found
}

fn uses_axis(e: &Expr, a: usize) -> bool {
    let mut found = false;
    e.visit(&mut |x| found |= *x == Expr::Axis(a));
    found
}

fn elem_bytes(d: DType) -> usize {
    match d {
        DType::F64 => 8,
        _ => 4,
    }
}

/// Multi-level tiling applies: a reduction whose output's last axis indexes the last dimension
/// of some operand (so the innermost tile reads contiguously), with data reuse: some operand
/// does not depend on some spatial axis, so a tile along that axis reads it once for many
/// outputs (as Ansor's `NeedsMultiLevelTiling`). A row reduction reading `x[i, k]` and a
/// per-row statistic `m[i]` has no reuse and stays a simple nest.
fn tileable(graph: &Graph, s: usize) -> bool {
    let stage = &graph.stages[s];
    let ns = stage.n_spatial();
    let Some(last) = ns.checked_sub(1) else {
        return false;
    };
    if stage.reduce.is_none() {
        return false;
    }
    let (mut contiguous, mut reuse) = (false, false);
    stage.body.visit(&mut |e| {
        if let Expr::Load(_, idx) = e {
            contiguous |= idx.last().is_some_and(|l| uses_axis(l, last));
            reuse |= (0..ns).any(|a| !idx.iter().any(|i| uses_axis(i, a)));
        }
    });
    contiguous && reuse
}

/// Rfactor applies: little output parallelism (fewer than 64 elements per thread, and for a
/// tileable stage no more output than reduction, as in Ansor), a long reduction, and a first
/// reduce extent with a proper divisor.
fn rfactor_fits(graph: &Graph, s: usize, target: &CpuTarget, tiled: bool) -> bool {
    let stage = &graph.stages[s];
    let Some(r) = &stage.reduce else {
        return false;
    };
    let space = stage.size();
    let reduce: usize = r.extents.iter().product();
    let first = r.extents.first().copied().unwrap_or(1);
    space < RFACTOR_MAX_SPACE_PER_THREAD * target.threads.max(1)
        && reduce >= RFACTOR_MIN_REDUCE
        && (!tiled || space <= reduce)
        && smallest_prime_factor(first).is_some_and(|p| p < first)
}

/// Stages `c` reads once its inlined producers are substituted.
fn reads(graph: &Graph, c: usize, inlined: &[bool]) -> Vec<usize> {
    let mut out = Vec::new();
    let mut stack = vec![c];
    while let Some(x) = stack.pop() {
        for t in graph.stages[x].body.loads() {
            if let TensorRef::Stage(p) = t {
                if inlined[p] {
                    stack.push(p);
                } else if !out.contains(&p) {
                    out.push(p);
                }
            }
        }
    }
    out
}

/// The elementwise consumer of `s` that can be computed as its epilogue: the first stage that
/// reads `s` (through inlined stages), of the same shape, reading `s` only at its own index and
/// nothing computed after `s`.
fn epilogue_consumer(graph: &Graph, s: usize, inlined: &[bool]) -> Option<usize> {
    let n = graph.stages.len();
    let c = (s + 1..n).find(|&c| !inlined[c] && reads(graph, c, inlined).contains(&s))?;
    let cs = &graph.stages[c];
    if cs.reduce.is_some()
        || cs.shape != graph.stages[s].shape
        || reads(graph, c, inlined).iter().any(|&p| p > s)
    {
        return None;
    }
    let identity: Vec<Expr> = (0..cs.n_spatial()).map(Expr::Axis).collect();
    let mut ok = true;
    let mut stack = vec![c];
    while let Some(x) = stack.pop() {
        graph.stages[x].body.visit(&mut |e| {
            if let Expr::Load(TensorRef::Stage(p), idx) = e {
                if *p == s && *idx != identity {
                    ok = false;
                }
                if inlined[*p] {
                    if *idx != identity || graph.stages[*p].shape != cs.shape {
                        ok = false;
                    }
                    stack.push(*p);
                }
            }
        });
    }
    ok.then_some(c)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matmul(m: usize, k: usize, n: usize) -> Graph {
        harl_te::ops::workloads::matmul(m, k, n).expect("matmul")
    }

    #[test]
    fn factor_helpers() {
        assert_eq!(factorize(1), Vec::<usize>::new());
        assert_eq!(factorize(56), vec![2, 2, 2, 7]);
        assert_eq!(factorize(257), vec![257]);
        assert_eq!(smallest_prime_factor(129), Some(3));
        assert_eq!(full_levels(&[3], 10), Some(vec![4, 3]));
        assert_eq!(full_levels(&[11], 10), None);
        assert_eq!(shifted(0, -1, 3), None);
        assert_eq!(shifted(1, 1, 3), Some(2));
        assert_eq!(shifted(2, 1, 3), None);
    }

    #[test]
    fn gemm_has_three_tiled_sketches() {
        let sk = generate_sketches(&matmul(64, 64, 64), &CpuTarget::portable());
        let names: Vec<&str> = sk.iter().map(|s| s.name()).collect();
        assert_eq!(names, ["tile+cache_write", "tile", DEFAULT_SKETCH]);
        let g = harl_te::ops::workloads::dense_bias_relu(64, 64, 64).expect("dense");
        let sk = generate_sketches(&g, &CpuTarget::portable());
        let names: Vec<&str> = sk.iter().map(|s| s.name()).collect();
        assert_eq!(
            names,
            [
                "tile+cache_write",
                "tile+cache_write+fuse_epilogue",
                "tile",
                DEFAULT_SKETCH
            ]
        );
        // The default sketch: vector, row and reduce axes of the one tiled stage.
        let k = sk[3].knobs();
        assert_eq!(k.tiled_axes, vec![(64, 3), (64, 3), (64, 2)]);
        assert_eq!(
            (k.compute_at_choices, k.parallel_max, k.unroll_choices),
            (1, 0, 1)
        );
        let k = sk[1].knobs();
        assert_eq!(k.tiled_axes, vec![(64, 4), (64, 4), (64, 2)]);
        assert_eq!(k.compute_at_choices, 4);
        assert_eq!(k.parallel_max, 4);
    }

    #[test]
    fn samples_are_valid_and_deterministic() {
        let g = matmul(12, 20, 18);
        for sk in generate_sketches(&g, &CpuTarget::portable()) {
            let (mut a, mut b) = (Rng::new(3), Rng::new(3));
            for _ in 0..20 {
                let p = sk.sample(0, &mut a);
                assert_eq!(p, sk.sample(0, &mut b));
                assert!(sk.to_schedule(&p).is_ok(), "{p:?}");
                let q = sk.mutate(&p, &mut a);
                assert_eq!(q, sk.mutate(&p, &mut b));
                assert!(sk.to_schedule(&q).is_ok(), "{q:?}");
            }
        }
    }

    #[test]
    fn bad_params_are_rejected() {
        let sk = &generate_sketches(&matmul(8, 8, 8), &CpuTarget::portable())[0];
        let p = sk.sample(0, &mut Rng::new(1));
        let mut bad = vec![];
        bad.push(Params {
            tiles: vec![],
            ..p.clone()
        });
        let mut t = p.clone();
        t.tiles[0] = vec![4, 4, 4];
        bad.push(t);
        let mut t = p.clone();
        t.tiles[2] = vec![0];
        bad.push(t);
        bad.push(Params {
            compute_at: 9,
            ..p.clone()
        });
        bad.push(Params {
            parallel: 99,
            ..p.clone()
        });
        bad.push(Params {
            unroll: 4,
            ..p.clone()
        });
        bad.push(Params {
            vector: 9,
            ..p.clone()
        });
        let mut rng = Rng::new(2);
        for b in bad {
            assert!(sk.to_schedule(&b).is_err(), "{b:?}");
            // Malformed params never panic the moves: they give nothing, or a valid result.
            let k = sk.knobs();
            for (axis, &(_, levels)) in k.tiled_axes.iter().enumerate() {
                for from in 0..levels + 1 {
                    for to in 0..levels + 1 {
                        if let Some(q) = sk.tile_move(&b, axis, from, to) {
                            assert!(sk.to_schedule(&q).is_ok());
                        }
                    }
                }
            }
            for d in [-1, 1, i32::MIN, i32::MAX] {
                for q in [
                    sk.step_compute_at(&b, d),
                    sk.step_parallel(&b, d),
                    sk.step_unroll(&b, d),
                    sk.step_vector(&b, d),
                ]
                .into_iter()
                .flatten()
                {
                    assert!(sk.to_schedule(&q).is_ok());
                }
            }
            let q = sk.mutate(&b, &mut rng);
            assert!(q == b || sk.to_schedule(&q).is_ok());
        }
    }
}
