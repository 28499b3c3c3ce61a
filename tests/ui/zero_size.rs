#[harl::kernel(N = 0)]
fn f(a: Tensor<f32, N>) -> Tensor<f32, N> {
    relu(a)
}

fn main() {}
