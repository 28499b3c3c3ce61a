//! Replays the saved fuzz corpus (`regressions/<target>/*`) through the target bodies, so that
//! `cargo test` on stable re-checks every seed, every minimized interesting input and every
//! crash the fuzzer ever found. Files under `pending/` (crashes whose fix has not landed) are
//! not replayed; move them into `regressions/` with the fix.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};

fn corpus(target: &str) -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("regressions")
        .join(target);
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    files
}

/// Runs every file of `target`'s corpus, then fails naming all inputs that panicked (not just
/// the first), so one regression does not hide another.
fn replay(target: &str, run: fn(&[u8])) {
    let files = corpus(target);
    assert!(!files.is_empty(), "no corpus for {target}");
    let failed: Vec<String> = files
        .iter()
        .filter(|path| {
            let data = std::fs::read(path).expect("read corpus file");
            catch_unwind(AssertUnwindSafe(|| run(&data))).is_err()
        })
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        failed.is_empty(),
        "{} of {} {target} inputs panicked:\n{}",
        failed.len(),
        files.len(),
        failed.join("\n")
    );
}

#[test]
fn dsl_corpus() {
    replay("dsl", harl_fuzz::dsl);
}

#[test]
fn cache_line_corpus() {
    replay("cache_line", harl_fuzz::cache_line);
}

#[test]
fn steps_corpus() {
    replay("steps", harl_fuzz::steps);
}

/// The hand-written DSL seeds are only useful while they reach the lowering: a seed named
/// `seed-*` (but not `seed-err-*`, the rejected ones) must still parse as a kernel. Without this
/// a change to the DSL could silently turn the corpus into parse errors.
#[test]
fn dsl_seeds_parse() {
    let mut broken = Vec::new();
    for path in corpus("dsl") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if !name.starts_with("seed-") || name.starts_with("seed-err-") {
            continue;
        }
        let src = std::fs::read_to_string(&path).expect("utf-8 seed");
        let item: syn::ItemFn = syn::parse_str(&src).unwrap_or_else(|e| panic!("{name}: {e}"));
        let attr = item
            .attrs
            .iter()
            .find(|a| harl_te::dsl::is_kernel_attr(a))
            .expect("kernel attribute");
        let args = match &attr.meta {
            syn::Meta::List(l) => l.tokens.clone(),
            _ => Default::default(),
        };
        if let Err(e) = harl_te::dsl::parse_kernel(args, &item) {
            broken.push(format!("{name}: {e}"));
        }
    }
    assert!(
        broken.is_empty(),
        "seeds that no longer parse:\n{}",
        broken.join("\n")
    );
}

/// The cache-line seeds named `seed-valid-*` must parse as records, so that the corpus keeps
/// reaching lowering.
#[test]
fn cache_line_seeds_parse() {
    for path in corpus("cache_line") {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        if name.starts_with("seed-valid-") {
            let data = std::fs::read(&path).expect("read seed");
            if let Err(e) = harl_build::cache::parse_record(&data) {
                panic!("{name} is no longer a record: {e}");
            }
        }
    }
}

/// Regenerates the valid cache-line seeds from the schedules harl itself writes: the default
/// schedule of each graph the target lowers against, for two CPUs, and the GPU sketch's default
/// schedule. Run after a change to the schedule format:
/// `cargo test -p harl-fuzz --test regressions -- --ignored write_cache_line_seeds`.
#[test]
#[ignore = "writes files into regressions/cache_line"]
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
/// `cargo test -p harl-fuzz --test regressions -- --ignored write_steps_seeds`.
#[test]
#[ignore = "writes files into regressions/steps"]
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
