//! The `memcache_codec` target: see `keyroute_fuzz::targets::memcache_codec` (`fuzz/src/targets/memcache_codec.rs`).
#![no_main]

libfuzzer_sys::fuzz_target!(|data: &[u8]| keyroute_fuzz::targets::memcache_codec::run(data));
