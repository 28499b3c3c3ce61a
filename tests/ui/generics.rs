// Kernels have static shapes: no type or const generics.
#[harl::kernel]
fn double<const N: usize>(a: Tensor<f32, N>) -> Tensor<f32, N> {
    a * 2.0
}

fn main() {}
