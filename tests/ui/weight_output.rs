#[harl::kernel]
fn f(a: Tensor<f32, 4>, w: Weight<f32, 4>) -> Weight<f32, 4> {
    a + w
}

fn main() {}
