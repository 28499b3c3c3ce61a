//! The sketch space: every sampled, mutated or stepped parameter set lowers, and the program
//! computes what the reference interpreter computes.

#[path = "../../harl-build/tests/common/mod.rs"]
mod common;

use common::{assert_close, data, f64_math, i32_arith, matmul};
use harl_build::codegen::Variant;
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::loop_ir::{execute, LoopKind, Program, Stmt};
use harl_build::lower::lower;
use harl_build::schedule::{Schedule, Step};
use harl_te::ops::workloads as w;
use harl_te::{interp, Graph};
use harl_tune::rng::Rng;
use harl_tune::space::cpu::{
    generate_sketches, Params, Sketch, Task, DEFAULT_SKETCH, UNROLL_STEPS,
};
use proptest::prelude::*;
use std::sync::OnceLock;

/// A graph with fixed inputs and the interpreter's output for them.
struct Case {
    name: &'static str,
    graph: Graph,
    inputs: Vec<Vec<f64>>,
    want: Vec<f64>,
}

impl Case {
    fn new(name: &'static str, graph: Graph) -> Self {
        let inputs = data(&graph, 7);
        let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
        let want = interp::run(&graph, &refs).expect("interpreter");
        Case {
            name,
            graph,
            inputs,
            want,
        }
    }

    fn check(&self, sched: &Schedule) {
        let program = lower(&self.graph, sched).expect("a sketch schedule lowers");
        let refs: Vec<&[f64]> = self.inputs.iter().map(|v| v.as_slice()).collect();
        let got = execute(&program, &refs).expect("execute");
        assert_close(
            &got,
            &self.want,
            1e-4,
            &format!("{}: {:?}", self.name, sched.steps),
        );
    }
}

/// Small shapes of every workload family, odd extents included.
fn cases() -> &'static [Case] {
    static CASES: OnceLock<Vec<Case>> = OnceLock::new();
    CASES.get_or_init(|| {
        vec![
            Case::new("matmul 7x13x9", w::matmul(7, 13, 9).expect("matmul")),
            Case::new("matmul 3x56x257", w::matmul(3, 56, 257).expect("matmul")),
            Case::new(
                "matmul 2x129x3 (rfactor)",
                w::matmul(2, 129, 3).expect("matmul"),
            ),
            Case::new("matmul+bias+relu", matmul(5, 12, 16, true)),
            Case::new(
                "dense_bias_relu",
                w::dense_bias_relu(6, 10, 32).expect("dense"),
            ),
            Case::new(
                "conv2d pad 1 stride 2",
                w::conv2d(1, 3, 7, 6, 4, 3, 3, 2, 1, 1, 1).expect("conv2d"),
            ),
            Case::new(
                "depthwise conv2d",
                w::depthwise_conv2d(1, 4, 7, 7, 3, 3, 1, 1, 1).expect("depthwise"),
            ),
            Case::new("softmax", w::softmax(3, 48).expect("softmax")),
            Case::new("layer_norm", w::layer_norm(4, 48).expect("layer_norm")),
            Case::new(
                "batch_matmul",
                w::batch_matmul(2, 5, 7, 12).expect("batch_matmul"),
            ),
            Case::new("f64 matmul + math epilogue", f64_math()),
            Case::new("matmul, bias_add, relu", mm_bias_relu(6, 9, 20)),
            Case::new("two chained matmuls", two_matmuls(5, 6, 7, 9)),
            Case::new(
                "conv2d_transpose",
                w::conv2d_transpose(1, 3, 3, 3, 2, 4, 4, 2, 1, 1).expect("conv2d_transpose"),
            ),
            Case::new(
                "conv3d",
                w::conv3d(1, 2, 4, 5, 5, 4, 3, 3, 3, 1, 1, 1, 1).expect("conv3d"),
            ),
            Case::new("i32 select + row sum", i32_arith()),
            // Weights: tiled sketches read them through panel copies.
            Case::new(
                "dense_bias_relu with weights",
                weights(w::dense_bias_relu(6, 10, 64).expect("dense"), &[1, 2]),
            ),
            Case::new(
                "conv2d stride 2 with a weight",
                weights(
                    w::conv2d(1, 3, 7, 6, 48, 3, 3, 2, 1, 1, 1).expect("conv2d"),
                    &[1],
                ),
            ),
        ]
    })
}

/// `g` with inputs `which` marked as weights.
fn weights(mut g: Graph, which: &[usize]) -> Graph {
    for &i in which {
        g.inputs[i].constant = true;
    }
    g
}

/// A matmul followed by two elementwise stages: the first is inlined, the second fused.
fn mm_bias_relu(m: usize, k: usize, n: usize) -> Graph {
    use harl_te::{ops, DType, GraphBuilder};
    let mut b = GraphBuilder::new();
    let x = b.input("x", &[m, k], DType::F32);
    let wt = b.input("w", &[k, n], DType::F32);
    let bias = b.input("bias", &[n], DType::F32);
    let mm = ops::matmul(&mut b, x, wt, false, false).expect("matmul");
    let biased = ops::bias_add(&mut b, mm, bias).expect("bias_add");
    ops::relu(&mut b, biased).expect("relu");
    b.finish().expect("valid graph")
}

/// `(a x b) x d`: two tiled stages in one task.
fn two_matmuls(m: usize, k: usize, n: usize, l: usize) -> Graph {
    use harl_te::{ops, DType, GraphBuilder};
    let mut b = GraphBuilder::new();
    let a = b.input("a", &[m, k], DType::F32);
    let bb = b.input("b", &[k, n], DType::F32);
    let d = b.input("d", &[n, l], DType::F32);
    let c = ops::matmul(&mut b, a, bb, false, false).expect("matmul");
    ops::matmul(&mut b, c, d, false, false).expect("matmul");
    b.finish().expect("valid graph")
}

fn targets() -> Vec<CpuTarget> {
    Variant::ALL
        .iter()
        .map(|v| v.cpu_target("x86_64", 4))
        .collect()
}

fn sketches(case: &Case, target: &CpuTarget) -> Vec<Sketch> {
    let sk = generate_sketches(&case.graph, target);
    assert!(!sk.is_empty(), "{}: no sketch", case.name);
    sk
}

/// Every legal HARL action from `p`.
fn harl_moves(sk: &Sketch, p: &Params) -> Vec<Params> {
    let knobs = sk.knobs();
    let mut out = Vec::new();
    for (axis, &(_, levels)) in knobs.tiled_axes.iter().enumerate() {
        for from in 0..levels {
            for to in 0..levels {
                out.extend(sk.tile_move(p, axis, from, to));
            }
        }
    }
    for d in [-1, 1] {
        out.extend(sk.step_compute_at(p, d));
        out.extend(sk.step_parallel(p, d));
        out.extend(sk.step_unroll(p, d));
        out.extend(sk.step_vector(p, d));
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 6, .. ProptestConfig::default() })]

    /// Samples and chains of mutations lower and compute the right thing, on every sketch of
    /// every workload.
    #[test]
    fn samples_and_mutations_match_the_interpreter(seed in any::<u64>()) {
        let targets = targets();
        let target = &targets[(seed % targets.len() as u64) as usize];
        let mut rng = Rng::new(seed);
        for case in cases() {
            for (i, sk) in sketches(case, target).iter().enumerate() {
                let p = sk.sample(i, &mut rng);
                prop_assert_eq!(p.sketch, i);
                let sched = sk.to_schedule(&p);
                prop_assert!(sched.is_ok(), "{}/{}: {:?}: {:?}", case.name, sk.name(), p, sched);
                case.check(&sched.expect("checked"));
                let mut q = p;
                for _ in 0..3 {
                    q = sk.mutate(&q, &mut rng);
                    prop_assert!(sk.to_schedule(&q).is_ok(), "{}/{}: mutation {:?}", case.name, sk.name(), q);
                }
                case.check(&sk.to_schedule(&q).expect("checked"));
            }
        }
    }

    /// Every HARL action yields a valid parameter set (or None); a random one of them computes
    /// the right thing.
    #[test]
    fn harl_actions_are_valid(seed in any::<u64>()) {
        let targets = targets();
        let target = &targets[(seed % targets.len() as u64) as usize];
        let mut rng = Rng::new(seed);
        for case in cases() {
            for (i, sk) in sketches(case, target).iter().enumerate() {
                let p = sk.sample(i, &mut rng);
                let before = sk.to_schedule(&p).expect("sample is valid");
                let moves = harl_moves(sk, &p);
                for q in &moves {
                    let s = sk.to_schedule(q);
                    prop_assert!(s.is_ok(), "{}/{}: {:?} -> {:?}: {:?}", case.name, sk.name(), p, q, s);
                    prop_assert_ne!(s.expect("checked"), before.clone(), "a move that changes nothing");
                }
                if let Some(q) = rng.pick(&moves) {
                    case.check(&sk.to_schedule(q).expect("checked"));
                }
            }
        }
    }
}

#[test]
fn same_seed_same_params() {
    let target = CpuTarget::portable();
    let run = |seed: u64| {
        let mut rng = Rng::new(seed);
        let mut out = Vec::new();
        for case in cases() {
            for (i, sk) in generate_sketches(&case.graph, &target).iter().enumerate() {
                let p = sk.sample(i, &mut rng);
                let q = sk.mutate(&p, &mut rng);
                out.push(p);
                out.extend(harl_moves(sk, &q));
                out.push(q);
            }
        }
        out
    };
    let a = run(42);
    assert_eq!(a, run(42));
    assert_ne!(a, run(43));
}

#[test]
fn sketches_per_workload() {
    let target = CpuTarget::portable();
    let names = |g: &Graph| -> Vec<String> {
        generate_sketches(g, &target)
            .iter()
            .map(|s| s.name().to_string())
            .collect()
    };
    // A GEMM with its bias+relu: three tiled sketches, as in Ansor.
    let dense = w::dense_bias_relu(64, 64, 64).expect("dense");
    assert_eq!(
        names(&dense),
        [
            "tile+cache_write",
            "tile+cache_write+fuse_epilogue",
            "tile",
            "default"
        ]
    );
    // The epilogue through an inlined elementwise stage (bias add, then relu) is found too.
    assert_eq!(
        names(&mm_bias_relu(8, 8, 8)),
        [
            "tile+cache_write",
            "tile+cache_write+fuse_epilogue",
            "tile",
            "default"
        ]
    );
    // Two tiled stages: every combination, named by stage.
    assert_eq!(
        names(&two_matmuls(64, 64, 64, 64)),
        [
            "tile+cache_write@matmul+tile+cache_write@matmul_1",
            "tile+cache_write@matmul+tile@matmul_1",
            "tile@matmul+tile+cache_write@matmul_1",
            "tile@matmul+tile@matmul_1",
            "default"
        ]
    );
    // A bare GEMM: accumulator or not (its position is the compute_at knob). Last, the
    // default schedule's own structure with its tiles open.
    assert_eq!(
        names(&w::matmul(64, 64, 64).expect("mm")),
        ["tile+cache_write", "tile", "default"]
    );
    // Little output, long reduction: rfactor joins (and no default sketch: the default does
    // not tile a 3-wide output).
    assert_eq!(
        names(&w::matmul(2, 129, 3).expect("mm")),
        ["tile+cache_write", "tile", "rfactor"]
    );
    // A strided convolution reads its input at stride 2 along the output's last axis: a third
    // sketch vectorises the filter axis over a filter copy with that axis last.
    // (The filter copy must pay for itself: 16 multiply-adds per copied element at least.)
    let conv = w::conv2d(1, 3, 14, 14, 4, 3, 3, 2, 1, 1, 1).expect("conv2d");
    assert_eq!(
        names(&conv),
        [
            "tile+cache_write",
            "tile",
            "tile+cache_read+cache_write",
            "default"
        ]
    );
    // So does a row that leaves vector lanes idle (6 pixels) beside a wider filter axis...
    let conv = w::conv2d(1, 3, 7, 6, 16, 3, 3, 1, 1, 1, 1).expect("conv2d");
    assert_eq!(
        names(&conv),
        [
            "tile+cache_write",
            "tile",
            "tile+cache_read+cache_write",
            "default"
        ]
    );
    // ...while a row that fills its vectors (64 pixels) keeps its own.
    let conv = w::conv2d(1, 3, 8, 64, 16, 3, 3, 1, 1, 1, 1).expect("conv2d");
    assert_eq!(names(&conv), ["tile+cache_write", "tile", "default"]);
    let sm = w::softmax(3, 48).expect("softmax");
    assert_eq!(
        names(&sm),
        [
            "simple",
            "rfactor@softmax_sum",
            "rfactor@softmax_max",
            "rfactor@softmax_max+rfactor@softmax_sum"
        ]
    );
    // Large rows: no rfactor.
    assert_eq!(names(&w::softmax(512, 48).expect("softmax")), ["simple"]);
    // Every sketch of a task is distinct.
    for case in cases() {
        let n = names(&case.graph);
        let mut d = n.clone();
        d.dedup();
        assert_eq!(n, d, "{}", case.name);
    }
    let task = Task::new("dense", dense.clone(), 2.0);
    assert_eq!(task.key(), dense.workload_key());
}

#[test]
fn knobs_describe_the_space() {
    let target = Variant::Avx2.cpu_target("x86_64", 8);
    let g = w::dense_bias_relu(56, 257, 129).expect("dense");
    let sk = generate_sketches(&g, &target);
    let k = sk[1].knobs();
    assert_eq!(k.tiled_axes, vec![(56, 4), (129, 4), (257, 2)]);
    assert_eq!(k.compute_at_choices, 4);
    assert_eq!(k.parallel_max, 4);
    assert_eq!(k.unroll_choices, UNROLL_STEPS.len());
    assert_eq!(k.vector_choices, 4);
    // Samples respect the accumulator limit and the tile shapes, and use non-dividing tiles
    // sometimes.
    let mut rng = Rng::new(5);
    let mut guarded = 0;
    for _ in 0..200 {
        let p = sk[1].sample(1, &mut rng);
        assert!(sk[1].to_schedule(&p).is_ok());
        for (t, &(e, levels)) in p.tiles.iter().zip(&k.tiled_axes) {
            assert_eq!(t.len() + 1, levels);
            if e % t.iter().product::<usize>() != 0 {
                guarded += 1;
            }
        }
    }
    assert!(guarded > 5, "only {guarded} non-dividing tilings");
}

#[test]
fn invalid_params_are_rejected() {
    let g = w::dense_bias_relu(6, 10, 32).expect("dense");
    let sk = &generate_sketches(&g, &CpuTarget::portable())[1];
    let p = sk.sample(1, &mut Rng::new(9));
    let k = sk.knobs();
    let variants = [
        Params {
            tiles: p.tiles[1..].to_vec(),
            ..p.clone()
        },
        Params {
            tiles: vec![vec![7, 1, 1], vec![1, 1, 1], vec![1]],
            ..p.clone()
        },
        Params {
            tiles: vec![vec![1, 1], vec![1, 1, 1], vec![1]],
            ..p.clone()
        },
        Params {
            compute_at: k.compute_at_choices,
            ..p.clone()
        },
        Params {
            parallel: k.parallel_max + 1,
            ..p.clone()
        },
        Params {
            unroll: k.unroll_choices,
            ..p.clone()
        },
        Params {
            vector: k.vector_choices,
            ..p.clone()
        },
    ];
    for v in &variants {
        assert!(sk.to_schedule(v).is_err(), "{v:?} accepted");
    }
    // The accumulator stays within lower::MAX_ACC_ELEMS: 128 x 64 elements at the end of S1
    // (compute_at 0) is too many, at the end of S2 (compute_at 1) it holds 2 x 1.
    let big = w::matmul(128, 8, 128).expect("mm");
    let sk = &generate_sketches(&big, &CpuTarget::portable())[0];
    let mut p = Params {
        sketch: 0,
        tiles: vec![vec![1, 64, 2], vec![1, 64, 1], vec![1]],
        compute_at: 0,
        parallel: 0,
        unroll: 0,
        vector: 0,
    };
    assert!(sk.to_schedule(&p).is_err());
    p.compute_at = 1;
    assert!(sk.to_schedule(&p).is_ok());
    // Rfactor needs a factor that divides the reduction.
    let mm = w::matmul(2, 129, 3).expect("mm");
    let rf = &generate_sketches(&mm, &CpuTarget::portable())[2];
    assert_eq!(rf.name(), "rfactor");
    let p = rf.sample(2, &mut Rng::new(1));
    for t in [vec![2, 2], vec![1, 1], vec![43, 3]] {
        assert!(rf
            .to_schedule(&Params {
                tiles: vec![t],
                ..p.clone()
            })
            .is_err());
    }
    assert!(rf
        .to_schedule(&Params {
            tiles: vec![vec![1, 43]],
            ..p
        })
        .is_ok());
}

#[test]
fn params_serialise() {
    let sk = &generate_sketches(&matmul(8, 12, 10, true), &CpuTarget::portable())[1];
    let p = sk.sample(1, &mut Rng::new(3));
    let json = serde_json::to_string(&p).expect("serialise");
    let back: Params = serde_json::from_str(&json).expect("deserialise");
    assert_eq!(back, p);
}

/// The (extent, kind) of every loop of a program with more than one iteration, in order.
fn loop_shape(p: &Program) -> Vec<(usize, LoopKind)> {
    fn walk(stmts: &[Stmt], out: &mut Vec<(usize, LoopKind)>) {
        for s in stmts {
            match s {
                Stmt::For {
                    extent, kind, body, ..
                } => {
                    if *extent > 1 {
                        out.push((*extent, *kind));
                    }
                    walk(body, out);
                }
                Stmt::If { body, .. } => walk(body, out),
                _ => {}
            }
        }
    }
    let mut out = Vec::new();
    for n in &p.nests {
        walk(&n.body, &mut out);
    }
    out
}

#[test]
fn the_default_schedule_is_in_the_space() {
    // The default GEMM schedule for the portable target (8 lanes): a 4 x 16 register tile (rows
    // unrolled, columns vectorised) accumulated over the whole reduction, 16 x 4 such tiles
    // around it, the (unit) outer loops fused in parallel. In SSRSRS terms: S0 = 1 x 1,
    // S1 = 16 x 4, R0 = 1, S2 = 1 x 1, R1 = 64, S3 = 4 x 16, accumulator at the end of S2.
    let g = w::matmul(64, 64, 64).expect("mm");
    let target = CpuTarget::portable();
    let default = lower(&g, &default_schedule(&g, &target)).expect("default lowers");
    let sk = &generate_sketches(&g, &target)[0];
    assert_eq!(sk.name(), "tile+cache_write");
    let p = Params {
        sketch: 0,
        tiles: vec![vec![16, 1, 4], vec![4, 1, 16], vec![64]],
        compute_at: 1,
        parallel: 2,
        unroll: 2,
        vector: 2,
    };
    let sched = sk.to_schedule(&p).expect("valid");
    let ours = lower(&g, &sched).expect("lowers");
    // The same loops; the default runs its two block loops panels-outside-rows, which the
    // SSRSRS order (rows first at each level) does not: the "default" sketch reproduces it.
    assert_eq!(sorted(loop_shape(&ours)), sorted(loop_shape(&default)));
    Case::new("matmul 64", g.clone()).check(&sched);
    assert_default_sketch_reproduces(&g, &target);
}

/// `shape` in a fixed order: the same loops, whatever their nesting.
fn sorted(mut shape: Vec<(usize, LoopKind)>) -> Vec<(usize, LoopKind)> {
    shape.sort_by_key(|&(e, k)| (e, format!("{k:?}")));
    shape
}

/// The "default" sketch's default point lowers to exactly the default schedule's loops.
fn assert_default_sketch_reproduces(g: &harl_te::Graph, target: &CpuTarget) {
    let default = lower(g, &default_schedule(g, target)).expect("default lowers");
    let sketches = generate_sketches(g, target);
    let (i, sk) = sketches
        .iter()
        .enumerate()
        .find(|(_, sk)| sk.name() == "default")
        .expect("the default sketch");
    let p = sk.default_params(i, target).expect("a default point");
    let ours = lower(g, &sk.to_schedule(&p).expect("valid")).expect("lowers");
    assert_eq!(loop_shape(&ours), loop_shape(&default), "{p:?}");
}

#[test]
fn samples_exercise_every_step_and_emit() {
    use harl_build::codegen::{emit_module, KernelMeta, VariantProgram};
    let mut kinds = std::collections::BTreeSet::new();
    let mut rng = Rng::new(11);
    for case in cases() {
        for target in targets() {
            for (i, sk) in generate_sketches(&case.graph, &target).iter().enumerate() {
                let mut distinct = std::collections::HashSet::new();
                // Sixteen draws: a small space (a depthwise convolution's 7-pixel plane) can
                // repeat points within eight.
                for _ in 0..16 {
                    let p = sk.sample(i, &mut rng);
                    let sched = sk.to_schedule(&p).expect("valid");
                    for st in &sched.steps {
                        let kind = format!("{st:?}");
                        kinds.insert(kind.split([' ', '{']).next().unwrap_or("").to_string());
                    }
                    distinct.insert(p);
                }
                // Sampling explores (it does not fall back to one safe point).
                assert!(
                    distinct.len() >= 5,
                    "{}/{}: {distinct:?}",
                    case.name,
                    sk.name()
                );
            }
        }
        // Codegen takes every sketch's schedules: the emitted module parses.
        let target = CpuTarget::portable();
        let variants: Vec<VariantProgram> = generate_sketches(&case.graph, &target)
            .iter()
            .enumerate()
            .map(|(i, sk)| {
                let sched = sk.to_schedule(&sk.sample(i, &mut rng)).expect("valid");
                VariantProgram {
                    variant: Variant::Base,
                    program: lower(&case.graph, &sched).expect("lowers"),
                    source: sk.name().to_string(),
                }
            })
            .collect();
        let meta = KernelMeta {
            name: "k".into(),
            params: (0..case.graph.inputs.len())
                .map(|j| format!("p{j}"))
                .collect(),
            output: "out".into(),
        };
        for v in variants {
            let src = emit_module(&case.graph, std::slice::from_ref(&v), &meta);
            if let Err(e) = syn::parse_file(&src) {
                panic!(
                    "{} / {}: emitted code does not parse: {e}",
                    case.name, v.source
                );
            }
        }
    }
    for k in [
        "Split",
        "Reorder",
        "Fuse",
        "CacheWrite",
        "ComputeAt",
        "ComputeInline",
        "Rfactor",
        "CacheRead",
        "Parallel",
        "Vectorize",
        "Unroll",
    ] {
        assert!(kinds.contains(k), "no {k} step sampled: {kinds:?}");
    }
}

#[test]
fn default_params_give_the_default_loops() {
    // The tuner's seeds: in each sketch, the point that reproduces the default schedule's loops
    // (register tile, cache blocks, parallel outer loops), including a cache-blocked reduction
    // (k = 512 > 256) and a convolution. (A 512-wide activation `B` is read in panels copied
    // per call, `layout::panel_input`, which only the "default" sketch reproduces: the blocked
    // reduction here has 128-wide rows.)
    let target = Variant::Avx512.cpu_target("x86_64", 2);
    let graphs = [
        w::matmul(64, 64, 64).expect("mm"),
        w::matmul(256, 512, 128).expect("mm"),
        w::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1).expect("conv2d"),
        // A weight read in panels, by the default and by the sketch's seed alike.
        weights(w::matmul(64, 256, 512).expect("mm"), &[1]),
    ];
    for g in graphs {
        let schedule = default_schedule(&g, &target);
        let default = lower(&g, &schedule).expect("default lowers");
        // A default in a layout (the 56-pixel rows of the convolution) is the layout
        // sketch's seed.
        let layout = schedule.steps.iter().any(|s| {
            matches!(
                s,
                Step::CacheRead {
                    panel: None | Some(_),
                    ..
                }
            )
        }) && !g.inputs.iter().any(|i| i.constant);
        let panels = schedule
            .steps
            .iter()
            .any(|s| matches!(s, Step::CacheRead { panel: Some(_), .. }));
        assert_eq!(panels, g.inputs.iter().any(|i| i.constant), "{schedule:?}");
        let want = if layout {
            "tile+cache_read+cache_write"
        } else {
            "tile+cache_write"
        };
        let sketches = generate_sketches(&g, &target);
        let (i, sk) = sketches
            .iter()
            .enumerate()
            .find(|(_, sk)| sk.name() == want)
            .expect("the sketch");
        let p = sk.default_params(i, &target).expect("a default point");
        let ours = lower(&g, &sk.to_schedule(&p).expect("valid")).expect("lowers");
        // The reduction's nest (a padding stage before it takes the sketch's unroll knob,
        // which the default leaves alone).
        let reduction = |p: &Program| {
            let mut p = p.clone();
            p.nests = p.nests.split_off(p.nests.len() - 1);
            loop_shape(&p)
        };
        // The same loops (the default nests its two block loops panels-outside-rows, the
        // SSRSRS sketches rows-first); the "default" sketch reproduces the order too.
        assert_eq!(
            sorted(reduction(&ours)),
            sorted(reduction(&default)),
            "{p:?}"
        );
        assert_default_sketch_reproduces(&g, &target);
        // The same copies (layout and panels) before it.
        assert_eq!(ours.graph.stages.len(), default.graph.stages.len(), "{p:?}");
        assert_eq!(
            ours.graph
                .stages
                .iter()
                .map(|s| &s.shape)
                .collect::<Vec<_>>(),
            default
                .graph
                .stages
                .iter()
                .map(|s| &s.shape)
                .collect::<Vec<_>>()
        );
    }
}

#[test]
fn default_params_match_the_interpreter() {
    let mut seen = 0;
    for case in cases() {
        for target in targets() {
            for (i, sk) in sketches(case, &target).iter().enumerate() {
                if let Some(p) = sk.default_params(i, &target) {
                    case.check(&sk.to_schedule(&p).expect("default_params are valid"));
                    seen += 1;
                }
            }
        }
    }
    assert!(seen >= cases().len(), "only {seen} default points");
}

/// Nested unrolled loops multiply their body: before codegen's unroll byte budget a sampled
/// transposed-convolution candidate came to 1.26 MB of source (a batch of them ran past the
/// measurer's 10-minute build limit). Under the budget every sample stays far below that.
#[test]
fn sampled_candidates_emit_bounded_source() {
    use harl_build::codegen::{emit_module, KernelMeta, VariantProgram};
    let g = w::conv2d_transpose(1, 512, 4, 4, 256, 4, 4, 2, 1, 1).expect("conv2d_transpose");
    let target = Variant::Avx2.cpu_target("x86_64", 1);
    let sketches = generate_sketches(&g, &target);
    let meta = KernelMeta {
        name: "k".into(),
        params: vec!["x".into(), "w".into()],
        output: "out".into(),
    };
    let mut rng = Rng::new(7);
    let mut largest = 0;
    for k in 0..200 {
        let i = k % sketches.len();
        let p = sketches[i].sample(i, &mut rng);
        let program = lower(&g, &sketches[i].to_schedule(&p).expect("schedule")).expect("lowers");
        let variants = [VariantProgram {
            variant: Variant::Avx2,
            program,
            source: "sampled".into(),
        }];
        largest = largest.max(emit_module(&g, &variants, &meta).len());
    }
    assert!(largest < 256 * 1024, "{largest} bytes");
}

#[test]
fn the_default_sketch_starts_at_the_default_and_moves_its_tiles() {
    // The default sketch's seed is the default schedule itself (layouts, weight panels and
    // epilogues included); its tile moves give other schedules that still compute the same.
    let target = Variant::Avx512.cpu_target("x86_64", 2);
    let graphs = [
        ("matmul 48x96x80", w::matmul(48, 96, 80).expect("mm")),
        (
            "weights 32x64x96",
            weights(w::matmul(32, 64, 96).expect("mm"), &[1]),
        ),
        (
            "gemv 1x96x128",
            weights(w::matmul(1, 96, 128).expect("mm"), &[1]),
        ),
        (
            "conv 14x14",
            weights(
                w::conv2d(1, 8, 14, 14, 32, 3, 3, 1, 1, 1, 1).expect("conv"),
                &[1],
            ),
        ),
        (
            "conv s2",
            weights(
                w::conv2d(1, 8, 14, 14, 32, 3, 3, 2, 1, 1, 1).expect("conv"),
                &[1],
            ),
        ),
        (
            "dense+bias+relu",
            w::dense_bias_relu(24, 40, 64).expect("dense"),
        ),
    ];
    for (name, g) in graphs {
        let case = Case::new(name, g.clone());
        let sketches = generate_sketches(&g, &target);
        let (i, sk) = sketches
            .iter()
            .enumerate()
            .find(|(_, sk)| sk.name() == DEFAULT_SKETCH)
            .unwrap_or_else(|| panic!("{name}: no default sketch"));
        let p = sk.default_params(i, &target).expect("a default point");
        let seed = sk.to_schedule(&p).expect("valid");
        assert_eq!(seed, default_schedule(&g, &target), "{name}");
        let moves = harl_moves(sk, &p);
        assert!(!moves.is_empty(), "{name}: no move from the default");
        for q in &moves {
            let s = sk.to_schedule(q).expect("a move is valid");
            assert_ne!(s, seed, "{name}: a move that changes nothing");
            case.check(&s);
        }
        // Tiles that do not divide their axis are refused (the default's tiles are exact).
        let mut bad = p.clone();
        bad.tiles[0][0] = g.stages.iter().map(|s| s.size()).max().unwrap_or(1) + 1;
        assert!(sk.to_schedule(&bad).is_err(), "{name}");
    }
}
