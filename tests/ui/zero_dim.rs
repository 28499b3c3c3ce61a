#[harl::kernel(N = 4)]
fn f(a: Tensor<f32, N, { N - 4 }>) -> Tensor<f32, N, 1> {
    relu(a)
}

fn main() {}
