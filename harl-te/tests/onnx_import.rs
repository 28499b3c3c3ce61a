//! ONNX import: small models in the shape of ResNet / MobileNet-V2 and a BERT encoder layer
//! (made by `tests/onnx/make_models.py`, with onnxruntime's outputs) are imported, fused into
//! tasks, run through the reference interpreter, and compared with onnxruntime.
#![cfg(feature = "onnx")]

use harl_te::onnx::{import, import_bytes, ImportError, ValueKind};
use std::path::PathBuf;

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/onnx")
        .join(name)
}

fn floats(name: &str) -> Vec<f64> {
    let bytes = std::fs::read(fixture(name)).expect("fixture");
    bytes
        .chunks_exact(4)
        .map(|c| f64::from(f32::from_le_bytes([c[0], c[1], c[2], c[3]])))
        .collect()
}

fn check_against_onnxruntime(model: &str) -> harl_te::onnx::Network {
    let net = import(fixture(&format!("{model}.onnx"))).expect("imports");
    let x = floats(&format!("{model}.in.bin"));
    let want = floats(&format!("{model}.out.bin"));
    let got = net.run_reference(&[&x]).expect("runs");
    assert_eq!(got.len(), want.len());
    let scale = want.iter().fold(0.0f64, |m, v| m.max(v.abs())).max(1e-6);
    let worst = got
        .iter()
        .zip(&want)
        .map(|(g, w)| (g - w).abs() / scale)
        .fold(0.0f64, f64::max);
    assert!(
        worst < 1e-4,
        "{model}: max error {worst} relative to the output's scale"
    );
    net
}

#[test]
fn a_cnn_imports_fuses_and_matches_onnxruntime() {
    let net = check_against_onnxruntime("cnn");
    // Batch norms are folded into their convolutions: no task computes one on its own.
    assert!(
        net.tasks
            .iter()
            .all(|t| !t.name.contains("batchnormalization")),
        "{:?}",
        names(&net)
    );
    // Epilogues fused: the ReLU after the stem, the ReLU6 after each pointwise conv, the
    // residual adds.
    let fused: Vec<_> = net.calls.iter().filter(|c| c.nodes.len() > 1).collect();
    assert!(fused.len() >= 4, "{:?}", names(&net));
    // Flatten is a view, not a kernel.
    assert!(net
        .values
        .iter()
        .any(|v| matches!(v.kind, ValueKind::View(_))));
    assert_eq!(net.total_calls(), net.calls.len());
}

#[test]
fn pointwise_convolutions_import_as_products_over_flattened_pixels() {
    let net = check_against_onnxruntime("pointwise");
    // Each 1x1 convolution of 64 filters reduces over the channels into [1, 64, 6 * 10].
    let flat = |t: &harl_te::onnx::Task| {
        t.graph
            .stages
            .iter()
            .any(|s| s.reduce.is_some() && s.shape == [1, 64, 60])
    };
    assert_eq!(
        net.tasks.iter().filter(|t| flat(t)).count(),
        3,
        "{:?}",
        names(&net)
    );
    // The residual add (its other operand viewed as [1, 64, 60]) and the ReLU stay fused.
    assert!(
        net.calls.iter().any(|c| c.nodes.len() == 3),
        "{:?}",
        names(&net)
    );
}

#[test]
fn an_encoder_layer_imports_and_matches_onnxruntime() {
    let net = check_against_onnxruntime("encoder");
    // The Q, K and V projections are one task called three times.
    assert!(net.tasks.iter().any(|t| t.weight >= 3), "{:?}", names(&net));
    // The exported GELU (Div, Erf, Add, Mul, Mul) is computed in the task of the FFN's first
    // linear layer, not in a task of its own.
    let erf = |e: &harl_te::Expr| {
        let mut found = false;
        e.visit(&mut |x| found |= matches!(x, harl_te::Expr::Unary(harl_te::UnaryOp::Erf, _)));
        found
    };
    let gelu = net
        .tasks
        .iter()
        .find(|t| t.graph.stages.iter().any(|s| erf(&s.body)))
        .expect("a task computes the GELU");
    assert!(
        gelu.graph.stages.iter().any(|s| s.reduce.is_some()),
        "{}",
        gelu.name
    );
}

fn names(net: &harl_te::onnx::Network) -> Vec<(String, usize)> {
    net.tasks
        .iter()
        .map(|t| (t.name.clone(), t.weight))
        .collect()
}

#[test]
fn bad_files_are_errors() {
    for bytes in [&b""[..], b"not onnx at all", &[0xff; 64][..]] {
        assert!(matches!(import_bytes(bytes), Err(ImportError::Parse(_))));
    }
    // A truncated model.
    let good = std::fs::read(fixture("cnn.onnx")).expect("fixture");
    assert!(import_bytes(&good[..good.len() / 2]).is_err());
}

#[test]
fn an_unsupported_op_is_named_with_its_node_and_opset() {
    match import(fixture("unsupported.onnx")) {
        Err(ImportError::Unsupported { op, node, opset }) => {
            assert_eq!(op, "Concat");
            assert!(node.contains("concat"), "{node}");
            assert_eq!(opset, 17);
        }
        other => panic!("{other:?}"),
    }
}
