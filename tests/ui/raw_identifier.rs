// A raw identifier is a fine parameter name: the kernel parses (and the macro does not panic);
// the only error left is the missing build script of this test crate.
#[harl::kernel]
fn f(r#type: Tensor<f32, 4>) -> Tensor<f32, 4> {
    compute([4], |r#i| r#type[[r#i]] + 1.0)
}

fn main() {}
