//! The memcached listener's codec on arbitrary bytes, as client commands and as server answers
//! (`keyroute_cache_proto::memcache::check_invariants`): never a panic, accepted keys of 1 to 250 bytes,
//! data blocks within the item limit, answers framed within their buffer and never longer for a
//! prefix of it.

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(data: &[u8]) {
    keyroute_cache_proto::memcache::check_invariants(data);
}
