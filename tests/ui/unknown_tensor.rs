// `b` is neither a parameter nor a `let` binding.
#[harl::kernel]
fn add(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    compute([4], |i| a[[i]] + b[[i]])
}

fn main() {}
