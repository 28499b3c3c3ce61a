#[harl::kernel]
fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    compute([4], |i| a[[i]] + -3.5e38)
}

fn main() {}
