//! Sliding windows ([`Step::Slide`]): a producer's rows made inside its consumer's row loop,
//! each row just before the first iteration that reads it.
//!
//! A depthwise convolution computed within its padding stage (one channel at a time, see
//! [`crate::rows`]) first writes the channel's whole padded plane, then reads it back for the
//! taps. At 112x112 that plane (52 KB) does not fit L1, so every row makes a round trip to L2.
//! Sliding the padding's rows into the convolution's output-row loop keeps the rows being read
//! the ones just written. The work is the same, only its order changes, and the plane's buffer
//! keeps its size (rows a later iteration reads again stay in it).

use crate::loop_ir::{LoopKind, Stmt};
use crate::schedule::{Schedule, Step};
use harl_te::graph::interval;
use harl_te::{Expr, Graph, TensorRef};
use std::collections::HashSet;

/// `producer` (the loop over row axis `k` of stage `t`, as lowering emitted it) slid into
/// `consumer` (the loops of the stage computed within `t`'s slice, which reads it): the rows
/// before the first iteration's, then each iteration's new rows at the top of the consumer's
/// first loop, then the rows no iteration reads. `vars` are the program's loop extents; the
/// copies of the producer's body get fresh variables.
pub(crate) fn slide(
    producer: Vec<Stmt>,
    consumer: Vec<Stmt>,
    t: usize,
    k: usize,
    vars: &mut Vec<usize>,
) -> Result<Vec<Stmt>, String> {
    let [Stmt::For {
        var: row,
        extent: rows,
        kind: LoopKind::Serial,
        body: made,
    }] = producer.as_slice()
    else {
        return Err(format!("stage {t}'s rows are not one serial loop"));
    };
    let [Stmt::For {
        var,
        extent,
        kind: LoopKind::Serial,
        body,
    }] = consumer.as_slice()
    else {
        return Err("the consumer's loops are not one serial loop (its accumulator block must be inside its first loop)".into());
    };
    let window = window(body, *var, t, k, vars)?;
    // The first iteration reads rows up to `first + step`: those before `first` are made
    // ahead of the loop; iteration `i` makes `first + step*i ..` `first + step*(i + 1)`.
    let first = window
        .last
        .checked_add(1)
        .and_then(|end| end.checked_sub(window.step))
        .filter(|&f| f >= 0)
        .ok_or("the first iteration reads fewer rows than an iteration steps over")?;
    let end = (*extent as i64)
        .checked_mul(window.step)
        .and_then(|n| n.checked_add(first))
        .filter(|&e| e <= *rows as i64)
        .ok_or("the last iteration reads rows past the producer's")?;
    let mut out = Vec::new();
    let rows_loop = |from: i64, to: i64, at: &dyn Fn(Expr) -> Expr, vars: &mut Vec<usize>| {
        let n = (to - from) as usize;
        let v = vars.len();
        vars.push(n);
        Stmt::For {
            var: v,
            extent: n,
            kind: LoopKind::Serial,
            body: crate::partition::fresh_copy(made, *row, &at(Expr::Axis(v)), vars),
        }
    };
    if first > 0 {
        out.push(rows_loop(0, first, &|r| r, vars));
    }
    let step = window.step;
    let at_iteration = |r: Expr| Expr::Axis(*var) * Expr::int(step) + Expr::int(first) + r;
    let mut slid = vec![rows_loop(0, step, &at_iteration, vars)];
    slid.extend(body.iter().cloned());
    out.push(Stmt::For {
        var: *var,
        extent: *extent,
        kind: LoopKind::Serial,
        body: slid,
    });
    if end < *rows as i64 {
        out.push(rows_loop(end, *rows as i64, &|r| r + Expr::int(end), vars));
    }
    Ok(out)
}

/// The rows one iteration of a loop reads: `step*v + (0..=last)` at iteration `v`.
struct Window {
    step: i64,
    last: i64,
}

/// The window of the reads of stage `t` in `body` (the body of loop `var`) along axis `k`.
fn window(body: &[Stmt], var: usize, t: usize, k: usize, vars: &[usize]) -> Result<Window, String> {
    let mut inner = HashSet::new();
    bound_inside(body, &mut inner);
    let mut reads = Vec::new();
    for s in body {
        loads_of(s, t, &mut reads);
    }
    let mut found: Option<Window> = None;
    for index in reads {
        let row = index
            .get(k)
            .ok_or_else(|| format!("a read of stage {t} has no axis {k}"))?;
        let step = crate::partition::linear_coef(row, var)
            .filter(|&a| a >= 1)
            .ok_or("a read's row does not grow with the loop")?;
        let rest = row.map(&mut |e| match e {
            Expr::Axis(v) if v == var => Expr::int(0),
            other => other,
        });
        let mut outside = false;
        rest.visit(&mut |e| match e {
            Expr::Axis(v) => outside |= !inner.contains(v),
            Expr::Load(..) => outside = true,
            _ => {}
        });
        if outside {
            return Err(
                "a read's row depends on more than the loop and the loops inside it".into(),
            );
        }
        let (lo, hi) = interval(&rest, vars);
        if lo < 0 {
            return Err("a read's row may be negative".into());
        }
        found = Some(match found {
            None => Window { step, last: hi },
            Some(w) if w.step == step => Window {
                step,
                last: w.last.max(hi),
            },
            Some(_) => return Err("reads step over the rows at different rates".into()),
        });
    }
    found.ok_or_else(|| format!("the loop does not read stage {t}"))
}

/// The variables that loops and lets in `body` bind.
fn bound_inside(body: &[Stmt], out: &mut HashSet<usize>) {
    for s in body {
        match s {
            Stmt::For { var, .. } | Stmt::Let { var, .. } => {
                out.insert(*var);
            }
            _ => {}
        }
        bound_inside(s.body(), out);
    }
}

/// The indices of every load of stage `t` in `s` and the statements nested in it.
fn loads_of(s: &Stmt, t: usize, out: &mut Vec<Vec<Expr>>) {
    for e in s.exprs() {
        e.visit(&mut |x| {
            if let Expr::Load(TensorRef::Stage(r), index) = x {
                if *r == t {
                    out.push(index.clone());
                }
            }
        });
    }
    for inner in s.body() {
        loads_of(inner, t, out);
    }
}

/// The smallest producer slice (bytes) worth sliding: half of a 32 KB L1. A smaller one stays
/// in L1 whole, and sliding only adds loop overhead: on a Zen 3 core (1 thread, `harl-bench
/// probe --against`) MobileNet-V2's depthwise convolutions at 112x112 (52 KB planes) ran
/// 1.05x (stride 2) and 1.10x (stride 1) faster slid, at 56x56 (13 KB) 1.05x and 0.98x, at
/// 28x28 and 14x14 (4 KB, 1 KB) 0.82x and 0.70x.
pub const MIN_SLIDE_BYTES: usize = 16 << 10;

// `slide_windows` reads a slice's size off its folded buffer.
const _: () = assert!(crate::lower::MIN_FOLD_BYTES <= MIN_SLIDE_BYTES);

/// `schedule` with every stage that is computed within a padding stage (a select, as a
/// depthwise convolution within its padded plane) of at least [`MIN_SLIDE_BYTES`] a slice
/// sliding that stage's rows, where the schedule still lowers with it. Unchanged where
/// nothing qualifies.
pub fn slide_windows(graph: &Graph, schedule: Schedule) -> Schedule {
    let Ok(program) = crate::lower::lower(graph, &schedule) else {
        return schedule;
    };
    let g = &program.graph;
    let mut schedule = schedule;
    let candidates: Vec<usize> = schedule
        .steps
        .iter()
        .filter_map(|s| match s {
            Step::ComputeWithin { stage, target, .. }
                if g.stages.get(*target).is_some_and(|t| {
                    // A slice of this size is folded (one slice a thread), so the buffer's
                    // length is the slice's.
                    crate::default_schedule::has_select(&t.body)
                        && program.fold.get(*target).is_some_and(|&k| k > 0)
                        && program
                            .buffer_len(*target)
                            .saturating_mul(crate::default_schedule::elem_bytes(t.dtype))
                            >= MIN_SLIDE_BYTES
                }) =>
            {
                Some(*stage)
            }
            _ => None,
        })
        .collect();
    for stage in candidates {
        let mut trial = schedule.clone();
        trial.steps.push(Step::Slide { stage });
        if crate::lower::lower(graph, &trial).is_ok() {
            schedule = trial;
        }
    }
    schedule
}
