// `frobnicate` is not in the op library.
#[harl::kernel]
fn mystery(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    frobnicate(a)
}

fn main() {}
