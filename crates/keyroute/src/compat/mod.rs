//! Compatibility modes: placement exactly as a deployed system does it, so that a fleet moves to
//! keyroute with no key moving. Each mode reproduces one system at a stated version, is locked by
//! golden vectors produced by that system's real program (`testdata/compat/`), and documents where
//! the original is odd.
//!
//! - [`redis`]: Redis Cluster's keyslots (CRC16 with hash tags) and the slot layout of
//!   `redis-cli --cluster create`.
//! - [`groupcache`]: Go groupcache's `consistenthash` ring.
//! - [`guava`]: Guava's `Hashing.consistentHash`, over murmur3_128, md5 or a raw 64-bit input.

pub mod groupcache;
pub mod guava;
pub mod redis;
