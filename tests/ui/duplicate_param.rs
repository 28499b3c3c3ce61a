#[harl::kernel]
fn f(a: Tensor<f32, 4>, a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    a + a
}

fn main() {}
