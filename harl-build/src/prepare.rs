//! Work done once per set of weights: the nests of a program that read weights alone.
//!
//! A graph input marked [`harl_te::graph::Placeholder::constant`] (a weight) keeps its values
//! over many calls. A nest that reads only weights, and stages computed from weights only,
//! computes the same buffer on every call: the generated `prepare` runs it once and keeps what
//! the other nests read of it (a filter copied into its layout, say), and `Prepared::run` runs
//! the rest. onnxruntime does the same with its initializers (prepacked weights).

use crate::loop_ir::{Program, Stmt};
use harl_te::TensorRef;

/// How a program splits between `prepare` and `Prepared::run`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Split {
    /// Per nest: whether `prepare` runs it (instead of every call).
    pub hoisted: Vec<bool>,
    /// Stages (with buffers) written by hoisted nests: `prepare` allocates them.
    pub hoisted_stages: Vec<usize>,
    /// Stages written by hoisted nests and read by the others: `Prepared` keeps their buffers.
    pub kept_stages: Vec<usize>,
    /// Weights the other nests still read: `Prepared` keeps a copy of each.
    pub kept_inputs: Vec<usize>,
}

impl Split {
    /// The split of `p`: a nest is hoisted when every stage it writes is computed from weights
    /// alone and none is the output.
    pub fn of(p: &Program) -> Split {
        let g = &p.graph;
        let mut constant = vec![false; g.stages.len()];
        for (s, stage) in g.stages.iter().enumerate() {
            constant[s] = stage.body.loads().iter().all(|t| match *t {
                TensorRef::Input(i) => g.inputs.get(i).is_some_and(|ph| ph.constant),
                TensorRef::Stage(r) => r < s && constant[r],
            });
        }
        let last = g.stages.len().saturating_sub(1);
        let mut hoisted = Vec::with_capacity(p.nests.len());
        let mut written = vec![false; g.stages.len()];
        let mut read_stage = vec![false; g.stages.len()];
        let mut read_input = vec![false; g.inputs.len()];
        for nest in &p.nests {
            let mut writes = vec![nest.stage];
            let mut reads = Vec::new();
            walk(&nest.body, &mut writes, &mut reads);
            let hoist = writes.iter().all(|&s| s != last && constant[s]);
            hoisted.push(hoist);
            if hoist {
                for s in writes {
                    written[s] = true;
                }
                continue;
            }
            for t in reads {
                match t {
                    TensorRef::Stage(s) => read_stage[s] = true,
                    TensorRef::Input(i) => read_input[i] = true,
                }
            }
        }
        let hoisted_stages = (0..g.stages.len())
            .filter(|&s| written[s] && p.has_buffer[s])
            .collect();
        let kept_stages = (0..g.stages.len())
            .filter(|&s| written[s] && read_stage[s] && p.has_buffer[s])
            .collect();
        let kept_inputs = (0..g.inputs.len())
            .filter(|&i| read_input[i] && g.inputs[i].constant)
            .collect();
        Split {
            hoisted,
            hoisted_stages,
            kept_stages,
            kept_inputs,
        }
    }

    /// Whether `prepare` does any work.
    pub fn hoists_any(&self) -> bool {
        self.hoisted.iter().any(|&h| h)
    }
}

/// The stages `stmts` store into and the tensors they load from.
fn walk(stmts: &[Stmt], writes: &mut Vec<usize>, reads: &mut Vec<TensorRef>) {
    for s in stmts {
        writes.extend(s.stored_stage());
        if let Stmt::Shared { boxes, .. } = s {
            reads.extend(boxes.iter().map(|b| TensorRef::Input(b.input)));
        }
        for e in s.exprs() {
            reads.extend(e.loads());
        }
        walk(s.body(), writes, reads);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::lower::lower;
    use crate::schedule::Schedule;
    use harl_te::{DType, Expr, GraphBuilder};

    /// A weight transposed by one stage, then used: the transpose is hoisted and kept, the
    /// weight itself is no longer needed, the use runs on every call.
    #[test]
    fn a_stage_of_weights_alone_is_hoisted() {
        let mut b = GraphBuilder::new();
        let x = b.input("x", &[4, 3], DType::F32);
        let w = b.weight("w", &[5, 3], DType::F32);
        let wt = b.compute(
            "wt",
            &[3, 5],
            DType::F32,
            Expr::Load(w, vec![Expr::axis(1), Expr::axis(0)]),
        );
        let _ = b.reduce(
            "y",
            &[4, 5],
            DType::F32,
            harl_te::ReduceOp::Sum,
            &[3],
            Expr::Load(x, vec![Expr::axis(0), Expr::axis(2)]).binary(
                harl_te::BinaryOp::Mul,
                Expr::Load(wt, vec![Expr::axis(2), Expr::axis(1)]),
            ),
        );
        let g = b.finish().expect("graph");
        let p = lower(&g, &Schedule::default()).expect("lowers");
        let split = Split::of(&p);
        assert_eq!(split.hoisted, vec![true, false]);
        assert_eq!(split.hoisted_stages, vec![0]);
        assert_eq!(split.kept_stages, vec![0]);
        assert!(split.kept_inputs.is_empty());
    }

    /// A strided convolution's default schedule copies the filter into a layout; with the
    /// filter a weight, `prepare` makes the copy and the filter itself is not kept.
    #[test]
    fn a_weights_layout_copy_is_made_by_prepare() {
        use crate::default_schedule::{default_schedule, CpuTarget};
        let mut g =
            harl_te::ops::workloads::conv2d(1, 64, 56, 56, 128, 3, 3, 2, 1, 1, 1).expect("conv");
        g.inputs[1].constant = true;
        let target = CpuTarget {
            vector_bytes: 64,
            acc_registers: 28,
            vector_registers: 32,
            threads: 2,
        };
        let sched = default_schedule(&g, &target);
        // In panels of the register tile's 32 filters.
        assert!(
            sched.steps.iter().any(|s| matches!(
                s,
                crate::schedule::Step::CacheRead {
                    panel: Some(32),
                    ..
                }
            )),
            "{sched:?}"
        );
        let p = lower(&g, &sched).expect("lowers");
        let split = Split::of(&p);
        assert!(split.hoists_any(), "{:?}", split);
        assert!(!split.hoisted[p.nests.len() - 1]);
        assert!(split.kept_inputs.is_empty(), "{:?}", split);
        assert_eq!(split.kept_stages.len(), 1, "{:?}", split);
        // Not a weight: nothing is hoisted.
        g.inputs[1].constant = false;
        let p = lower(&g, &default_schedule(&g, &target)).expect("lowers");
        assert!(!Split::of(&p).hoists_any());
    }
}
