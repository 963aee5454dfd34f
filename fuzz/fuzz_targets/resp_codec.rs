//! The `resp_codec` target: see `keyroute_fuzz::targets::resp_codec` (`fuzz/src/targets/resp_codec.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::resp_codec::run(data));
