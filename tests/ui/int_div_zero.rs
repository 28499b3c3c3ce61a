#[harl::kernel]
fn f(a: Tensor<i32, 4>) -> Tensor<i32, 4> {
    compute([4], |i| a[[i]] / i)
}

fn main() {}
