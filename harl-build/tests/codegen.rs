//! Emitted Rust, compiled by cargo and run, computes what the reference interpreter computes:
//! default schedules and random legal schedules, on every ISA multiversion this CPU has.

mod common;

use common::*;
use harl_build::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::lower::lower;
use harl_build::schedule::{Schedule, Step};
use harl_te::ops::workloads as w;
use harl_te::{interp, Graph};
use std::fmt::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

struct Case {
    graph: Graph,
    schedule: Schedule,
    inputs: Vec<Vec<f64>>,
    want: Vec<f64>,
}

fn cases() -> Vec<Case> {
    let graphs = [
        matmul(7, 9, 13, true),
        matmul(16, 32, 48, false),
        w::conv2d(1, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1).expect("conv2d"),
        w::conv2d(1, 4, 7, 7, 4, 3, 3, 2, 1, 1, 4).expect("depthwise"),
        w::conv2d_transpose(1, 3, 3, 3, 2, 4, 4, 2, 1, 1).expect("conv2d_transpose"),
        w::softmax(3, 20).expect("softmax"),
        w::layer_norm(3, 16).expect("layer_norm"),
        // Enough rows for row fusion (`compute_within`), rows long enough for vector lanes:
        // the lanes' horizontal reductions in every variant's widths.
        w::softmax(9, 80).expect("softmax"),
        w::layer_norm(8, 64).expect("layer_norm"),
        // A depthwise convolution within its padding, channel by channel, its stride-2 reads
        // as vector loads and permutes.
        w::depthwise_conv2d(1, 8, 11, 11, 3, 3, 2, 1, 1).expect("depthwise s2"),
        w::dense_bias_relu(5, 8, 32).expect("dense"),
        f64_math(),
        i32_arith(),
        // Weights: `prepare` hoists what depends on them alone (the strided convolution's
        // filter layout in panels, 24 filters on AVX-512 and 16 on AVX2, in the default
        // schedule; cache_reads in random schedules).
        weights(
            w::conv2d(1, 8, 9, 9, 48, 3, 3, 2, 1, 1, 1).expect("strided conv"),
            &[1],
        ),
        weights(w::dense_bias_relu(5, 8, 32).expect("dense"), &[1, 2]),
        // Copies made on every call in the default schedule: a 1x1 convolution's input with
        // its channels next to its 7-pixel rows beside a filter layout in panels, the same
        // input copy under a plain tile of 16-pixel rows, and a GEMM's activation in panels
        // (`layout::row_copy`, `layout::panel_input`).
        weights(
            w::conv2d(1, 4, 7, 7, 256, 1, 1, 1, 0, 1, 1).expect("1x1 conv, 7-pixel rows"),
            &[1],
        ),
        w::conv2d(1, 4, 2, 16, 256, 1, 1, 1, 0, 1, 1).expect("1x1 conv, 16-pixel rows"),
        matmul(32, 16, 256, false),
        // A 1x1 convolution of stride 2: its input copy holds every second pixel of every
        // second row (`layout::sample_factors`), under the default's filter panels and under
        // random schedules' cache_reads.
        weights(
            w::conv2d(1, 16, 14, 14, 256, 1, 1, 2, 0, 1, 1).expect("1x1 conv, stride 2"),
            &[1],
        ),
        w::conv2d(1, 3, 10, 10, 8, 1, 1, 2, 0, 1, 1).expect("small 1x1 conv, stride 2"),
        // A GEMV with its weight in four panels read side by side (`thin_streams`).
        weights(w::dense_bias_relu(1, 24, 128).expect("gemv"), &[1, 2]),
        // Bias and ReLU6 computed in the depthwise convolution's write-back, within its
        // padding's rows (`loop_ir::Epilogue`), the padded planes one at a time per thread
        // (`Program::fold`).
        depthwise_bias_relu6(8, 32, 1),
        // Stride 2: the padded rows split into their phases, each tap one contiguous load.
        depthwise_bias_relu6(8, 32, 2),
        // Rows that whole vectors do not divide end in one masked vector (`masked_tail`):
        // 7-pixel rows of a stride-2 depthwise convolution (their stride-2 reads masked too),
        // and GEMM rows of 10 and 11 columns (8 whole lanes, then 2 and 3 masked).
        depthwise_bias_relu6(8, 14, 2),
        matmul(3, 5, 10, false),
        matmul(6, 4, 11, true),
        // On AVX-512 a remainder of more than 8 lanes is one masked 16-lane vector
        // (`masked_wide_tail`): 14-pixel rows of a stride-2 depthwise convolution (a masked
        // 16-lane stride-2 read in its phase copy), 28 pixels at stride 1 (16 + a masked 12),
        // GEMM rows of 25 (16 + a masked 9, the accumulator's rows padded to 32).
        depthwise_bias_relu6(8, 28, 2),
        depthwise_bias_relu6(4, 28, 1),
        matmul(3, 7, 25, true),
        // Filter-layout tiles of 7 and 8 pixels written back through 8 x 8 transposes with
        // their bias and ReLU6 (`simd::transposed_write_back`; the 7-pixel rows' stores
        // masked), a stride-2 one like a network's stem.
        conv_bias_relu6(8, 7, 16, 1),
        conv_bias_relu6(3, 16, 32, 2),
        // Small planes read in place on AVX-512 (`default_schedule::padding_read_in_place`):
        // the padding inlined, its reads masked loads and its bounds lane masks
        // (`simd::bounded_load`, `lane_mask`); a 7x7 plane, and a 5x5 kernel with padding 2
        // over a 6x6 plane.
        depthwise_bias_relu6(8, 7, 1),
        w::depthwise_conv2d(1, 8, 6, 6, 5, 5, 1, 2, 1).expect("depthwise 5x5"),
        // Stride 2 in place: the phases' masked stride-2 reads, 7 and 5 output pixels a row.
        w::depthwise_conv2d(1, 8, 14, 14, 3, 3, 2, 1, 1).expect("depthwise s2 in place"),
        w::depthwise_conv2d(1, 8, 9, 9, 3, 3, 2, 1, 1).expect("depthwise s2 in place, odd"),
        // Global pools: the 7x7 and 5x5 reduce loops fused into one vector loop whose index,
        // `v / 7 * 7 + v % 7`, recombines into `v` (`simplify::recombine`), a horizontal
        // reduction per vector (`default_schedule::contiguous_reduction`).
        global_pool(24, 7, 7, harl_te::ReduceOp::Sum),
        global_pool(9, 5, 5, harl_te::ReduceOp::Max),
        // Weight panels over 1 MB: each reduction step prefetches the next panel's line
        // (`simd::stream_prefetches`; its address may lie past the buffer's end).
        weights(matmul(16, 512, 544, false), &[1]),
        // Reductions split into blocks of 256 around the accumulator: the first block's sums
        // stored, the middle ones added, the last one's bias, ReLU or GELU computed in its
        // write-back from the stored sums plus its own (`Lowering::wrap_acc`); three blocks
        // and two.
        dense_bias_gelu(4, 768, 32),
        w::dense_bias_relu(3, 768, 48).expect("dense"),
        weights(w::dense_bias_relu(4, 512, 40).expect("dense"), &[1, 2]),
    ];
    let mut out = Vec::new();
    for (gi, g) in graphs.iter().enumerate() {
        let mut schedules = vec![
            default_schedule(g, &CpuTarget::host()),
            default_schedule(g, &CpuTarget::portable()),
        ];
        schedules.extend((0..4).map(|s| random_schedule(g, (gi * 100 + s) as u64, 30)));
        // A GPU schedule in a CPU cache file (block and thread bindings, shared staging) is
        // hostile but lowers: the CPU code must run its bound loops serially and be right.
        if let Some(sk) = harl_build::gpu_sketch::GpuSketch::new(g) {
            if let Ok(gpu) = sk.to_schedule(&sk.default_params()) {
                schedules.push(gpu);
            }
        }
        for schedule in schedules {
            let inputs = data(g, gi as u64 + 7);
            let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
            let want = interp::run(g, &refs).expect("interpreter");
            out.push(Case {
                graph: g.clone(),
                schedule,
                inputs,
                want,
            });
        }
    }
    // Six schedules a graph, plus GPU ones for most.
    assert!(out.len() > 6 * graphs.len() + 4, "{} cases", out.len());
    out
}

/// `g` with inputs `which` marked as weights.
fn weights(mut g: Graph, which: &[usize]) -> Graph {
    for &i in which {
        g.inputs[i].constant = true;
    }
    g
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Inputs with more elements than this are written as bytes, not as a literal.
const LITERAL_MAX: usize = 4096;

/// Writes a crate that runs every case and prints each output on one line.
fn write_crate(dir: &Path, cases: &[Case], package: &str) {
    let root = workspace_root();
    std::fs::create_dir_all(dir.join("src")).expect("mkdir");
    let manifest = format!(
        "[package]\nname = \"{package}\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\nharl = {{ path = {:?} }}\n\n[workspace]\n",
        root.display().to_string(),
    );
    std::fs::write(dir.join("Cargo.toml"), manifest).expect("write manifest");
    let mut main = String::from("#![allow(clippy::all)]\n");
    for (i, c) in cases.iter().enumerate() {
        let program = lower(&c.graph, &c.schedule).expect("legal schedule");
        let meta = KernelMeta {
            name: format!("k{i}"),
            params: (0..c.graph.inputs.len()).map(|j| format!("x{j}")).collect(),
            output: "out".into(),
        };
        // Every variant gets the case's schedule, so each ISA runs it.
        let variants: Vec<VariantProgram> = Variant::ALL
            .into_iter()
            .map(|variant| VariantProgram {
                variant,
                program: program.clone(),
                source: "test".into(),
            })
            .collect();
        std::fs::write(
            dir.join(format!("src/k{i}.rs")),
            emit_module(&c.graph, &variants, &meta),
        )
        .expect("write kernel");
        let _ = writeln!(
            main,
            "#[allow(warnings)] mod k{i} {{ include!(\"k{i}.rs\"); }}"
        );
    }
    main.push_str("fn main() {\n");
    for (i, c) in cases.iter().enumerate() {
        let ty = c.graph.stages.last().map_or("f32", |s| s.dtype.rust_name());
        let mut args = Vec::new();
        for (j, input) in c.inputs.iter().enumerate() {
            let it = c.graph.inputs[j].dtype.rust_name();
            if it == "f32" && input.len() > LITERAL_MAX {
                // A large input as bytes beside the source: a literal of this size takes
                // rustc minutes.
                let bytes: Vec<u8> = input
                    .iter()
                    .flat_map(|v| (*v as f32).to_le_bytes())
                    .collect();
                std::fs::write(dir.join(format!("src/x{i}_{j}.bin")), bytes).expect("write input");
                let _ = writeln!(
                    main,
                    "    let x{i}_{j}: Vec<f32> = include_bytes!(\"x{i}_{j}.bin\").chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect();"
                );
                args.push(format!("&x{i}_{j}"));
                continue;
            }
            let vals: Vec<String> = input
                .iter()
                .map(|v| {
                    if it == "i32" {
                        format!("{}", *v as i64)
                    } else if v.is_nan() {
                        format!("{it}::NAN")
                    } else {
                        format!("{v:?}")
                    }
                })
                .collect();
            let _ = writeln!(
                main,
                "    let x{i}_{j}: Vec<{it}> = vec![{}];",
                vals.join(", ")
            );
            args.push(format!("&x{i}_{j}"));
        }
        let _ = writeln!(
            main,
            "    let mut o{i} = vec![0 as {ty}; {}];\n    k{i}::run({}, &mut o{i}).expect(\"lengths\");\n    println!(\"{{}}\", o{i}.iter().map(|v| format!(\"{{:?}}\", v)).collect::<Vec<_>>().join(\" \"));",
            c.want.len(),
            args.join(", ")
        );
        if c.graph.inputs.iter().any(|p| p.constant) {
            // The prepared kernel, called twice, computes what `run` does, bit for bit.
            let pick = |constant: bool| -> Vec<String> {
                (0..c.inputs.len())
                    .filter(|&j| c.graph.inputs[j].constant == constant)
                    .map(|j| format!("&x{i}_{j}"))
                    .collect()
            };
            let (weights, others) = (pick(true).join(", "), pick(false).join(", "));
            let _ = writeln!(
                main,
                "    let p{i} = k{i}::prepare({weights}).expect(\"lengths\");\n    for _ in 0..2 {{\n        let mut q = vec![0 as {ty}; {n}];\n        p{i}.run({others}, &mut q).expect(\"lengths\");\n        assert_eq!(format!(\"{{:?}}\", q), format!(\"{{:?}}\", o{i}), \"case {i}: the prepared kernel differs from run\");\n    }}",
                n = c.want.len(),
            );
        }
    }
    main.push_str("}\n");
    std::fs::write(dir.join("src/main.rs"), main).expect("write main");
}

#[test]
fn emitted_kernels_match_the_interpreter_on_every_isa() {
    check_compiled(&cases(), "codegen-check");
}

/// Compiles every case into one crate named `package`, runs it on each ISA this machine has
/// (the dispatcher picks AVX-512, AVX2 or the baseline; `HARL_ISA` caps it) and compares
/// every output element with the interpreter.
fn check_compiled(cases: &[Case], package: &str) {
    let dir = tempfile::tempdir().expect("tempdir");
    write_crate(dir.path(), cases, package);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = workspace_root().join("target").join("codegen-check");
    let build = Command::new(&cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(dir.path().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run cargo");
    assert!(build.success(), "generated code failed to compile");
    let exe = target.join("debug").join(package);
    for isa in ["native", "avx2", "baseline"] {
        let out = Command::new(&exe)
            .env("HARL_ISA", isa)
            .output()
            .expect("run kernels");
        assert!(
            out.status.success(),
            "{isa}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).expect("utf8");
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), cases.len());
        for (i, (line, case)) in lines.iter().zip(cases).enumerate() {
            let got: Vec<f64> = line
                .split(' ')
                .map(|v| v.parse().expect("number"))
                .collect();
            let terms = case
                .graph
                .stages
                .iter()
                .filter_map(|s| s.reduce.as_ref())
                .map(|r| r.extents.iter().product::<usize>())
                .max()
                .unwrap_or(1);
            assert_close(
                &got,
                &case.want,
                1e-6 * (terms as f64).max(10.0),
                &format!("{isa} case {i} {:?}", case.schedule.steps),
            );
        }
    }
}

/// Random step lists, legal and illegal: a legal schedule with random edits (a step inserted,
/// replaced or removed; any field may be 0, small, 2^32 or usize::MAX). Lowering must reject
/// or accept each without panicking; every accepted one is compiled and checked element by
/// element on every ISA. Seeded, so a failure replays.
#[test]
fn random_legal_and_illegal_schedules_lower_or_fail_cleanly_and_compute_what_the_interpreter_does()
{
    use proptest::prelude::*;
    use proptest::test_runner::{Config, RngAlgorithm, TestRng, TestRunner};

    fn field() -> impl Strategy<Value = usize> {
        prop_oneof![
            12 => 0..8usize,
            1 => Just(0usize),
            1 => Just(1usize << 32),
            1 => Just(usize::MAX),
            1 => any::<usize>(),
        ]
    }
    fn step() -> impl Strategy<Value = Step> {
        let factors = proptest::collection::vec(field(), 0..4);
        prop_oneof![
            (field(), field(), factors).prop_map(|(stage, at, factors)| Step::Split {
                stage,
                at,
                factors
            }),
            (field(), proptest::collection::vec(field(), 0..8))
                .prop_map(|(stage, order)| Step::Reorder { stage, order }),
            (field(), field()).prop_map(|(stage, at)| Step::Fuse { stage, at }),
            (field(), field(), field()).prop_map(|(stage, target, at)| Step::ComputeAt {
                stage,
                target,
                at
            }),
            (field(), field(), field()).prop_map(|(stage, target, at)| Step::ComputeWithin {
                stage,
                target,
                at
            }),
            field().prop_map(|stage| Step::ComputeInline { stage }),
            field().prop_map(|stage| Step::Slide { stage }),
            (field(), field()).prop_map(|(stage, at)| Step::CacheWrite { stage, at }),
            (field(), field()).prop_map(|(stage, factor)| Step::Rfactor { stage, factor }),
            (
                field(),
                field(),
                proptest::collection::vec(field(), 0..5),
                proptest::option::of(field())
            )
                .prop_map(|(stage, input, order, panel)| Step::CacheRead {
                    stage,
                    input,
                    order,
                    panel
                }),
            (field(), field()).prop_map(|(stage, at)| Step::Parallel { stage, at }),
            (field(), field()).prop_map(|(stage, at)| Step::Vectorize { stage, at }),
            (field(), field()).prop_map(|(stage, at)| Step::Unroll { stage, at }),
        ]
    }
    // (kind, position, step): 0 inserts, 1 replaces, 2 removes.
    let edits = proptest::collection::vec((0..3u8, any::<usize>(), step()), 0..4);
    let graphs = [
        matmul(7, 9, 13, true),
        w::conv2d(1, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1).expect("conv2d"),
        w::conv2d(1, 4, 7, 7, 4, 3, 3, 2, 1, 1, 4).expect("depthwise"),
        w::softmax(3, 20).expect("softmax"),
        w::layer_norm(3, 16).expect("layer_norm"),
        i32_arith(),
    ];
    let strategy = (0..graphs.len(), any::<u64>(), edits);
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 600,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let legal = std::cell::RefCell::new(Vec::new());
    let (accepted, rejected) = (std::cell::Cell::new(0usize), std::cell::Cell::new(0usize));
    runner
        .run(&strategy, |(gi, seed, edits)| {
            let graph = &graphs[gi];
            let mut schedule = random_schedule(graph, seed, 20);
            for (kind, pos, step) in edits {
                let n = schedule.steps.len();
                match kind {
                    0 => schedule.steps.insert(pos % (n + 1), step),
                    1 if n > 0 => schedule.steps[pos % n] = step,
                    _ if n > 0 => {
                        schedule.steps.remove(pos % n);
                    }
                    _ => {}
                }
            }
            match lower(graph, &schedule) {
                Ok(_) => {
                    accepted.set(accepted.get() + 1);
                    legal.borrow_mut().push((gi, schedule));
                }
                Err(e) => {
                    rejected.set(rejected.get() + 1);
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            Ok(())
        })
        .expect("lowering never panics");
    let (accepted, rejected) = (accepted.get(), rejected.get());
    eprintln!("{accepted} random schedules lowered, {rejected} were rejected");
    assert!(accepted >= 40 && rejected >= 40, "{accepted} / {rejected}");
    // Compile a spread of the accepted ones (all would take minutes to build).
    let legal = legal.into_inner();
    let step = (legal.len() / 40).max(1);
    let cases: Vec<Case> = legal
        .iter()
        .step_by(step)
        .take(40)
        .enumerate()
        .map(|(i, (gi, schedule))| {
            let graph = graphs[*gi].clone();
            let inputs = data(&graph, 1000 + i as u64);
            let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
            let want = interp::run(&graph, &refs).expect("interpreter");
            Case {
                graph,
                schedule: schedule.clone(),
                inputs,
                want,
            }
        })
        .collect();
    check_compiled(&cases, "codegen-random-check");
}

/// Max and min in vector loops keep Rust's NaN rule (the other operand wins), which the bare
/// instructions do not (they return their second operand): a row max over inputs with NaNs,
/// split into vector lanes by the default schedule, and an elementwise `max(0, x)` and
/// `min(x, 1)` with the NaN second.
#[test]
fn vector_min_max_follow_rusts_nan_rule() {
    use harl_te::{DType, Expr, GraphBuilder, ReduceOp, TensorRef};
    let load = |t: TensorRef, a: usize, b: usize| Expr::Load(t, vec![Expr::Axis(a), Expr::Axis(b)]);
    let mut g = GraphBuilder::new();
    let x = g.input("x", &[4, 64], DType::F32);
    g.reduce(
        "row_max",
        &[4],
        DType::F32,
        ReduceOp::Max,
        &[64],
        load(x, 0, 1),
    );
    let row_max = g.finish().expect("graph");
    let mut g = GraphBuilder::new();
    let x = g.input("x", &[4, 64], DType::F32);
    g.compute(
        "clip",
        &[4, 64],
        DType::F32,
        Expr::f32(0.0).max(load(x, 0, 1)).min(Expr::f32(1.0)),
    );
    let clip = g.finish().expect("graph");
    // The row max as one accumulator over a vectorised reduce loop: horizontal reductions of
    // vectors with NaN lanes (on AVX-512 one 16-lane chunk at a time, on AVX2 8).
    let horizontal = Schedule {
        steps: vec![
            Step::CacheWrite { stage: 0, at: 0 },
            Step::Vectorize { stage: 0, at: 1 },
        ],
    };
    let mut cases = Vec::new();
    for (graph, schedule) in [
        (row_max.clone(), None),
        (clip, None),
        (row_max, Some(horizontal)),
    ] {
        let mut inputs = data(&graph, 3);
        for v in inputs[0].iter_mut().step_by(5) {
            *v = f64::NAN;
        }
        let refs: Vec<&[f64]> = inputs.iter().map(|v| v.as_slice()).collect();
        let want = interp::run(&graph, &refs).expect("interpreter");
        assert!(want.iter().all(|v| !v.is_nan()), "the reference skips NaNs");
        cases.push(Case {
            schedule: schedule.unwrap_or_else(|| default_schedule(&graph, &CpuTarget::host())),
            graph,
            inputs,
            want,
        });
    }
    check_compiled(&cases, "harl_nan_check");
}
