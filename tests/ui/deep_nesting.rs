// Nesting is bounded before syn parses the item, so that no recursive parser or pass can
// overflow the compiler's stack.
#[harl::kernel]
fn f(a: Tensor<f32, 4>) -> Tensor<f32, 4> {
    compute([4], |i| ((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((((a[[i]])))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))))
}

fn main() {}
