// Every dimension is fine, their product (2^48 elements) is not.
#[harl::kernel(N = 65536)]
fn f(a: Tensor<f32, N, N, N>) -> Tensor<f32, N, N, N> {
    relu(a)
}

fn main() {}
