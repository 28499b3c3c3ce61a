//! Emitted Rust, compiled by cargo and run, computes what the reference interpreter computes:
//! default schedules and random legal schedules, on every ISA multiversion this CPU has.

mod common;

use common::*;
use harl_build::codegen::{emit_module, KernelMeta, Variant, VariantProgram};
use harl_build::default_schedule::{default_schedule, CpuTarget};
use harl_build::lower::lower;
use harl_build::schedule::Schedule;
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
        w::dense_bias_relu(5, 8, 32).expect("dense"),
        f64_math(),
        i32_arith(),
    ];
    let mut out = Vec::new();
    for (gi, g) in graphs.iter().enumerate() {
        let mut schedules = vec![
            default_schedule(g, &CpuTarget::host()),
            default_schedule(g, &CpuTarget::portable()),
        ];
        schedules.extend((0..4).map(|s| random_schedule(g, (gi * 100 + s) as u64, 30)));
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
    out
}

fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Writes a crate that runs every case and prints each output on one line.
fn write_crate(dir: &Path, cases: &[Case]) {
    let root = workspace_root();
    std::fs::create_dir_all(dir.join("src")).expect("mkdir");
    let manifest = format!(
        "[package]\nname = \"codegen-check\"\nversion = \"0.0.0\"\nedition = \"2021\"\n\n[dependencies]\nharl = {{ path = {:?} }}\n\n[workspace]\n",
        root.display().to_string()
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
            let vals: Vec<String> = input
                .iter()
                .map(|v| {
                    if it == "i32" {
                        format!("{}", *v as i64)
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
    }
    main.push_str("}\n");
    std::fs::write(dir.join("src/main.rs"), main).expect("write main");
}

#[test]
fn emitted_kernels_match_the_interpreter_on_every_isa() {
    let cases = cases();
    let dir = tempfile::tempdir().expect("tempdir");
    write_crate(dir.path(), &cases);
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let target = workspace_root().join("target").join("codegen-check");
    let build = Command::new(&cargo)
        .args(["build", "--quiet", "--manifest-path"])
        .arg(dir.path().join("Cargo.toml"))
        .env("CARGO_TARGET_DIR", &target)
        .status()
        .expect("run cargo");
    assert!(build.success(), "generated code failed to compile");
    let exe = target.join("debug").join("codegen-check");
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
        for (i, (line, case)) in lines.iter().zip(&cases).enumerate() {
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
