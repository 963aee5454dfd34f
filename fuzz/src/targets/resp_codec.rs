//! The Redis listener's RESP codec on arbitrary bytes, as client requests and as server replies
//! (`keyroute_cache_proto::resp::check_invariants`): never a panic, arguments within their request and
//! their limit, replies framed within their buffer and never longer for a prefix of it, array
//! elements that fit their array.

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(data: &[u8]) {
    keyroute_cache_proto::resp::check_invariants(data);
}
