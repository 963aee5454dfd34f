//! Hop-by-hop headers (RFC 9110 section 7.6.1): they describe one connection, so neither the
//! proxy forwards them nor the cache stores them.

use http::{HeaderName, header};

/// The hop-by-hop headers, besides those a `Connection` header names (a `static`: a `const`
/// array would be a new temporary at each use).
pub(crate) static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::UPGRADE,
];
