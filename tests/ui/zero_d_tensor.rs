// 0-d tensors are not supported (their stages would emit non-compiling Rust).
#[harl::kernel]
fn f(a: Tensor<f32>) -> Tensor<f32, 1> {
    compute([1], |i| a[[i]])
}

fn main() {}
