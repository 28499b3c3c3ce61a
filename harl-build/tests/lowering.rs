//! Every legal schedule computes what the reference interpreter computes.

mod common;

use common::*;
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::loop_ir::execute;
use harl_build::lower::lower;
use harl_build::schedule::{Schedule, Step};
use harl_te::interp;
use proptest::prelude::*;

fn check(graph: &harl_te::Graph, sched: &Schedule, seed: u64) {
    let inputs = data(graph, seed);
    let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
    let want = interp::run(graph, &refs).expect("interpreter");
    let program = lower(graph, sched).expect("legal schedule");
    let got = execute(&program, &refs).expect("execute");
    assert_close(&got, &want, 1e-4, &format!("{:?}", sched.steps));
}

#[test]
fn naive_schedule_matches_interpreter() {
    check(&matmul(5, 7, 3, true), &Schedule::naive(), 1);
}

#[test]
fn default_schedule_matches_interpreter() {
    for (m, k, n) in [(12, 20, 32), (7, 5, 9), (64, 300, 48), (1, 16, 64)] {
        for epi in [false, true] {
            let g = matmul(m, k, n, epi);
            for target in [CpuTarget::host(), CpuTarget::portable()] {
                let s = default_schedule(&g, &target);
                check(&g, &s, 3);
            }
        }
    }
}

#[test]
fn non_dividing_split_is_guarded() {
    let g = matmul(7, 5, 9, false);
    let s = Schedule {
        steps: vec![
            Step::Split {
                stage: 0,
                at: 1,
                factors: vec![2, 2],
            },
            Step::Split {
                stage: 0,
                at: 1,
                factors: vec![2],
            },
            Step::Split {
                stage: 0,
                at: 0,
                factors: vec![4],
            },
            Step::CacheWrite { stage: 0, at: 1 },
        ],
    };
    check(&g, &s, 5);
}

#[test]
fn invalid_steps_are_rejected() {
    let g = matmul(8, 8, 8, true);
    let bad = [
        Step::Split {
            stage: 0,
            at: 9,
            factors: vec![2],
        },
        Step::Split {
            stage: 0,
            at: 0,
            factors: vec![16],
        },
        Step::Parallel { stage: 0, at: 2 },
        Step::Reorder {
            stage: 0,
            order: vec![0, 0, 1],
        },
        Step::ComputeInline { stage: 1 },
        Step::ComputeInline { stage: 0 },
        Step::Fuse { stage: 0, at: 1 },
        Step::ComputeAt {
            stage: 1,
            target: 0,
            at: 2,
        },
        Step::CacheWrite { stage: 1, at: 0 },
        Step::Vectorize { stage: 0, at: 0 },
    ];
    for step in bad {
        let s = Schedule {
            steps: vec![step.clone()],
        };
        assert!(lower(&g, &s).is_err(), "{step:?} should be rejected");
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, .. ProptestConfig::default() })]
    #[test]
    fn random_legal_matmul_schedules_match(seed in any::<u64>(), m in 1usize..10, k in 1usize..12, n in 1usize..12, epi in any::<bool>()) {
        let g = matmul(m, k, n, epi);
        let s = random_schedule(&g, seed, 24);
        check(&g, &s, seed);
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, .. ProptestConfig::default() })]
    #[test]
    fn random_legal_conv2d_schedules_match(seed in any::<u64>(), stride in 1usize..3, pad in 0usize..2, depthwise in any::<bool>()) {
        let (c, f, groups) = if depthwise { (4, 4, 4) } else { (3, 4, 1) };
        let g = harl_te::ops::workloads::conv2d(1, c, 6, 5, f, 3, 3, stride, pad, 1, groups).expect("conv2d");
        let s = random_schedule(&g, seed, 24);
        check(&g, &s, seed);
    }
}

#[test]
fn default_schedules_of_the_op_library_match() {
    use harl_te::ops::workloads as w;
    let graphs = [
        w::conv2d(1, 8, 10, 12, 16, 3, 3, 1, 1, 1, 1).expect("conv2d"),
        w::conv2d(2, 4, 9, 9, 8, 3, 3, 2, 1, 2, 2).expect("grouped conv2d"),
        w::depthwise_conv2d(1, 8, 7, 7, 3, 3, 1, 1, 1).expect("depthwise"),
        w::conv1d(1, 4, 20, 8, 3, 1, 1, 1, 1).expect("conv1d"),
        w::conv3d(1, 2, 4, 5, 5, 4, 3, 3, 3, 1, 1, 1, 1).expect("conv3d"),
        w::conv2d_transpose(1, 4, 4, 4, 3, 4, 4, 2, 1, 1).expect("conv2d_transpose"),
        w::batch_matmul(3, 5, 7, 16).expect("batch_matmul"),
        w::dense_bias_relu(6, 10, 32).expect("dense"),
        w::softmax(5, 33).expect("softmax"),
        w::layer_norm(4, 48).expect("layer_norm"),
        f64_math(),
        i32_arith(),
    ];
    for g in &graphs {
        for target in [CpuTarget::host(), CpuTarget::portable()] {
            check(g, &default_schedule(g, &target), 11);
        }
    }
}

#[test]
fn random_schedules_are_not_trivial() {
    // The sampler must actually exercise the transforms, or the property tests prove little.
    let conv = harl_te::ops::workloads::conv2d(1, 3, 6, 5, 4, 3, 3, 1, 1, 1, 1).expect("conv2d");
    let softmax = harl_te::ops::workloads::softmax(9, 40).expect("softmax");
    let graphs = [matmul(8, 12, 10, true), conv, softmax];
    let mut kinds = std::collections::BTreeSet::new();
    let mut total = 0;
    for seed in 0..40 {
        let s = random_schedule(&graphs[seed as usize % 3], seed, 24);
        total += s.steps.len();
        for st in &s.steps {
            kinds.insert(
                format!("{st:?}")
                    .split([' ', '{'])
                    .next()
                    .unwrap_or("")
                    .to_string(),
            );
        }
    }
    assert!(total >= 40 * 4, "only {total} steps in 40 schedules");
    for k in [
        "Split",
        "Reorder",
        "Fuse",
        "CacheWrite",
        "Parallel",
        "Unroll",
        "ComputeAt",
        "ComputeWithin",
        "ComputeInline",
    ] {
        assert!(kinds.contains(k), "no {k} step sampled: {kinds:?}");
    }
}

#[test]
fn rfactor_then_parallel_partials_matches() {
    let g = harl_te::ops::workloads::softmax(3, 40).expect("softmax");
    let s = Schedule {
        steps: vec![
            Step::Rfactor {
                stage: 0,
                factor: 8,
            },
            // Stage 0 is now the partial max: [rows, 8] reducing 5; vectorise its rf axis.
            Step::Reorder {
                stage: 0,
                order: vec![0, 2, 1],
            },
            Step::Vectorize { stage: 0, at: 2 },
            // Stages 1-3 are the max, the exponentials and their sum: split the sum.
            Step::Rfactor {
                stage: 3,
                factor: 4,
            },
            Step::Parallel { stage: 3, at: 0 },
        ],
    };
    check(&g, &s, 9);
    assert!(lower(
        &g,
        &Schedule {
            steps: vec![Step::Rfactor {
                stage: 0,
                factor: 7
            }]
        }
    )
    .is_err());
}

#[test]
fn cache_read_copies_an_input_in_a_new_layout() {
    // conv2d with padding: stage 0 pads, stage 1 convolves reading the filter (input 1).
    let g = harl_te::ops::workloads::conv2d(1, 3, 7, 6, 4, 3, 3, 2, 1, 1, 1).expect("conv2d");
    let filter_last = Schedule {
        steps: vec![
            Step::CacheRead {
                stage: 1,
                input: 1,
                order: vec![1, 2, 3, 0],
                panel: None,
            },
            // The conv is stage 2 now; its filter axis (1) goes innermost and is vectorised.
            Step::Reorder {
                stage: 2,
                order: vec![0, 2, 3, 4, 5, 6, 1],
            },
            Step::Vectorize { stage: 2, at: 6 },
            Step::Parallel { stage: 0, at: 0 },
        ],
    };
    check(&g, &filter_last, 4);
    let program = lower(&g, &filter_last).expect("lowers");
    assert_eq!(program.graph.stages.len(), 3);
    assert_eq!(program.graph.stages[1].shape, [3, 3, 3, 4]);
    let bad = [
        // Not a permutation, an input the stage does not read, a missing input or stage.
        (1, 1, vec![0, 1, 2, 2]),
        (0, 1, vec![1, 2, 3, 0]),
        (1, 5, vec![0]),
        (7, 1, vec![1, 2, 3, 0]),
    ];
    for (stage, input, order) in bad {
        let step = Step::CacheRead {
            stage,
            input,
            order,
            panel: None,
        };
        let s = Schedule {
            steps: vec![step.clone()],
        };
        assert!(lower(&g, &s).is_err(), "{step:?} should be rejected");
    }
    // After another step on the stage, it would renumber scheduled stages: rejected.
    let late = Schedule {
        steps: vec![
            Step::Parallel { stage: 1, at: 0 },
            Step::CacheRead {
                stage: 1,
                input: 1,
                order: vec![1, 2, 3, 0],
                panel: None,
            },
        ],
    };
    assert!(lower(&g, &late).is_err());
}

/// A panel copy: the filter axis (4) in panels of 2, the panel index first; the reader's
/// `f / 2` and `f % 2` resolve to the split loops, so the vector loop reads one panel.
#[test]
fn cache_read_in_panels_computes_the_same() {
    let g = harl_te::ops::workloads::conv2d(1, 3, 7, 6, 4, 3, 3, 2, 1, 1, 1).expect("conv2d");
    let panels = |panel| Schedule {
        steps: vec![
            Step::CacheRead {
                stage: 1,
                input: 1,
                order: vec![1, 2, 3, 0],
                panel,
            },
            Step::Split {
                stage: 2,
                at: 1,
                factors: vec![2],
            },
            // [n, fo, fi, y, x, c, ky, kx] -> fi innermost.
            Step::Reorder {
                stage: 2,
                order: vec![0, 1, 3, 4, 5, 6, 7, 2],
            },
            Step::Vectorize { stage: 2, at: 7 },
        ],
    };
    let ok = panels(Some(2));
    check(&g, &ok, 4);
    let program = lower(&g, &ok).expect("lowers");
    assert_eq!(program.graph.stages[1].shape, [2, 3, 3, 3, 2]);
    let text = format!("{:?}", program.nests);
    assert!(!text.contains("Div") && !text.contains("Rem"), "{text}");
    for bad in [Some(0), Some(3), Some(8)] {
        assert!(
            lower(&g, &panels(bad)).is_err(),
            "panel {bad:?} should be rejected"
        );
    }
}

/// Row reductions (softmax's max and sum, layer norm's mean and variance) split into vector
/// lanes by the default schedule, and still compute what the interpreter computes; matmuls,
/// whose reduction does not walk every operand contiguously, are tiled instead.
#[test]
fn default_row_reductions_split_into_lanes_and_match() {
    use harl_te::ops::workloads as w;
    let target = CpuTarget::host();
    for g in [
        w::softmax(6, 256).expect("softmax"),
        w::layer_norm(3, 512).expect("layer_norm"),
    ] {
        let s = default_schedule(&g, &target);
        check(&g, &s, 5);
        let rfactors = s
            .steps
            .iter()
            .filter(|st| matches!(st, harl_build::schedule::Step::Rfactor { .. }))
            .count();
        assert_eq!(rfactors, 2, "{:?}", s.steps);
        check(&g, &s, 5);
    }
    let mm = w::matmul(4, 256, 32).expect("matmul");
    let s = default_schedule(&mm, &target);
    assert!(!s
        .steps
        .iter()
        .any(|st| matches!(st, harl_build::schedule::Step::Rfactor { .. })));
}

/// Softmax with every stage computed within the partial max's row loop (row fusion): the
/// reductions accumulate per row in blocks, the elementwise stages keep their own vector
/// loops, and the result is the interpreter's.
fn softmax_within(cache_write_sum: bool) -> Schedule {
    let mut steps = vec![
        // 0 max_rf [rows, 8], 1 max, 2 exp, 3 sum_rf, 4 sum, 5 1/sum, 6 softmax.
        Step::Rfactor {
            stage: 0,
            factor: 8,
        },
        Step::Rfactor {
            stage: 3,
            factor: 8,
        },
        Step::Reorder {
            stage: 0,
            order: vec![0, 2, 1],
        },
        Step::CacheWrite { stage: 0, at: 0 },
        Step::Vectorize { stage: 0, at: 2 },
        Step::Parallel { stage: 0, at: 0 },
        Step::CacheWrite { stage: 1, at: 0 },
        Step::ComputeWithin {
            stage: 1,
            target: 0,
            at: 0,
        },
        Step::Split {
            stage: 2,
            at: 1,
            factors: vec![8],
        },
        Step::Vectorize { stage: 2, at: 2 },
        Step::ComputeWithin {
            stage: 2,
            target: 0,
            at: 0,
        },
        Step::Reorder {
            stage: 3,
            order: vec![0, 2, 1],
        },
        Step::CacheWrite { stage: 3, at: 0 },
        Step::Vectorize { stage: 3, at: 2 },
        Step::ComputeWithin {
            stage: 3,
            target: 0,
            at: 0,
        },
    ];
    if cache_write_sum {
        steps.push(Step::CacheWrite { stage: 4, at: 0 });
    }
    steps.extend([
        Step::ComputeWithin {
            stage: 4,
            target: 0,
            at: 0,
        },
        Step::ComputeWithin {
            stage: 5,
            target: 0,
            at: 0,
        },
        Step::Split {
            stage: 6,
            at: 1,
            factors: vec![16],
        },
        Step::ComputeWithin {
            stage: 6,
            target: 0,
            at: 0,
        },
    ]);
    Schedule { steps }
}

#[test]
fn compute_within_fuses_softmax_rows() {
    // 40 columns: the softmax's 16-wide split overruns and is guarded.
    let g = harl_te::ops::workloads::softmax(6, 40).expect("softmax");
    let s = softmax_within(true);
    check(&g, &s, 7);
    let program = lower(&g, &s).expect("lowers");
    assert_eq!(program.nests.len(), 1, "one nest over the rows");
    // Without its accumulator block, the sum would need a pre-filled buffer: refused.
    let err = lower(&g, &softmax_within(false)).expect_err("needs cache_write");
    assert!(err.to_string().contains("cache_write"), "{err}");
}

#[test]
fn compute_within_rejects_what_it_cannot_compute_per_row() {
    let g = harl_te::ops::workloads::softmax(6, 40).expect("softmax");
    // 0 max [6] reduce 40, 1 exp, 2 sum, 3 1/sum, 4 softmax.
    let within = |stage, target, at| Step::ComputeWithin { stage, target, at };
    let cases: Vec<Vec<Step>> = vec![
        // The target's row loop split: its loops 0..=0 are no longer a whole axis.
        vec![
            Step::Split {
                stage: 0,
                at: 0,
                factors: vec![2],
            },
            within(1, 0, 0),
        ],
        // The consumer's row loop split.
        vec![
            Step::Split {
                stage: 1,
                at: 0,
                factors: vec![3],
            },
            within(1, 0, 0),
        ],
        // The consumer parallel.
        vec![Step::Parallel { stage: 1, at: 0 }, within(1, 0, 0)],
        // Within a reduce loop of the target.
        vec![within(1, 0, 1)],
        // Stage 3 reads stage 2, which runs after the target's nest and is not within it.
        vec![within(3, 0, 0)],
        // Reads stage 2 before it is computed (attached after stage 3).
        vec![
            within(1, 0, 0),
            within(3, 0, 0),
            Step::CacheWrite { stage: 2, at: 0 },
            within(2, 0, 0),
        ],
        // Backwards, itself, out of range.
        vec![within(0, 1, 0)],
        vec![within(1, 1, 0)],
        vec![within(9, 0, 0)],
        vec![within(1, 0, 7)],
    ];
    for steps in cases {
        let s = Schedule {
            steps: steps.clone(),
        };
        assert!(lower(&g, &s).is_err(), "{steps:?} should be rejected");
    }
    // `e = exp(x)` on an 8x8 matrix, then `t` reading `e` as `body` does.
    let exp_then = |body: &dyn Fn(harl_te::TensorRef) -> harl_te::Expr| {
        use harl_te::{DType, Expr};
        let mut b = harl_te::GraphBuilder::new();
        let x = b.input("x", &[8, 8], DType::F32);
        let e = b.compute(
            "e",
            &[8, 8],
            DType::F32,
            harl_te::load(x, vec![Expr::Axis(0), Expr::Axis(1)]).exp(),
        );
        b.compute("t", &[8, 8], DType::F32, body(e));
        b.finish().expect("graph")
    };
    let s = Schedule {
        steps: vec![within(1, 0, 0)],
    };
    // A consumer that reads the target at another row: a transposed read of a square matrix.
    let t = exp_then(&|e| harl_te::load(e, vec![harl_te::Expr::Axis(1), harl_te::Expr::Axis(0)]));
    let err = lower(&t, &s).expect_err("reads another row");
    assert!(err.to_string().contains("leading indices"), "{err}");
    // Reads at its own row (any column) lower and match.
    let ok = exp_then(&|e| {
        harl_te::load(e, vec![harl_te::Expr::Axis(0), harl_te::Expr::Axis(1)])
            + harl_te::load(e, vec![harl_te::Expr::Axis(0), harl_te::Expr::int(0)])
    });
    check(&ok, &s, 2);
}

/// The default schedule computes softmax and layer norm row by row in one parallel nest when
/// there are enough rows (and their lane reductions vectorised), and matches the interpreter.
#[test]
fn default_row_chains_are_one_nest_and_match() {
    use harl_te::ops::workloads as w;
    for target in [CpuTarget::host(), CpuTarget::portable()] {
        for g in [
            w::softmax(16, 256).expect("softmax"),
            w::softmax(12, 40).expect("softmax"),
            w::layer_norm(9, 512).expect("layer_norm"),
            w::layer_norm(10, 30).expect("layer_norm"),
            // (On AVX-512 a 7x7 output plane reads its padding in place: 14x14 here.)
            w::depthwise_conv2d(1, 16, 28, 28, 3, 3, 2, 1, 1).expect("depthwise s2"),
            w::depthwise_conv2d(2, 8, 9, 9, 3, 3, 1, 1, 1).expect("depthwise s1"),
        ] {
            let s = default_schedule(&g, &target);
            assert!(
                s.steps
                    .iter()
                    .any(|st| matches!(st, Step::ComputeWithin { .. })),
                "{:?}",
                s.steps
            );
            let program = lower(&g, &s).expect("lowers");
            assert_eq!(program.nests.len(), 1, "{:?}", s.steps);
            check(&g, &s, 6);
        }
    }
}

#[test]
fn a_final_reduction_within_its_partials_rows_with_an_epilogue() {
    // Found by `random_legal_matmul_schedules_match`: rfactor's final reduction computed within
    // its partial's loop, its own epilogue at its outermost loop, both in accumulators.
    let g = matmul(1, 8, 6, true);
    let s = Schedule {
        steps: vec![
            Step::Rfactor {
                stage: 0,
                factor: 4,
            },
            Step::Split {
                stage: 1,
                at: 2,
                factors: vec![1, 2],
            },
            Step::Split {
                stage: 0,
                at: 3,
                factors: vec![2],
            },
            Step::Split {
                stage: 1,
                at: 1,
                factors: vec![6],
            },
            Step::ComputeAt {
                stage: 2,
                target: 1,
                at: 0,
            },
            Step::CacheWrite { stage: 0, at: 1 },
            Step::CacheWrite { stage: 1, at: 2 },
            Step::ComputeWithin {
                stage: 1,
                target: 0,
                at: 0,
            },
            Step::Parallel { stage: 0, at: 0 },
        ],
    };
    // It computed NaN (the epilogue, attached at a loop the reduction shares with its
    // partial, was emitted nowhere); such a schedule is refused.
    let err = lower(&g, &s).expect_err("refused");
    assert!(err.to_string().contains("attach it inside"), "{err}");
    // Attached inside the reduction's own loops, it lowers and computes the right thing.
    let mut inside = s.clone();
    inside.steps[4] = Step::ComputeAt {
        stage: 2,
        target: 1,
        at: 1,
    };
    check(&g, &inside, 3);
}

/// Whether some write-back in `stmts` computes an epilogue from its accumulator.
fn has_forwarded_epilogue(stmts: &[harl_build::loop_ir::Stmt]) -> bool {
    stmts.iter().any(|s| {
        matches!(
            s,
            harl_build::loop_ir::Stmt::AccStore {
                epilogue: Some(_),
                ..
            }
        ) || has_forwarded_epilogue(s.body())
    })
}

#[test]
fn an_epilogue_at_the_accumulator_is_computed_in_its_write_back() {
    // bias + ReLU attached at the accumulator's own loop: the write-back stores the ReLU
    // straight from the block, and the matmul has no buffer.
    let g = matmul(6, 10, 8, true);
    let at_block = |at: usize| Schedule {
        steps: vec![
            Step::Split {
                stage: 0,
                at: 1,
                factors: vec![4],
            },
            Step::Reorder {
                stage: 0,
                order: vec![0, 1, 3, 2],
            },
            Step::CacheWrite { stage: 0, at: 1 },
            Step::ComputeAt {
                stage: 1,
                target: 0,
                at,
            },
        ],
    };
    let fused = at_block(1);
    let p = lower(&g, &fused).expect("legal");
    assert!(!p.has_buffer[0], "the matmul is never stored");
    assert!(p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)));
    check(&g, &fused, 5);
    // Attached outside the block, it reads the stored matmul as before.
    let outside = at_block(0);
    let p = lower(&g, &outside).expect("legal");
    assert!(p.has_buffer[0]);
    assert!(!p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)));
    check(&g, &outside, 5);
    // The default schedule of a whole reduction per block does the same.
    let s = default_schedule(&g, &CpuTarget::host());
    let p = lower(&g, &s).expect("legal");
    assert!(!p.has_buffer[0], "{:?}", s.steps);
    check(&g, &s, 6);
}

/// Whether some write-back in `stmts` stores its block's sums without combining them with
/// the stored ones.
fn stores_plainly(stmts: &[harl_build::loop_ir::Stmt]) -> bool {
    stmts.iter().any(|s| {
        matches!(
            s,
            harl_build::loop_ir::Stmt::AccStore {
                combine: None,
                epilogue: None,
                ..
            }
        ) || stores_plainly(s.body())
    })
}

#[test]
fn a_split_reductions_epilogue_is_computed_in_its_last_blocks_write_back() {
    // BERT's FFN layer in small: the default splits its 768-long reduction into three blocks
    // around the accumulator and attaches bias + GELU outside them. The first block stores its
    // sums (no fill), the last computes the GELU from the stored sums plus its own, and no
    // pass of its own reads the matmul back.
    let g = dense_bias_gelu(4, 768, 32);
    let s = default_schedule(&g, &CpuTarget::host());
    let p = lower(&g, &s).expect("legal");
    assert!(p.has_buffer[0], "the partial sums are kept");
    assert!(p.nests.iter().all(|n| n.fill.is_none()), "{:?}", s.steps);
    assert!(p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)));
    assert!(p.nests.iter().any(|n| stores_plainly(&n.body)));
    check(&g, &s, 8);
    // A ReLU attached outside the blocks at the row loop: the same write-backs for five
    // blocks, two, one (the ReLU computed from the accumulator alone), ten, and blocks that do
    // not divide the reduction (10 = 4 + 4 + 2: the last block's guard is inside it).
    let g = matmul(3, 10, 8, true);
    let blocks = |factor: usize| Schedule {
        steps: vec![
            Step::Split {
                stage: 0,
                at: 2,
                factors: vec![factor],
            },
            Step::Reorder {
                stage: 0,
                order: vec![0, 2, 1, 3],
            },
            Step::CacheWrite { stage: 0, at: 1 },
            Step::ComputeAt {
                stage: 1,
                target: 0,
                at: 0,
            },
        ],
    };
    for factor in [2, 5, 10, 1, 4, 3] {
        let s = blocks(factor);
        let p = lower(&g, &s).expect("legal");
        assert!(p.has_buffer[0]);
        assert!(
            p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)),
            "blocks of {factor}"
        );
        assert!(
            p.nests.iter().all(|n| n.fill.is_none()),
            "blocks of {factor}"
        );
        check(&g, &s, 9);
    }
    // The two parts of an overrunning split fused into one loop around the block: its guard
    // wraps the write-back, which the last iteration skips. So the buffer is pre-filled and
    // the ReLU has its own pass.
    let fused = Schedule {
        steps: vec![
            Step::Split {
                stage: 0,
                at: 2,
                factors: vec![4],
            },
            Step::Fuse { stage: 0, at: 2 },
            Step::CacheWrite { stage: 0, at: 2 },
            Step::ComputeAt {
                stage: 1,
                target: 0,
                at: 0,
            },
        ],
    };
    let p = lower(&g, &fused).expect("legal");
    assert!(!p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)));
    assert!(p.nests.iter().any(|n| n.fill.is_some()));
    check(&g, &fused, 10);
}

#[test]
fn an_epilogue_whose_producer_has_another_reader_reads_it_from_memory() {
    // mm is read by the attached ReLU and by a later stage: it keeps its buffer.
    let mut b = harl_te::GraphBuilder::new();
    let a = b.input("a", &[4, 6], harl_te::DType::F32);
    let w = b.input("w", &[6, 8], harl_te::DType::F32);
    let ax = harl_te::Expr::axis;
    let body = harl_te::load(a, [ax(0), ax(2)]) * harl_te::load(w, [ax(2), ax(1)]);
    let mm = b.reduce(
        "mm",
        &[4, 8],
        harl_te::DType::F32,
        harl_te::ReduceOp::Sum,
        &[6],
        body,
    );
    let relu = b.compute(
        "relu",
        &[4, 8],
        harl_te::DType::F32,
        harl_te::load(mm, [ax(0), ax(1)]).max(harl_te::Expr::f32(0.0)),
    );
    b.compute(
        "sum",
        &[4, 8],
        harl_te::DType::F32,
        harl_te::load(relu, [ax(0), ax(1)]) + harl_te::load(mm, [ax(0), ax(1)]),
    );
    let g = b.finish().expect("valid graph");
    let s = Schedule {
        steps: vec![
            Step::CacheWrite { stage: 0, at: 0 },
            Step::ComputeAt {
                stage: 1,
                target: 0,
                at: 0,
            },
        ],
    };
    let p = lower(&g, &s).expect("legal");
    assert!(p.has_buffer[0]);
    assert!(!p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)));
    check(&g, &s, 7);
}

#[test]
fn a_depthwise_convolutions_bias_and_relu6_are_computed_in_its_write_back() {
    // The padding starts a row chain per channel; the convolution's epilogue is computed
    // from its accumulator rather than in a pass of its own, for either stride.
    for stride in [1, 2] {
        let g = depthwise_bias_relu6(8, 32, stride);
        for target in [CpuTarget::host(), CpuTarget::portable()] {
            let s = default_schedule(&g, &target);
            let p = lower(&g, &s).expect("legal");
            assert!(
                p.nests.iter().any(|n| has_forwarded_epilogue(&n.body)),
                "stride {stride}: {:?}",
                s.steps
            );
            // The padded tensor is kept one channel's plane at a time (with stride 2 its rows
            // split into their two phases: [1, 8, 34, 2, 17]).
            let pad = (0..p.graph.stages.len())
                .find(|&s| p.has_buffer[s] && p.graph.stages[s].name.starts_with("pad"))
                .expect("a padding stage");
            let plane = if stride == 1 {
                vec![1, 8, 34, 34]
            } else {
                vec![1, 8, 34, 2, 17]
            };
            assert_eq!(p.graph.stages[pad].shape, plane);
            assert_eq!(p.fold[pad], 2, "{:?} {:?}", p.fold, s.steps);
            assert_eq!(p.buffer_len(pad), 34 * 34);
            check(&g, &s, 12);
        }
    }
}

/// `C = A x B` with B read through a panel copy (`[n / p, k, p]`) whose reader's column loop
/// is split into panels, its loops in `order` (of `[m, n / p, p, k]`), and the copy packed at
/// loop `at` of the reader.
fn packed(m: usize, k: usize, n: usize, p: usize, order: Vec<usize>, at: usize) -> Schedule {
    let _ = (m, k, n);
    Schedule {
        steps: vec![
            Step::CacheRead {
                stage: 0,
                input: 1,
                order: vec![0, 1],
                panel: Some(p),
            },
            Step::Split {
                stage: 1,
                at: 1,
                factors: vec![p],
            },
            Step::Reorder { stage: 1, order },
            Step::PackAt {
                stage: 0,
                target: 1,
                at,
            },
        ],
    }
}

/// A panel copy packed where its reader's loops fix the panel holds one panel (folded) and
/// computes what the interpreter computes; packed where they do not, it is refused.
#[test]
fn a_panel_copy_packed_in_its_reader_holds_one_panel() {
    let g = matmul(5, 7, 12, true);
    // [m, n/p, p, k]: loop 1 fixes the panel.
    let ok = packed(5, 7, 12, 4, vec![0, 1, 2, 3], 1);
    check(&g, &ok, 11);
    let program = lower(&g, &ok).expect("lowers");
    assert_eq!(program.fold[0], 1);
    assert_eq!(program.buffer_len(0), 7 * 4);
    // Panel loop outside the rows: still one panel an iteration.
    check(&g, &packed(5, 7, 12, 4, vec![1, 0, 2, 3], 1), 12);
    // Loop 0 (the rows) does not fix it; nor does a loop past the panel's columns split
    // across it.
    for bad in [
        packed(5, 7, 12, 4, vec![0, 1, 2, 3], 0),
        packed(5, 7, 12, 4, vec![0, 2, 1, 3], 1),
    ] {
        assert!(lower(&g, &bad).is_err(), "{:?}", bad.steps);
    }
    // A parallel copy, or one packed at a loop inside the accumulator block, is refused.
    let mut parallel = ok.clone();
    parallel.steps.insert(3, Step::Parallel { stage: 0, at: 0 });
    assert!(lower(&g, &parallel).is_err());
    let mut inside = packed(5, 7, 12, 4, vec![0, 1, 2, 3], 2);
    inside.steps.insert(3, Step::CacheWrite { stage: 1, at: 1 });
    assert!(lower(&g, &inside).is_err());
    // A stage that is not a panel copy of its reader cannot be packed.
    let plain = Schedule {
        steps: vec![Step::PackAt {
            stage: 0,
            target: 1,
            at: 0,
        }],
    };
    assert!(lower(&g, &plain).is_err());
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// Wherever the lowering accepts a packed panel copy, the kernel computes what the
    /// interpreter computes (any loop order, any packing loop, with or without an epilogue,
    /// an accumulator block and a parallel outer loop).
    #[test]
    fn packed_panel_copies_compute_the_same(
        m in 1usize..7,
        k in 1usize..10,
        panels in 1usize..4,
        p in 1usize..7,
        perm in 0usize..24,
        at in 0usize..4,
        cache_write in proptest::option::of(0usize..4),
        parallel in any::<bool>(),
        epilogue in any::<bool>(),
    ) {
        let n = panels * p;
        let g = matmul(m, k, n, epilogue);
        let mut order: Vec<usize> = (0..4).collect();
        let mut r = perm;
        for i in (1..4).rev() {
            order.swap(i, r % (i + 1));
            r /= i + 1;
        }
        let mut s = packed(m, k, n, p, order, at);
        if let Some(cw) = cache_write {
            s.steps.insert(3, Step::CacheWrite { stage: 1, at: cw });
        }
        if parallel {
            s.steps.insert(3, Step::Parallel { stage: 1, at: 0 });
        }
        if lower(&g, &s).is_ok() {
            check(&g, &s, (m * 31 + k * 7 + n) as u64);
        }
    }
}

/// A depthwise convolution of `c` channels on an `hw`x`hw` image, kernel `k`, with the given
/// stride, padding and dilation (no epilogue).
fn depthwise(
    c: usize,
    hw: usize,
    k: usize,
    stride: usize,
    pad: usize,
    dilation: usize,
) -> harl_te::Graph {
    use harl_te::ops::{self, Conv2dParams};
    let mut b = harl_te::GraphBuilder::new();
    let x = b.input("x", &[1, c, hw, hw], harl_te::DType::F32);
    let w = b.weight("w", &[c, 1, k, k], harl_te::DType::F32);
    let p = Conv2dParams {
        stride: (stride, stride),
        pad: (pad, pad),
        dilation: (dilation, dilation),
        groups: c,
    };
    ops::conv2d(&mut b, x, w, p).expect("conv");
    b.finish().expect("valid graph")
}

#[test]
fn a_depthwise_convolution_slides_its_padded_rows_and_matches() {
    // Strides 1 and 2, odd and even sizes, wider kernels, dilation: the default slides the
    // padding's rows into the convolution's row loop wherever it lowers, and the result is
    // the interpreter's.
    let cases = [
        (9, 3, 1, 1, 1),
        (9, 3, 2, 1, 1),
        (8, 3, 2, 1, 1),
        (7, 3, 2, 1, 1),
        (13, 5, 2, 2, 1),
        (11, 3, 1, 2, 2),
        (12, 5, 1, 2, 1),
    ];
    for (hw, k, stride, pad, dilation) in cases {
        let g = depthwise(16, hw, k, stride, pad, dilation);
        // (AVX2: on AVX-512 planes this small are read in place, tested below.)
        let avx2 = harl_build::target::Variant::Avx2.cpu_target("x86_64", 2);
        for target in [avx2, CpuTarget::portable()] {
            // Planes this small stay whole by default; slid, they compute the same.
            let plain = default_schedule(&g, &target);
            assert!(!plain
                .steps
                .iter()
                .any(|st| matches!(st, Step::Slide { .. })));
            check(&g, &plain, 21);
            let within = first_within(&plain).expect("computed within its padding");
            let mut slid = plain.clone();
            slid.steps.push(Step::Slide { stage: within });
            check(&g, &slid, 21);
        }
    }
    // A plane past half of L1 slides by default.
    let g = depthwise(8, 70, 3, 2, 1, 1);
    let s = default_schedule(&g, &CpuTarget::portable());
    assert!(
        s.steps.iter().any(|st| matches!(st, Step::Slide { .. })),
        "{:?}",
        s.steps
    );
    check(&g, &s, 22);
}

/// The first stage `schedule` computes within another's loop.
fn first_within(schedule: &Schedule) -> Option<usize> {
    schedule.steps.iter().find_map(|st| match st {
        Step::ComputeWithin { stage, .. } => Some(*stage),
        _ => None,
    })
}

#[test]
fn slide_is_refused_where_rows_cannot_slide() {
    // Not computed within anything.
    let g = matmul(8, 8, 8, false);
    let s = Schedule {
        steps: vec![Step::Slide { stage: 0 }],
    };
    assert!(lower(&g, &s).is_err());
    // Within a reduction (softmax's max): its rows are no padding that can be made in parts.
    let g = harl_te::ops::workloads::softmax(6, 40).expect("softmax");
    let mut s = softmax_within(true);
    let within = first_within(&s).expect("a stage computed within");
    s.steps.push(Step::Slide { stage: within });
    let err = lower(&g, &s).expect_err("refused");
    assert!(
        err.to_string()
            .contains("is a reduction; only its result can slide"),
        "{err}"
    );
    // Twice on one stage.
    let g = depthwise(8, 70, 3, 2, 1, 1);
    let mut s = default_schedule(&g, &CpuTarget::portable());
    let stage = s
        .steps
        .iter()
        .find_map(|st| match st {
            Step::Slide { stage } => Some(*stage),
            _ => None,
        })
        .expect("slides");
    s.steps.push(Step::Slide { stage });
    assert!(lower(&g, &s).is_err());
}

#[test]
fn a_fourteen_pixel_convolution_tiles_two_output_rows_and_matches() {
    // A 3x3 convolution with a 14x14 output: the default's register tile takes 2 x 2 pixels
    // (two rows of two), and computes what the interpreter computes, stride 1 and 2.
    for (hw, stride) in [(14, 1), (28, 2)] {
        let g = harl_te::ops::workloads::conv2d(1, 48, hw, hw, 48, 3, 3, stride, 1, 1, 1)
            .expect("conv2d");
        let target = CpuTarget::portable();
        let tiles = harl_build::default_schedule::default_tiles(&g, &target);
        assert!(
            tiles
                .iter()
                .any(|(_, t)| t.block.is_some_and(|(_, rows)| rows == 2)),
            "stride {stride}: {tiles:?}"
        );
        check(&g, &default_schedule(&g, &target), 31);
    }
}

/// On AVX-512 the default reads a small padded plane in place (the padding inlined into the
/// convolution, its bounds checked per tap); the result is the interpreter's.
#[test]
fn small_padded_planes_read_in_place_match() {
    let target = harl_build::target::Variant::Avx512.cpu_target("x86_64", 2);
    for (hw, k, stride, pad, dilation) in [
        (7, 3, 1, 1, 1),
        (6, 5, 1, 2, 1),
        (5, 3, 1, 2, 2),
        (8, 3, 1, 1, 1),
        // Stride 2, through the padding's phases: 14x14 -> 7x7, 9x9 -> 5x5.
        (14, 3, 2, 1, 1),
        (9, 3, 2, 1, 1),
    ] {
        let g = depthwise(16, hw, k, stride, pad, dilation);
        let s = default_schedule(&g, &target);
        assert!(
            s.steps
                .iter()
                .any(|st| matches!(st, Step::ComputeInline { stage: 0 })),
            "{:?}",
            s.steps
        );
        assert_eq!(lower(&g, &s).expect("lowers").nests.len(), 1);
        check(&g, &s, 5);
    }
}

/// A global pool's reduce loops are fused into one vectorised loop by default (where the run
/// is a vector long); the schedule computes what the interpreter does.
#[test]
fn global_pools_fuse_their_pixels_and_match() {
    use harl_build::target::Variant;
    for variant in [Variant::Avx512, Variant::Avx2, Variant::Base] {
        let target = variant.cpu_target("x86_64", 2);
        for (h, w, op) in [
            (7, 7, harl_te::ReduceOp::Sum),
            (5, 5, harl_te::ReduceOp::Max),
            (3, 3, harl_te::ReduceOp::Sum),
        ] {
            let g = global_pool(20, h, w, op);
            let s = default_schedule(&g, &target);
            let fused = s
                .steps
                .iter()
                .any(|st| matches!(st, Step::Vectorize { .. }));
            let lanes = target.vector_bytes / 4;
            assert_eq!(fused, h * w >= lanes, "{variant:?} {h}x{w}: {:?}", s.steps);
            check(&g, &s, 3);
        }
    }
}
