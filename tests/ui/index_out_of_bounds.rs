// `i + 1` reaches index 4 of a 4-element tensor.
#[harl::kernel(N = 4)]
fn shift(a: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| a[[i + 1]])
}

fn main() {}
