#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandboxd::fuzzing::tar(data));
