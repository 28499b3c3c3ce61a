// The body computes a [4] tensor; the signature promises [5].
#[harl::kernel]
fn act(a: Tensor<f32, 4>) -> Tensor<f32, 5> {
    relu(a)
}

fn main() {}
