//! The "default" sketch: the default schedule's own structure ([`default_schedule`]: its
//! layouts and weight panels, row chains, fused epilogues and inlining) with the tiles of each
//! stage it tiles left open. The rule sketches cannot express all of that structure, so a
//! search among them alone can stay below the default it started from; this sketch starts at
//! the default itself and moves its register and cache tiles.
//!
//! [`default_schedule`]: harl_build::default_schedule::default_schedule

use super::{Attach, Params, Sketch, TiledAxis};
use harl_build::default_schedule::{default_schedule_with, default_tiles, CpuTarget, TilePlan};
use harl_build::lower::{ScheduleError, MAX_ACC_ELEMS};
use harl_build::schedule::{Schedule, Step};
use harl_te::Graph;

/// The default sketch's name.
pub const DEFAULT_SKETCH: &str = "default";

/// What the default sketch keeps fixed: the target the default plans for, and the stages the
/// default tiles with their default tiles (the sketch's default point).
#[derive(Clone, Debug)]
pub(super) struct Base {
    target: CpuTarget,
    tiles: Vec<(usize, TilePlan)>,
}

impl Sketch {
    /// The default sketch of `graph`; `None` when the default tiles no stage (nothing to
    /// search: the default is measured anyway). Its tiled axes, stage by stage: the vector axis
    /// and the row axis (if any) in three levels (outer, cache block, register tile), the first
    /// reduce axis in two (outer, cache block). Its other knobs have one choice each.
    pub(super) fn default_form(graph: &Graph, target: &CpuTarget) -> Option<Sketch> {
        let tiles = default_tiles(graph, target);
        if tiles.is_empty() {
            return None;
        }
        let axis = |extent: usize, levels: usize| TiledAxis {
            extent,
            levels,
            rfactor: false,
        };
        let mut axes = Vec::new();
        for (s, tp) in &tiles {
            let shape = &graph.stages.get(*s)?.shape;
            axes.push(axis(*shape.get(tp.vec_axis)?, 3));
            if let Some(r) = tp.row_axis {
                axes.push(axis(*shape.get(r)?, 3));
            }
            axes.push(axis(tp.red[0].checked_mul(tp.red[1])?, 2));
        }
        Some(Sketch {
            name: DEFAULT_SKETCH.to_string(),
            graph: graph.clone(),
            plans: Vec::new(),
            axes,
            attach: vec![Attach { acc: 2, epi: None }],
            widths: Vec::new(),
            parallel_max: 0,
            base: Some(Base {
                target: *target,
                tiles,
            }),
        })
    }
}

impl Base {
    /// The default's own tiles as parameters of sketch `index`.
    pub(super) fn params(&self, index: usize) -> Params {
        let mut tiles = Vec::new();
        for (_, tp) in &self.tiles {
            tiles.push(tp.vec[1..].to_vec());
            if tp.row_axis.is_some() {
                tiles.push(tp.row[1..].to_vec());
            }
            tiles.push(tp.red[1..].to_vec());
        }
        Params {
            sketch: index,
            tiles,
            compute_at: 0,
            parallel: 0,
            unroll: 0,
            vector: 0,
        }
    }

    /// The default schedule with the tiles of `p` (already checked against the sketch's axes).
    pub(super) fn schedule(&self, graph: &Graph, p: &Params) -> Result<Schedule, ScheduleError> {
        let bad = |why: &str| ScheduleError::Step {
            index: 0,
            step: Step::Split {
                stage: 0,
                at: 0,
                factors: Vec::new(),
            },
            why: format!("parameters: {why}"),
        };
        let plans = self
            .plans(&p.tiles)
            .ok_or_else(|| bad("the default's tiles must divide their axes"))?;
        for (_, tp) in &plans {
            let rows2 = tp.block.map_or(1, |(_, rows)| rows);
            let acc = tp.vec[2].saturating_mul(tp.row[2]).saturating_mul(rows2);
            if acc > MAX_ACC_ELEMS {
                return Err(bad("the register tile exceeds the accumulator limit"));
            }
        }
        default_schedule_with(graph, &self.target, &plans)
            .ok_or_else(|| bad("the default does not take these tiles"))
    }

    /// `tiles` (the sketch's inner levels) as the default's tile plans: `None` unless every
    /// axis's levels divide its extent.
    fn plans(&self, tiles: &[Vec<usize>]) -> Option<Vec<(usize, TilePlan)>> {
        let mut next = tiles.iter();
        let mut take = |extent: usize| -> Option<Vec<usize>> {
            let inner = next.next()?;
            let prod = inner
                .iter()
                .try_fold(1usize, |acc, &x| acc.checked_mul(x).filter(|_| x > 0))?;
            let outer = extent.is_multiple_of(prod).then(|| extent / prod)?;
            Some([outer].into_iter().chain(inner.iter().copied()).collect())
        };
        let mut out = Vec::new();
        for (s, tp) in &self.tiles {
            let vec = take(tp.vec.iter().product())?;
            let row = match tp.row_axis {
                Some(_) => take(tp.row.iter().product())?,
                None => vec![1, 1, 1],
            };
            let red = take(tp.red.iter().product())?;
            out.push((
                *s,
                TilePlan {
                    vec_axis: tp.vec_axis,
                    row_axis: tp.row_axis,
                    vec: vec.try_into().ok()?,
                    row: row.try_into().ok()?,
                    red: red.try_into().ok()?,
                    block: tp.block,
                },
            ));
        }
        Some(out)
    }
}
