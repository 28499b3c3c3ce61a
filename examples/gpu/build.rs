fn main() {
    // CPU code as usual, plus GPU code (PTX of the default GPU schedule) for every kernel.
    harl_build::Builder::new().scan_crate().cuda(true).compile();
}
