// A size name used in a `Tensor` type must be bound in the attribute.
#[harl::kernel(M = 4)]
fn scale(a: Tensor<f32, M, N>) -> Tensor<f32, M, 8> {
    a * 2.0
}

fn main() {}
