#[harl::kernel]
fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    let s = compute([], || a[[0]]);
    relu(a)
}

fn main() {}
