// The option is `stride`, not `strides`.
#[harl::kernel]
fn conv(x: Tensor<f32, 1, 3, 8, 8>, w: Tensor<f32, 4, 3, 3, 3>) -> Tensor<f32, 1, 4, 4, 4> {
    conv2d(x, w).strides(2).pad(1)
}

fn main() {}
