//! The `key_template` target: see `keyroute_fuzz::targets::key_template` (`fuzz/src/targets/key_template.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::key_template::run(data));
