#[harl::kernel]
fn f(a: Tensor<f32, 4, 4>) -> Tensor<f32, 4, 4> {
    compute([4, 4], |i, i| a[[i, i]])
}

fn main() {}
