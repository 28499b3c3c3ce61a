// f32 + f64 needs an explicit `as` cast.
#[harl::kernel(N = 8)]
fn mix(a: Tensor<f32, N>, b: Tensor<f64, N>) -> Tensor<f32, N> {
    compute([N], |i| a[[i]] + b[[i]])
}

fn main() {}
