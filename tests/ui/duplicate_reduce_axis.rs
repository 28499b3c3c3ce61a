#[harl::kernel]
fn f(a: Tensor<f32, 4, 4>) -> Tensor<f32, 4> {
    compute([4], |i| sum(4, |i| a[[i, i]]))
}

fn main() {}
