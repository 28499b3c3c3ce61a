fn main() {
    // Finds every #[harl::kernel] in src/, picks a schedule (tuning cache, else the default)
    // and writes the generated Rust to OUT_DIR.
    harl_build::Builder::new().scan_crate().compile();
}
