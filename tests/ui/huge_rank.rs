#[harl::kernel]
fn f(a: Tensor<f32, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1>) -> Tensor<f32, 1> {
    compute([1], |i| a[[i, i, i, i, i, i, i, i, i, i, i, i, i, i, i, i, i]])
}

fn main() {}
