// N * N elements wrap to 0 in 64-bit arithmetic; the length check would then pass on empty
// slices. Each dimension is bounded (axes are i32), and so is the element count.
#[harl::kernel(N = 4294967296)]
fn f(a: Tensor<f32, N, N>) -> Tensor<f32, N, N> {
    relu(a)
}

fn main() {}
