//! The `request` target: see `keyroute_fuzz::targets::request` (`fuzz/src/targets/request.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::request::run(data));
