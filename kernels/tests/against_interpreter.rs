//! Every shipped kernel against harl's reference interpreter (`harl_te::interp`), on deterministic
//! inputs: the interpreter evaluates the same te graph that `build.rs` registered (both come from
//! `registry.rs`), in f64 with f32 rounding on store.

use harl::KernelError;
use harl_kernels as k;
use std::collections::BTreeSet;

include!("../registry.rs");

/// A call of one generated kernel: its inputs in placeholder order, then the output.
type Call<'a> = &'a dyn Fn(&[&[f32]], &mut [f32]) -> Result<(), KernelError>;

/// The kernels the tests below check; must be every registered one.
const TESTED: &[&str] = &[
    "gemm_128",
    "gemm_256",
    "batch_matmul",
    "dense_bias_relu",
    "conv2d_3x3",
    "softmax",
    "layer_norm",
];

#[test]
fn every_registered_kernel_is_tested() {
    let registered: BTreeSet<&str> = registry().unwrap().iter().map(|(n, _)| *n).collect();
    let tested: BTreeSet<&str> = TESTED.iter().copied().collect();
    assert_eq!(registered, tested);
}

/// Every record this package ships (`tuning-cache/`) is of a registered kernel, the only one
/// of its workload and class, and replays on its graph; the tests below then check the
/// kernels built from them.
#[test]
fn every_shipped_record_replays() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning-cache");
    let graphs: Vec<(&str, harl_te::Graph)> = registry().unwrap();
    let mut files = 0;
    for entry in std::fs::read_dir(&dir).expect("tuning-cache/") {
        let path = entry.expect("entry").path();
        if path.extension().is_none_or(|e| e != "jsonl") {
            continue;
        }
        files += 1;
        let class = path
            .file_stem()
            .expect("stem")
            .to_string_lossy()
            .into_owned();
        let (records, warnings) = harl_build::cache::TuningCache::new(&dir).records(&class);
        assert!(warnings.is_empty(), "{warnings:?}");
        let mut seen = BTreeSet::new();
        for r in &records {
            let (name, graph) = graphs
                .iter()
                .find(|(_, g)| g.workload_key() == r.workload_key)
                .unwrap_or_else(|| panic!("{class}: a record of no registered kernel"));
            assert!(seen.insert(*name), "{class}: two records of {name}");
            harl_build::lower::lower(graph, &r.schedule)
                .unwrap_or_else(|e| panic!("{class}: {name}'s record does not replay: {e}"));
        }
        assert_eq!(
            seen.len(),
            graphs.len(),
            "{class}: a kernel without a record"
        );
    }
    assert!(files > 0, "no record file in tuning-cache/");
}

#[test]
fn gemm_128() {
    check("gemm_128", k::gemm_128::WORKLOAD_KEY, 128, &|i, out| {
        k::gemm_128::run(i[0], i[1], out)
    });
}

#[test]
fn gemm_256() {
    check("gemm_256", k::gemm_256::WORKLOAD_KEY, 256, &|i, out| {
        k::gemm_256::run(i[0], i[1], out)
    });
}

#[test]
fn batch_matmul() {
    check(
        "batch_matmul",
        k::batch_matmul::WORKLOAD_KEY,
        64,
        &|i, out| k::batch_matmul::run(i[0], i[1], out),
    );
}

#[test]
fn dense_bias_relu() {
    check(
        "dense_bias_relu",
        k::dense_bias_relu::WORKLOAD_KEY,
        256,
        &|i, out| k::dense_bias_relu::run(i[0], i[1], i[2], out),
    );
}

#[test]
fn conv2d_3x3() {
    check(
        "conv2d_3x3",
        k::conv2d_3x3::WORKLOAD_KEY,
        16 * 9,
        &|i, out| k::conv2d_3x3::run(i[0], i[1], out),
    );
}

#[test]
fn softmax() {
    check("softmax", k::softmax::WORKLOAD_KEY, 128, &|i, out| {
        k::softmax::run(i[0], out)
    });
}

#[test]
fn layer_norm() {
    check("layer_norm", k::layer_norm::WORKLOAD_KEY, 768, &|i, out| {
        k::layer_norm::run(i[0], i[1], i[2], out)
    });
}

/// Runs kernel `name` (generated for `workload_key`) and the interpreter on the registered graph
/// and compares. `reduction` is the longest reduction of the op: f32 rounding differences
/// (summation order, FMA) grow with it, roughly like its square root for random-sign data.
fn check(name: &str, workload_key: &str, reduction: usize, call: Call<'_>) {
    let graph = registered(name);
    assert_eq!(
        graph.workload_key(),
        workload_key,
        "`{name}` was generated for another graph than registry.rs builds"
    );
    let inputs: Vec<Vec<f32>> = graph
        .inputs
        .iter()
        .enumerate()
        .map(|(i, p)| data(p.shape.iter().product(), i as u32 + 1))
        .collect();
    let refs: Vec<&[f32]> = inputs.iter().map(Vec::as_slice).collect();
    let out_len = graph.stages.last().expect("a graph has stages").size();
    let mut got = vec![f32::NAN; out_len];
    call(&refs, &mut got).expect("buffers have the registered shapes");

    let inputs64: Vec<Vec<f64>> = inputs
        .iter()
        .map(|v| v.iter().map(|&x| x as f64).collect())
        .collect();
    let refs64: Vec<&[f64]> = inputs64.iter().map(Vec::as_slice).collect();
    let want = harl_te::interp::run(&graph, &refs64).expect("the interpreter runs the graph");

    assert_eq!(got.len(), want.len(), "`{name}`: output length");
    let tol = 1e-4 * (reduction as f64).sqrt().max(1.0);
    let (worst, at) = max_rel_err(&got, &want);
    assert!(
        worst <= tol,
        "`{name}`: element {at} is {} but the interpreter says {} (relative error {worst:.3e} > {tol:.1e})",
        got[at],
        want[at]
    );
}

/// The graph `registry.rs` registers as `name`.
fn registered(name: &str) -> harl_te::Graph {
    registry()
        .expect("the registered ops build")
        .into_iter()
        .find(|(n, _)| *n == name)
        .unwrap_or_else(|| panic!("no kernel `{name}` in registry.rs"))
        .1
}

/// The largest `|g - w| / (1 + |w|)` and where it is; NaN counts as infinitely wrong.
fn max_rel_err(got: &[f32], want: &[f64]) -> (f64, usize) {
    got.iter()
        .zip(want)
        .map(|(&g, &w)| {
            let e = (g as f64 - w).abs() / (1.0 + w.abs());
            if e.is_nan() {
                f64::INFINITY
            } else {
                e
            }
        })
        .enumerate()
        .fold(
            (0.0, 0),
            |(best, at), (i, e)| if e > best { (e, i) } else { (best, at) },
        )
}

/// `n` pseudo-random values in `[-0.5, 0.5)` from a linear congruential generator.
fn data(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9e37_79b9);
    (0..n)
        .map(|_| {
            s = s.wrapping_mul(1_664_525).wrapping_add(1_013_904_223);
            (s >> 8) as f32 / (1u32 << 24) as f32 - 0.5
        })
        .collect()
}
