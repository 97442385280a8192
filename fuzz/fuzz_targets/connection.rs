#![no_main]
// The connection state machine: answers must not depend on how the input is split.
libfuzzer_sys::fuzz_target!(|data: &[u8]| sandboxd_http::fuzzing::connection_splits(data));
