//! Compile-fail tests of `#[harl::kernel]`: each file in `tests/ui/` holds one kind of mistake,
//! and its `.stderr` snapshot pins the message and the span the user sees.
//!
//! Regenerate the snapshots after an intended change with
//! `TRYBUILD=overwrite cargo test --test ui`, then read the diff.

#[test]
fn ui() {
    let t = trybuild::TestCases::new();
    t.compile_fail("tests/ui/*.rs");
}
