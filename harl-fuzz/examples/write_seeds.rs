//! Regenerates the generated seeds of the committed corpus (`regressions/cache_line/seed-valid-*`
//! and `regressions/steps/seed-g*`) after a change to the schedule format or to the steps
//! target's input encoding: `cargo run -p harl-fuzz --example write_seeds`.

use std::path::Path;

fn main() {
    write_cache_line_seeds();
    write_steps_seeds();
}

/// Regenerates the valid cache-line seeds from the schedules harl itself writes: the default
/// schedule of each graph the target lowers against, for two CPUs, and the GPU sketch's default
/// schedule. Run after a change to the schedule format:
fn write_cache_line_seeds() {
    use harl_build::cache::Record;
    use harl_build::default_schedule::{default_schedule, CpuTarget};
    use harl_build::gpu_sketch::GpuSketch;
    use harl_build::target::TargetFingerprint;
    use harl_te::ops::workloads as w;

    let graphs = [
        ("matmul", w::matmul(16, 32, 16).unwrap()),
        (
            "conv2d",
            w::conv2d(1, 4, 8, 8, 8, 3, 3, 1, 1, 1, 1).unwrap(),
        ),
        ("softmax", w::softmax(4, 32).unwrap()),
        (
            "depthwise",
            w::depthwise_conv2d(1, 8, 10, 10, 3, 3, 2, 1, 1).unwrap(),
        ),
    ];
    let target = TargetFingerprint {
        arch: "x86_64".into(),
        isa_class: "x86_64-avx2".into(),
        features: vec!["avx2".into(), "fma".into()],
        cpu_model: "unknown".into(),
        cores: 4,
    };
    let avx512 = CpuTarget {
        vector_bytes: 64,
        acc_registers: 16,
        vector_registers: 32,
        threads: 8,
    };
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions/cache_line");
    let write = |name: String, graph: &harl_te::Graph, schedule| {
        let record = Record::new(
            graph.workload_key(),
            name.clone(),
            target.clone(),
            schedule,
            1e-4,
            64,
        );
        let line = serde_json::to_string(&record).unwrap();
        std::fs::write(dir.join(format!("seed-valid-{name}")), line).unwrap();
    };
    for (name, graph) in &graphs {
        write(
            format!("{name}-default"),
            graph,
            default_schedule(graph, &CpuTarget::portable()),
        );
        write(
            format!("{name}-avx512"),
            graph,
            default_schedule(graph, &avx512),
        );
        if let Some(sketch) = GpuSketch::new(graph) {
            if let Ok(s) = sketch.to_schedule(&sketch.default_params()) {
                write(format!("{name}-gpu"), graph, s);
            }
        }
    }
}

/// Writes one steps seed per graph and base (none, the default schedule for each CPU): the
/// structure-aware bytes are not written by hand, so the seeds are the smallest encodings of
/// those inputs, checked by decoding them back.
fn write_steps_seeds() {
    use arbitrary::{Arbitrary, Unstructured};
    use harl_fuzz::step_input::Base;
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("regressions/steps");
    // An enum variant is chosen by `(u32 * variants) >> 32`; these pick the i-th of n.
    let pick = |i: u64, n: u64| -> [u8; 4] { (((i << 32) / n + 1) as u32).to_le_bytes() };
    for graph in 0..14u8 {
        for (base, target, name) in [
            (0, 0, "naive"),
            (1, 0, "default-portable"),
            (1, 1, "default-avx512"),
            (1, 3, "default-narrow"),
        ] {
            let mut bytes = vec![graph];
            bytes.extend(pick(base, 3));
            if base == 1 {
                bytes.extend(pick(target, 4));
            }
            let input = harl_fuzz::StepsInput::arbitrary_take_rest(Unstructured::new(&bytes))
                .expect("decodes");
            assert_eq!(input.graph, graph);
            match (&input.base, base) {
                (Base::Naive, 0) => {}
                (Base::Default(t), 1) => assert_eq!(*t as u64, target, "{bytes:?}"),
                other => panic!("{bytes:?} decoded as {other:?}"),
            }
            assert!(input.steps.is_empty());
            std::fs::write(dir.join(format!("seed-g{graph:02}-{name}")), &bytes).unwrap();
        }
    }
}
