#[harl::kernel]
fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    let b = relu(a);
    let b = exp(b);
    b
}

fn main() {}
