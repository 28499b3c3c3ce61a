#[harl::kernel(N = 4)]
fn f(a: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| reduce_max([], || a[[i]]))
}

fn main() {}
