// A valid kernel, but this crate has no build.rs running harl's build step, so there is no
// generated code to include: the macro says how to add the build step.
#[harl::kernel(N = 8)]
fn double(a: Tensor<f32, N>) -> Tensor<f32, N> {
    a * 2.0
}

fn main() {}
