#[harl::kernel]
fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    let a = relu(a);
    a
}

fn main() {}
