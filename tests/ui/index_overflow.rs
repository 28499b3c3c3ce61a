// Index arithmetic is i32: this product leaves it (and would wrap in the interpreter only).
#[harl::kernel(N = 65536)]
fn f(a: Tensor<f32, N>) -> Tensor<f32, N> {
    compute([N], |i| select(i * i * 2 < 0, a[[i]], 0.0))
}

fn main() {}
