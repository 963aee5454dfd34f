//! The `admin_json` target: see `keyroute_fuzz::targets::admin_json` (`fuzz/src/targets/admin_json.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::admin_json::run(data));
