// The kernels harl-kernels ships, as (module name, te graph). One list, included by `build.rs`
// (which registers them with harl) and by `tests/against_interpreter.rs` (which checks every one
// against harl's reference interpreter). The sizes are examples: modest enough that the
// unoptimised interpreter checks each one in seconds.

/// Every shipped kernel, in registration order.
fn registry() -> Result<Vec<(&'static str, harl_te::Graph)>, harl_te::ops::OpError> {
    use harl_te::ops::workloads as w;
    Ok(vec![
        // a [128, 128] x b [128, 128]
        ("gemm_128", w::matmul(128, 128, 128)?),
        // a [256, 256] x b [256, 256]
        ("gemm_256", w::matmul(256, 256, 256)?),
        // a [12, 64, 64] x b [12, 64, 64]: per-head products of 12 attention heads
        ("batch_matmul", w::batch_matmul(12, 64, 64, 64)?),
        // relu(x [64, 256] x w [256, 512] + bias [512])
        ("dense_bias_relu", w::dense_bias_relu(64, 256, 512)?),
        // data [1, 16, 28, 28], weight [32, 16, 3, 3], stride 1, pad 1
        (
            "conv2d_3x3",
            w::conv2d(1, 16, 28, 28, 32, 3, 3, 1, 1, 1, 1)?,
        ),
        // softmax over the last axis of x [128, 128]
        ("softmax", w::softmax(128, 128)?),
        // layer norm over the last axis of x [128, 768], gamma and beta [768], eps 1e-5
        ("layer_norm", w::layer_norm(128, 768)?),
    ])
}
