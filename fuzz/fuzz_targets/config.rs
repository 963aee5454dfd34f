//! The `config` target: see `keyroute_fuzz::targets::config` (`fuzz/src/targets/config.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::config::run(data));
