//! The memcached listener's codec on arbitrary bytes, as client commands and as server answers
//! (`keyroute_cache_proto::memcache::check_invariants`): never a panic, accepted keys of 1 to 250 bytes,
//! data blocks within the item limit, answers framed within their buffer and never longer for a
//! prefix of it.
#![no_main]

use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    keyroute_cache_proto::memcache::check_invariants(data);
});
