//! What the gateway checks and rewrites in a request's head before it is routed, and in a
//! response's head before it is returned.
//!
//! - **The target and Host** (RFC 9112 section 3.2): a request in absolute form (`GET
//!   http://a.example/x`) is routed by, and forwarded with, its authority; the Host header it came
//!   with is replaced. An HTTP/1.1 request with no Host, or with more than one, or with a Host that
//!   is not a valid authority, is refused with 400 — so the host a route matched is always the one
//!   the worker sees.
//! - **The path** is normalised before routing (dot segments removed, RFC 3986 section 5.2.4,
//!   with `%2e` read as `.` and `;params` ignored), and the normalised path is what the worker
//!   receives, so `/thumb/../admin` can neither match a `/thumb/` route nor reach `/admin` behind
//!   it. A path with a backslash or an encoded slash or backslash (`%2F`, `%5C`) is refused with
//!   400: servers disagree on what it means.
//! - **Hop-by-hop headers** (RFC 9110 section 7.6.1) are not forwarded, nor the headers that
//!   `Connection` names.
//! - **Framing**: a message that came chunked loses any Content-Length (RFC 9112 section 6.3), in
//!   both directions, so a length that disagrees with the body cannot truncate it.
//! - **Loops**: the gateway appends its own `Via` entry (`1.1 keyroute-<id>`, the id random per
//!   process); a request that already carries it has looped back and is answered 508.

use std::borrow::Cow;
use std::net::SocketAddr;

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Uri, Version};

pub(crate) use crate::hop::HOP_BY_HOP;

/// Removes the hop-by-hop headers and those `Connection` lists; a message that came with
/// `Transfer-Encoding` also loses `Content-Length` (the length is the chunked body's, and the engine
/// re-frames what it forwards).
pub(crate) fn strip_hop_by_hop(headers: &mut HeaderMap) {
    // One pass over the (few) headers, instead of a hash lookup per hop-by-hop name.
    let mut drop: Vec<HeaderName> = Vec::new();
    for (name, value) in headers.iter() {
        if HOP_BY_HOP.contains(name) || name == header::TRANSFER_ENCODING {
            drop.push(name.clone());
            if name == header::CONNECTION {
                // As bytes: a value with non-ASCII bytes in it still names the headers it lists.
                let listed = value.as_bytes().split(|&b| b == b',').map(<[u8]>::trim_ascii);
                // `Connection: host` must not strip the Host header an HTTP/1.1 request needs.
                drop.extend(listed.filter_map(|n| HeaderName::from_bytes(n).ok()).filter(|n| n != header::HOST));
            }
            if name == header::TRANSFER_ENCODING {
                drop.push(header::CONTENT_LENGTH);
            }
        }
    }
    for name in &drop {
        headers.remove(name);
    }
    // Only the h2c upgrade uses it (RFC 7540 §3.2.1), and h2c is never tunnelled: it goes whether
    // or not `Connection` names it.
    headers.remove(HTTP2_SETTINGS);
}

/// The request fields of a WebSocket opening handshake (RFC 6455 section 4.1), which mean
/// nothing outside one.
const WEBSOCKET_HANDSHAKE: [HeaderName; 4] = [
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::SEC_WEBSOCKET_PROTOCOL,
];

/// `HTTP2-Settings`, the h2c upgrade's settings.
const HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// The protocols of an HTTP/1.1 request's upgrade offer (`Connection: upgrade` and `Upgrade`) that
/// the route allows (`allowed`: lowercase protocol names, matched without their `/version`), in
/// the client's order, read before the hop-by-hop headers are stripped. `None` when nothing
/// allowed is offered: the request is then served as plain HTTP/1.1 (its `Upgrade` and, for h2c,
/// `HTTP2-Settings` never reach the worker).
pub(crate) fn upgrade_of(version: http::Version, headers: &HeaderMap, allowed: &[String]) -> Option<HeaderValue> {
    if version != http::Version::HTTP_11 {
        return None;
    }
    let asks = headers
        .get_all(header::CONNECTION)
        .iter()
        .any(|v| v.as_bytes().split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade")));
    if !asks {
        return None;
    }
    let offered = headers.get_all(header::UPGRADE).iter().flat_map(|v| v.as_bytes().split(|&b| b == b','));
    let kept: Vec<&[u8]> = offered.map(<[u8]>::trim_ascii).filter(|p| upgrade_allowed(p, allowed)).collect();
    if kept.is_empty() {
        return None;
    }
    HeaderValue::from_bytes(&kept.join(&b", "[..])).ok()
}

/// Rewrites a routed request's head into the upstream request's: hop-by-hop headers removed (an
/// allowed upgrade kept, with `Connection: upgrade`), a body of unknown length sent on chunked,
/// `Forwarded` and `X-Forwarded-*` added, this gateway's `Via` entry appended, the request id set.
/// An upgrade is kept only if the route allows it (HTTP/1.1 only).
pub(crate) fn upstream_head(
    parts: &mut http::request::Parts,
    upgrades: &[String],
    body_end: bool,
    peer: &Peer,
    via: &Via,
    id: &HeaderValue,
) {
    let upgrade = upgrade_of(parts.version, &parts.headers, upgrades);
    strip_hop_by_hop(&mut parts.headers);
    let websocket = upgrade.as_ref().is_some_and(|u| {
        let names = u.as_bytes().split(|&b| b == b',').map(|p| p.trim_ascii().split(|&b| b == b'/').next());
        names.flatten().any(|n| n.eq_ignore_ascii_case(b"websocket"))
    });
    if !websocket {
        // A handshake that is not tunnelled is not forwarded either: without its upgrade, a
        // worker that still acts on the key would answer a plain request with a 101.
        for name in WEBSOCKET_HANDSHAKE {
            parts.headers.remove(name);
        }
    }
    if let Some(u) = upgrade {
        parts.headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        parts.headers.insert(header::UPGRADE, u);
    }
    // A body whose length is not known (it came chunked) goes on chunked: a head without framing
    // fields would send a GET or HEAD without it.
    if !body_end && !parts.headers.contains_key(header::CONTENT_LENGTH) {
        parts.headers.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    add_forwarded(&mut parts.headers, peer);
    via.append(&mut parts.headers);
    parts.headers.insert(REQUEST_ID.clone(), id.clone());
}

/// Whether an offered protocol (`name` or `name/version`) is one of `allowed`. `h2c` never is.
pub(crate) fn upgrade_allowed(protocol: &[u8], allowed: &[String]) -> bool {
    let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
    !name.eq_ignore_ascii_case(b"h2c") && allowed.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether the request's `Content-Length` values (if any) are one valid number that agrees with
/// the body's exact length, when that is known.
pub(crate) fn framing_ok(headers: &HeaderMap, exact: Option<u64>) -> bool {
    let mut length = None;
    for v in headers.get_all(header::CONTENT_LENGTH) {
        let Some(n) = v.to_str().ok().and_then(|t| t.trim().parse::<u64>().ok()) else { return false };
        if length.is_some_and(|l| l != n) {
            return false;
        }
        length = Some(n);
    }
    match (length, exact) {
        (Some(l), Some(e)) => l == e,
        _ => true,
    }
}

/// Why a request's head was refused before routing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BadHead {
    /// More than one Host header.
    DuplicateHost,
    /// An HTTP/1.1 request without Host.
    MissingHost,
    /// A Host (or an absolute-form authority) that is not a valid `host[:port]`.
    InvalidHost,
    /// An absolute-form target with a scheme other than http or https, or with user info.
    InvalidTarget,
    /// A path with an encoded slash or a backslash (raw or encoded), which servers read
    /// differently.
    AmbiguousPath,
}

impl BadHead {
    /// The public reason class.
    pub(crate) fn reason(self) -> &'static str {
        match self {
            BadHead::DuplicateHost => "duplicate_host",
            BadHead::MissingHost => "missing_host",
            BadHead::InvalidHost => "invalid_host",
            BadHead::InvalidTarget => "invalid_target",
            BadHead::AmbiguousPath => "ambiguous_path",
        }
    }

    /// The public message.
    pub(crate) fn message(self) -> &'static str {
        match self {
            BadHead::DuplicateHost => "more than one Host header",
            BadHead::MissingHost => "the request names no host (Host, or :authority in HTTP/2)",
            BadHead::InvalidHost => "the Host is not a valid host[:port]",
            BadHead::InvalidTarget => "the request target is not an http(s) URI without user info",
            BadHead::AmbiguousPath => {
                "the path holds an encoded slash (%2F) or a backslash, which servers read differently"
            }
        }
    }
}

/// Makes the request's target and Host agree (see the [module documentation](self)): afterwards
/// the URI is in origin form with a normalised path, and the Host header, if any, is the one
/// authority the request is routed by.
///
/// # Errors
///
/// The head is ambiguous or invalid; nothing is forwarded.
pub(crate) fn canonicalize(version: Version, uri: &mut Uri, headers: &mut HeaderMap) -> Result<(), BadHead> {
    let mut hosts = headers.get_all(header::HOST).iter();
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(BadHead::DuplicateHost);
    }
    // Even with an absolute-form target, an HTTP/1.1 request must carry one valid Host
    // (RFC 9112 section 3.2); the target's authority then replaces it.
    // An HTTP/2 request names its host by `:authority` (the URI's, here) or Host, and must name
    // one (RFC 9113 section 8.3.1), as an HTTP/1.1 request must send Host.
    match first {
        Some(h) if valid_authority(h.to_str().map_err(|_| BadHead::InvalidHost)?) => {}
        Some(_) => return Err(BadHead::InvalidHost),
        None if version == Version::HTTP_11 => return Err(BadHead::MissingHost),
        None if version >= Version::HTTP_2 && uri.authority().is_none() => return Err(BadHead::MissingHost),
        None => {}
    }
    // Absolute form: its authority wins and replaces Host (RFC 9112 section 3.2.2). In origin
    // form, the one Host stays as it is.
    if let Some(a) = uri.authority() {
        if !matches!(uri.scheme_str(), Some("http" | "https")) || !valid_authority(a.as_str()) {
            return Err(BadHead::InvalidTarget);
        }
        let v = HeaderValue::try_from(a.as_str()).map_err(|_| BadHead::InvalidHost)?;
        headers.insert(header::HOST, v);
    }
    let pq = uri.path_and_query().map_or("/", PathAndQuery::as_str);
    let (path, query) = match pq.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (pq, None),
    };
    // Encoded slashes and backslashes (raw or encoded) mean different paths to different
    // servers: a route must not match one reading and the worker act on another.
    if path.contains('\\') || has_escape(path, b'2', b'f') || has_escape(path, b'5', b'c') {
        return Err(BadHead::AmbiguousPath);
    }
    let path = if path.is_empty() || path == "*" { Cow::Borrowed(path) } else { normalize_path(path) };
    let origin_form = uri.scheme().is_none() && uri.authority().is_none();
    if origin_form && matches!(path, Cow::Borrowed(_)) {
        return Ok(());
    }
    let path = if path.is_empty() { "/" } else { &path };
    let rebuilt = match query {
        Some(q) => format!("{path}?{q}"),
        None => path.to_owned(),
    };
    *uri = Uri::try_from(rebuilt).map_err(|_| BadHead::InvalidTarget)?;
    Ok(())
}

/// Whether `text` is a `host[:port]` as Host allows it: a registered name (letters, digits, `-`,
/// `.`, `_`), an IPv4 address or a bracketed IPv6 one, then an optional numeric port; nothing
/// else (no user info, no path, no spaces). Allocates nothing.
fn valid_authority(text: &str) -> bool {
    let (host, port) = if let Some(rest) = text.strip_prefix('[') {
        let Some((v6, after)) = rest.split_once(']') else { return false };
        if v6.parse::<std::net::Ipv6Addr>().is_err() {
            return false;
        }
        (None, after)
    } else {
        match text.find(':') {
            Some(i) => (Some(&text[..i]), &text[i..]),
            None => (Some(text), ""),
        }
    };
    if let Some(h) = host
        && (h.is_empty() || !h.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_')))
    {
        return false;
    }
    port.is_empty() || port.strip_prefix(':').is_some_and(|p| p.parse::<u16>().is_ok())
}

/// The request's host without its port, lowercased by the caller as needed.
pub(crate) fn host_of(headers: &HeaderMap) -> Option<&str> {
    let h = headers.get(header::HOST)?.to_str().ok()?;
    if h.starts_with('[') {
        return Some(h.split_once(']').map_or(h, |(v6, _)| &h[..v6.len() + 1]));
    }
    Some(h.rsplit_once(':').map_or(h, |(host, _)| host))
}

/// Whether `path` holds the escape `%` `hi` `lo` (either case of the letter).
fn has_escape(path: &str, hi: u8, lo: u8) -> bool {
    path.as_bytes().windows(3).any(|w| w[0] == b'%' && w[1] == hi && w[2].to_ascii_lowercase() == lo)
}

/// 1 for a `.` segment, 2 for `..`, 0 otherwise, with `%2e`/`%2E` read as `.` and any `;params`
/// ignored (`..;x` is `..` to servlet containers).
fn dots(segment: &str) -> usize {
    let segment = segment.split_once(';').map_or(segment, |(s, _)| s);
    let b = segment.as_bytes();
    let (mut i, mut n) = (0, 0);
    while i < b.len() {
        if b[i] == b'.' {
            i += 1;
        } else if b[i] == b'%' && b.get(i + 1) == Some(&b'2') && matches!(b.get(i + 2), Some(b'e' | b'E')) {
            i += 3;
        } else {
            return 0;
        }
        n += 1;
        if n > 2 {
            return 0;
        }
    }
    n
}

/// Removes dot segments (RFC 3986 section 5.2.4), treating `%2e`/`%2E` as `.`. Borrowed (and
/// nothing allocated) when there are none.
pub(crate) fn normalize_path(path: &str) -> Cow<'_, str> {
    if !path.split('/').any(|s| dots(s) > 0) {
        return Cow::Borrowed(path);
    }
    let mut out: Vec<&str> = Vec::new();
    let segments: Vec<&str> = path.split('/').collect();
    let last = segments.len() - 1;
    for (i, seg) in segments.iter().enumerate() {
        match dots(seg) {
            1 => {
                if i == last {
                    out.push("");
                }
            }
            2 => {
                // Never above the root: the first (empty) segment stays.
                if out.len() > 1 {
                    out.pop();
                }
                if i == last {
                    out.push("");
                }
            }
            _ => out.push(seg),
        }
    }
    let mut s = out.join("/");
    if !s.starts_with('/') {
        s.insert(0, '/');
    }
    Cow::Owned(s)
}

/// What a connection's requests share: the client's address, whether it came over TLS, and the
/// forwarding headers' values for it, rendered once per connection.
#[derive(Debug)]
pub(crate) struct Peer {
    /// The client's address.
    pub addr: SocketAddr,
    /// The connection is TLS.
    pub tls: bool,
    /// The connection speaks HTTP/2.
    pub h2: bool,
    xff: HeaderValue,
    forwarded: String,
}

impl Peer {
    /// The forwarding values for a plain HTTP/1 client.
    pub(crate) fn new(addr: SocketAddr) -> Self {
        Peer::with(addr, false, false)
    }

    /// The forwarding values for a client, over TLS or not, HTTP/2 or not.
    pub(crate) fn with(addr: SocketAddr, tls: bool, h2: bool) -> Self {
        let ip = addr.ip().to_string();
        let node = if addr.is_ipv6() { format!("\"[{ip}]\"") } else { ip.clone() };
        let proto = if tls { "https" } else { "http" };
        Peer {
            addr,
            tls,
            h2,
            xff: HeaderValue::try_from(ip).unwrap_or_else(|_| HeaderValue::from_static("unknown")),
            forwarded: format!("for={node};proto={proto}"),
        }
    }
}

// Header names as constants: a `&str` name is parsed and classified on every use.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
static X_FORWARDED_PROTO: HeaderName = HeaderName::from_static("x-forwarded-proto");
static X_FORWARDED_HOST: HeaderName = HeaderName::from_static("x-forwarded-host");

/// Adds `X-Forwarded-For`, `X-Forwarded-Proto`, `X-Forwarded-Host` and `Forwarded`.
pub(crate) fn add_forwarded(headers: &mut HeaderMap, peer: &Peer) {
    match headers.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) => {
            if let Ok(v) = HeaderValue::try_from(format!("{prev}, {}", peer.addr.ip())) {
                headers.insert(X_FORWARDED_FOR.clone(), v);
            }
        }
        None => {
            headers.insert(X_FORWARDED_FOR.clone(), peer.xff.clone());
        }
    }
    headers.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(if peer.tls { "https" } else { "http" }));
    let host = headers.get(header::HOST).cloned();
    // `Forwarded`: the previous value, then this hop's `for=...;proto=...` and its quoted host,
    // written once into a buffer of the exact size (a value whose buffer has spare room is
    // copied again on its way into a header value).
    let prev = headers.get(header::FORWARDED).and_then(|v| v.to_str().ok()).map(str::as_bytes);
    let host_text =
        host.as_ref().map(HeaderValue::as_bytes).filter(|t| t.iter().all(|&b| b.is_ascii_graphic() && b != b'"'));
    let len = prev.map_or(0, |p| p.len() + 2) + peer.forwarded.len() + host_text.map_or(0, |h| h.len() + 8);
    let mut fwd = Vec::with_capacity(len);
    if let Some(p) = prev {
        fwd.extend_from_slice(p);
        fwd.extend_from_slice(b", ");
    }
    fwd.extend_from_slice(peer.forwarded.as_bytes());
    if let Some(h) = host_text {
        fwd.extend_from_slice(b";host=\"");
        fwd.extend_from_slice(h);
        fwd.push(b'"');
    }
    if let Some(h) = host {
        headers.insert(X_FORWARDED_HOST.clone(), h);
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(bytes::Bytes::from(fwd)) {
        headers.insert(header::FORWARDED, v);
    }
}

/// This gateway's `Via` entry.
#[derive(Clone, Debug)]
pub(crate) struct Via {
    entry: String,
    /// The entry as a header value, for the common case of a request without `Via`.
    value: HeaderValue,
}

impl Via {
    /// An entry with a fresh random id (loops are detected per process).
    pub(crate) fn random() -> Self {
        let entry = format!("1.1 keyroute-{:012x}", random_u64() & 0xffff_ffff_ffff);
        let value = HeaderValue::try_from(entry.as_str()).unwrap_or_else(|_| HeaderValue::from_static("1.1 keyroute"));
        Via { entry, value }
    }

    /// Whether `headers` already passed through this gateway.
    pub(crate) fn looped(&self, headers: &HeaderMap) -> bool {
        headers
            .get_all(header::VIA)
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .any(|e| e.trim() == self.entry)
    }

    /// Appends the entry.
    pub(crate) fn append(&self, headers: &mut HeaderMap) {
        if !headers.contains_key(header::VIA) {
            headers.insert(header::VIA, self.value.clone());
            return;
        }
        let joined = {
            let prev: Vec<&str> = headers.get_all(header::VIA).iter().filter_map(|v| v.to_str().ok()).collect();
            if prev.is_empty() { self.entry.clone() } else { format!("{}, {}", prev.join(", "), self.entry) }
        };
        if let Ok(v) = HeaderValue::try_from(joined) {
            headers.insert(header::VIA, v);
        }
    }
}

/// A random number from the OS's random source (`getrandom`), for the request id counter's start
/// and the `Via` entry: ids that differ between processes, never placement. Should the OS refuse,
/// the clock's nanoseconds (the ids stay unique within the process: they count up).
pub(crate) fn random_u64() -> u64 {
    getrandom::u64().unwrap_or_else(|_| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64)
    })
}

pub(crate) use crate::body::REQUEST_ID;

/// The request's id, as the header value it is sent in: its `X-Request-Id` when that is 1 to 128
/// visible ASCII characters (the client's value itself, nothing copied), else a new one (`next`
/// is a process-wide counter, started at a random value, mixed into 16 hex digits).
pub(crate) fn request_id(headers: &HeaderMap, next: impl FnOnce() -> u64) -> HeaderValue {
    if let Some(v) = headers.get(&REQUEST_ID)
        && (1..=128).contains(&v.len())
        && v.as_bytes().iter().all(u8::is_ascii_graphic)
    {
        return v.clone();
    }
    let mut hex = [0u8; 16];
    let _ = std::io::Write::write_fmt(&mut &mut hex[..], format_args!("{:016x}", keyroute::hash::mix64(next())));
    // Owned by a shared buffer: the request path clones the value into the upstream head, and a
    // buffer made from a slice would be copied again on its first clone.
    HeaderValue::from_maybe_shared(bytes::Bytes::from_owner(hex))
        .unwrap_or_else(|_| HeaderValue::from_static("0000000000000000"))
}

/// A worker's response head as the client gets it: no hop-by-hop headers, and the pool's worker
/// header naming who served.
pub(super) fn worker_head(
    head: &mut http::response::Parts,
    http: &crate::config::HttpPoolConfig,
    worker: &keyroute_fleet::pool::WorkerState,
) {
    strip_hop_by_hop(&mut head.headers);
    if let Some(h) = &http.worker_header
        && let Ok(v) = HeaderValue::try_from(worker.name.as_str())
    {
        head.headers.insert(h.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(version: Version, target: &str, hosts: &[&str]) -> Result<(String, Option<String>), BadHead> {
        let mut uri: Uri = target.parse().expect("uri");
        let mut h = HeaderMap::new();
        for host in hosts {
            h.append(header::HOST, HeaderValue::from_str(host).expect("value"));
        }
        canonicalize(version, &mut uri, &mut h)?;
        Ok((uri.to_string(), h.get(header::HOST).map(|v| v.to_str().expect("ascii").to_owned())))
    }

    #[test]
    fn absolute_form_wins_over_host() {
        assert_eq!(
            canon(Version::HTTP_11, "http://a.example/x?y=1", &["b.example"]),
            Ok(("/x?y=1".into(), Some("a.example".into())))
        );
        assert_eq!(
            canon(Version::HTTP_11, "http://a.example:8080", &["x"]),
            Ok(("/".into(), Some("a.example:8080".into())))
        );
        assert_eq!(canon(Version::HTTP_11, "http://u@a.example/x", &["a.example"]), Err(BadHead::InvalidTarget));
        assert_eq!(canon(Version::HTTP_11, "ftp://a.example/x", &["a.example"]), Err(BadHead::InvalidTarget));
    }

    #[test]
    fn host_must_be_single_and_valid() {
        assert_eq!(canon(Version::HTTP_11, "/x", &["a", "b"]), Err(BadHead::DuplicateHost));
        assert_eq!(canon(Version::HTTP_11, "/x", &["a", "a"]), Err(BadHead::DuplicateHost));
        assert_eq!(canon(Version::HTTP_11, "/x", &[]), Err(BadHead::MissingHost));
        assert_eq!(canon(Version::HTTP_10, "/x", &[]), Ok(("/x".into(), None)));
        for bad in ["a b", "a/b", "a:x", "a@b", "[::1", "", "a:99999"] {
            assert_eq!(canon(Version::HTTP_11, "/x", &[bad]), Err(BadHead::InvalidHost), "{bad:?}");
        }
        for good in ["a.example", "a.example:80", "127.0.0.1:9", "[::1]:8080", "[::1]", "under_score"] {
            assert_eq!(canon(Version::HTTP_11, "/x", &[good]), Ok(("/x".into(), Some(good.into()))), "{good}");
        }
    }

    #[test]
    fn dot_segments_are_removed_before_routing() {
        for (raw, want) in [
            ("/thumb/../admin", "/admin"),
            ("/thumb/%2e%2e/admin", "/admin"),
            ("/thumb/%2E%2e/admin?x=/../", "/admin?x=/../"),
            ("/a/./b/.", "/a/b/"),
            ("/a/b/..", "/a/"),
            ("/../../etc", "/etc"),
            ("/..", "/"),
            ("/a/..b/c", "/a/..b/c"),
            ("/plain/path", "/plain/path"),
            ("/thumb/..;/admin", "/admin"),
            ("/thumb/.;x/a", "/thumb/a"),
        ] {
            assert_eq!(canon(Version::HTTP_11, raw, &["h"]).map(|(u, _)| u), Ok(want.to_owned()), "{raw}");
        }
    }

    #[test]
    fn ambiguous_slashes_are_refused() {
        for raw in ["/thumb/..%2fadmin", "/thumb/..%2Fadmin", "/thumb/..%5cadmin", "/thumb/a%5Cb", "/thumb/..\\admin"] {
            assert_eq!(canon(Version::HTTP_11, raw, &["h"]), Err(BadHead::AmbiguousPath), "{raw}");
        }
        assert!(BadHead::AmbiguousPath.message().contains("%2F"));
        // HTTP/2 must name its host too: :authority (the URI's) or Host.
        assert_eq!(canon(Version::HTTP_2, "/x", &[]), Err(BadHead::MissingHost));
        assert!(canon(Version::HTTP_2, "http://a.example/x", &[]).is_ok());
        assert!(canon(Version::HTTP_2, "/x", &["a.example"]).is_ok());
        assert!(canon(Version::HTTP_10, "/x", &[]).is_ok(), "HTTP/1.0 needs no Host");
        // Absolute form still needs a valid Host on HTTP/1.1.
        assert_eq!(canon(Version::HTTP_11, "http://a.example/x", &[]), Err(BadHead::MissingHost));
        assert_eq!(canon(Version::HTTP_11, "http://a.example/x", &["a b"]), Err(BadHead::InvalidHost));
    }

    #[test]
    fn content_lengths_must_agree() {
        let mut h = HeaderMap::new();
        assert!(framing_ok(&h, Some(3)));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("3"));
        assert!(framing_ok(&h, Some(3)) && framing_ok(&h, None));
        assert!(!framing_ok(&h, Some(4)));
        h.append(header::CONTENT_LENGTH, HeaderValue::from_static("4"));
        assert!(!framing_ok(&h, None));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static(""));
        assert!(!framing_ok(&h, None));
    }

    #[test]
    fn chunked_messages_lose_content_length() {
        let mut h = HeaderMap::new();
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert(header::CONNECTION, HeaderValue::from_static("x-secret, host"));
        h.insert("x-secret", HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("a"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key(header::CONTENT_LENGTH));
        assert!(!h.contains_key(header::TRANSFER_ENCODING));
        assert!(!h.contains_key("x-secret"));
        assert!(h.contains_key(header::HOST));
        // Found by fuzzing: a Connection value with non-ASCII bytes was not read at all.
        let mut h = HeaderMap::new();
        h.insert(header::CONNECTION, HeaderValue::from_bytes(b"x-secret, caf\xc3\xa9").expect("value"));
        h.insert("x-secret", HeaderValue::from_static("s"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains_key("x-secret"));
    }

    #[test]
    fn via_detects_its_own_loop_only() {
        let (a, b) = (Via::random(), Via::random());
        let mut h = HeaderMap::new();
        h.insert(header::VIA, HeaderValue::from_static("1.0 fred"));
        b.append(&mut h);
        assert!(!a.looped(&h));
        assert!(b.looped(&h));
        a.append(&mut h);
        assert!(a.looped(&h));
        assert!(
            h.get(header::VIA).and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("1.0 fred, 1.1 keyroute-"))
        );
    }

    #[test]
    fn request_ids_are_kept_when_sane() {
        let mut h = HeaderMap::new();
        h.insert(&REQUEST_ID, HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h, || 1), "abc-123");
        assert_eq!(request_id(&HeaderMap::new(), || 1), format!("{:016x}", keyroute::hash::mix64(1)).as_str());
        h.insert(&REQUEST_ID, HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h, || 1).len(), 16);
        assert_ne!(request_id(&h, || 1), request_id(&h, || 2));
    }
}
