// An i32 kernel's literal must be an i32.
#[harl::kernel]
fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> {
    compute([4], |i| a[[i]] + 3000000000)
}

fn main() {}
