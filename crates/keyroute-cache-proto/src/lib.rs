//! # keyroute-cache-proto: the cache protocols keyroute proxies, sans IO
//!
//! What a cache proxy must know of a protocol to place its commands and frame its replies,
//! and nothing of sockets, pools or time:
//!
//! - [`memcache`]: memcached's text protocol as memcached 1.6 speaks it (the classic commands and
//!   the meta commands): a client's command line parsed in place, refusals worded as memcached
//!   words them, the length of one server answer, and the value blocks of a retrieval.
//! - [`resp`]: RESP2 and RESP3: a client's request framed exactly as Redis frames it (lengths as
//!   `string2ll` reads them, inline commands split as `sdssplitargs` splits them), the length of
//!   one reply, an array reply's elements, and hash tags.
//! - [`commands`]: the one table of the Redis commands a proxy places (one key, and whether it only
//!   reads it), and the reasons the others are refused.
//!
//! A request is never sent on unless it was framed here as the server will frame it: bytes that
//! two readers could split differently would let one client's line run as part of another's
//! command on a shared server connection.
//!
//! Each codec states its invariants as a function ([`memcache::check_invariants`],
//! [`resp::check_invariants`]) that the fuzz targets (`fuzz/`) and a seeded test here both run.

pub mod commands;
pub mod memcache;
#[cfg(test)]
mod mutate;
pub mod resp;
