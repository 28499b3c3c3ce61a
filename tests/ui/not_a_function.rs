// The attribute goes on a function, not on a struct.
#[harl::kernel(N = 4)]
struct Kernel {
    a: [f32; 4],
}

fn main() {}
