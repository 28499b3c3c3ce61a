// A reduction over no axes has no iterations; it is an error rather than its identity.
#[harl::kernel(N = 4)]
fn f(a: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| sum([], || a[[i]]))
}

fn main() {}
