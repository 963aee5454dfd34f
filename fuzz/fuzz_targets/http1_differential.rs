//! The `http1_differential` target: see `keyroute_fuzz::targets::http1_differential` (`fuzz/src/targets/http1_differential.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::http1_differential::run(data));
