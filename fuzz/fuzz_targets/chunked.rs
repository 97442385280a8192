#![no_main]
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandboxd_http::fuzzing::chunked(data));
