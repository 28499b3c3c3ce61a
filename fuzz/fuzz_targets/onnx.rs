#![no_main]
//! libFuzzer entry point; the body is [`harl_fuzz::onnx`].

libfuzzer_sys::fuzz_target!(|data: &[u8]| harl_fuzz::onnx(data));
