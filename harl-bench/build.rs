//! Registers the benchmark's kernels with harl: schedules come from the workspace's shipped
//! tuning cache (`../tuning-cache`) when it has a record, else from the default heuristic.
//! The quickstart's kernels are registered too (found by scanning its sources, so their
//! workload keys are exactly the quickstart's), for `harl-bench record`.

use harl_te::ops::workloads;
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let mut builder = harl_build::Builder::new()
        .cache_dir(manifest.join("..").join("tuning-cache"))
        .kernel("matmul_512", workloads::matmul(512, 512, 512)?)
        .kernel("matmul_1024", workloads::matmul(1024, 1024, 1024)?)
        // data 1x64x56x56, 64 filters 3x3, stride 1, pad 1, dilation 1, groups 1.
        .kernel(
            "conv2d_56",
            workloads::conv2d(1, 64, 56, 56, 64, 3, 3, 1, 1, 1, 1)?,
        );
    let quickstart = manifest.join("../examples/quickstart/src");
    println!("cargo:rerun-if-changed={}", quickstart.display());
    let mut found = Vec::new();
    harl_build::scan::scan_path(&quickstart, &mut found)
        .map_err(|(p, e)| format!("{}: {e}", p.display()))?;
    for decl in found {
        builder = builder.kernel(&format!("qs_{}", decl.name), decl.graph);
    }
    // The vector-math kernels of `harl-bench math`, declared with the attribute.
    builder = builder.scan_path(manifest.join("src/math.rs"));
    builder.compile();
    Ok(())
}
