#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandboxd::fuzzing::init_system_files(data));
