#![no_main]
//! libFuzzer entry point; the body is [`harl_fuzz::cache_line`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| harl_fuzz::cache_line(data));
