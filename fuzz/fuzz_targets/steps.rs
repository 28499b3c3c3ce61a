#![no_main]
//! libFuzzer entry point; the body is [`harl_fuzz::steps`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| harl_fuzz::steps(data));
