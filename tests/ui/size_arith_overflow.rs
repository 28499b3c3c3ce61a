// Size arithmetic is checked: this product overflows before it is ever a shape.
#[harl::kernel(N = 17179869184)]
fn f(a: Tensor<f32, { N * N * N * N }>) -> Tensor<f32, 4> {
    relu(a)
}

fn main() {}
