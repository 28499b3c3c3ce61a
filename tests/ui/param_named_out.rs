// A parameter may be called `out`: the output becomes `out_`. Only the missing build script of
// this test crate is an error.
#[harl::kernel]
fn f(out: Tensor<f32, 4>) -> Tensor<f32, 4> {
    relu(out)
}

fn main() {}
