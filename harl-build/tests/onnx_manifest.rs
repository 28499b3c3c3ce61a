//! An imported model's tasks reach the tuner with their weights: the manifest gives each task
//! kernel the number of calls the network makes of it, so a tune spends its budget where the
//! network's time is.
#![cfg(feature = "onnx")]

use harl_build::manifest::Manifest;
use harl_build::{Builder, TuneMode};
use std::path::Path;

#[test]
fn the_manifest_weighs_each_task_by_its_calls() {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../harl-te/tests/onnx/encoder.onnx");
    let net = harl_te::onnx::import(&model).expect("import");
    let dir = tempfile::tempdir().expect("tempdir");
    Builder::new()
        .quiet()
        .tune(TuneMode::Off)
        .cache_dir(dir.path().join("cache"))
        .out_dir(dir.path())
        .onnx("enc", &model)
        .try_compile()
        .expect("build step");
    let m = Manifest::read(&dir.path().join("harl/manifest.json")).expect("manifest");
    assert_eq!(m.kernels.len(), net.tasks.len());
    for (k, task) in m.kernels.iter().zip(&net.tasks) {
        assert_eq!(k.graph, task.graph);
        assert_eq!(k.weight, task.weight as f64, "{}", k.name);
    }
    let total: f64 = m.kernels.iter().map(|k| k.weight).sum();
    assert_eq!(total, net.calls.len() as f64);
    assert!(
        m.kernels.iter().any(|k| k.weight > 1.0),
        "the encoder's projections share a task"
    );
}
