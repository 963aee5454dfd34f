//! The key stage: the pool's key template over the request ([`crate::key`]); a missing part is
//! rejected (400) or placed by power of two choices, as the pool says.

use std::sync::atomic::Ordering::Relaxed;

use super::headers::Peer;
use crate::config::{HttpPoolConfig, MissingKey};
use crate::head::ReqHead;
use keyroute_fleet::pool::{Pool, Snapshot};

/// The key's hash, `None` when the strategy does not place by key or the key is missing
/// and the pool falls back to p2c.
pub(super) fn key_hash(
    pool: &Pool,
    http: &HttpPoolConfig,
    snap: &Snapshot,
    head: &ReqHead,
    peer: &Peer,
    key: &mut String,
) -> Result<Option<u64>, crate::key::MissingPart> {
    if !snap.policy().strategy().uses_key() {
        return Ok(None);
    }
    let rendered = http.key.render(&crate::key::HttpRequest::of(head, peer.addr.ip()), key).and_then(|()| {
        // nginx and HAProxy do not hash an empty key (they go round robin): neither does their mode.
        match snap.policy().strategy().hashes_key(key.as_bytes()) {
            true => Ok(()),
            false => Err(crate::key::MissingPart("an empty key".into())),
        }
    });
    match rendered {
        Ok(()) => {
            let h = snap.policy().key_hash(key.as_bytes());
            pool.record_key(h);
            Ok(Some(h))
        }
        Err(missing) => {
            pool.metrics.missing_key.fetch_add(1, Relaxed);
            match http.on_missing_key {
                MissingKey::Reject => Err(missing),
                MissingKey::P2c => Ok(None),
            }
        }
    }
}
