// Kernels compute on f32, f64 or i32.
#[harl::kernel]
fn bytes(a: Tensor<u8, 16>) -> Tensor<f32, 16> {
    relu(a)
}

fn main() {}
