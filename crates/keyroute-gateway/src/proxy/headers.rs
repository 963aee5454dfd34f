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

use http::header::{self, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{Uri, Version};
use smallvec::SmallVec;

use crate::head::{Fields, ReqHead, name_is, text};

pub(crate) use crate::hop::HOP_BY_HOP;

/// Removes the hop-by-hop headers and those `Connection` lists; a message that came with
/// `Transfer-Encoding` also loses `Content-Length` (the length is the chunked body's, and the engine
/// re-frames what it forwards).
pub(crate) fn strip_hop_by_hop(fields: &mut Fields) {
    // One pass over the (few) fields, instead of a lookup per hop-by-hop name.
    let mut drop: SmallVec<[HeaderName; 8]> = SmallVec::new();
    for (name, value) in fields.iter() {
        // Every hop-by-hop name is 2 to 19 letters long: most fields are passed over by length.
        if !(2..=19).contains(&name.len()) {
            continue;
        }
        let hop = HOP_BY_HOP.iter().chain([&TRANSFER_ENCODING]).find(|h| name_is(name, h.as_str().as_bytes()));
        let Some(hop) = hop else { continue };
        drop.push(hop.clone());
        if hop == header::CONNECTION {
            // As bytes: a value with non-ASCII bytes in it still names the headers it lists.
            let listed = value.split(|&b| b == b',').map(<[u8]>::trim_ascii);
            // `Connection: host` must not strip the Host header an HTTP/1.1 request needs.
            drop.extend(listed.filter_map(|n| HeaderName::from_bytes(n).ok()).filter(|n| n != header::HOST));
        }
        if hop == header::TRANSFER_ENCODING {
            drop.push(header::CONTENT_LENGTH);
        }
    }
    for name in &drop {
        fields.remove(name);
    }
    // Only the h2c upgrade uses it (RFC 7540 §3.2.1), and h2c is never tunnelled: it goes whether
    // or not `Connection` names it.
    fields.remove(&HTTP2_SETTINGS);
}

/// The request fields of a WebSocket opening handshake (RFC 6455 section 4.1), which mean
/// nothing outside one.
static WEBSOCKET_HANDSHAKE: [HeaderName; 4] = [
    header::SEC_WEBSOCKET_KEY,
    header::SEC_WEBSOCKET_VERSION,
    header::SEC_WEBSOCKET_EXTENSIONS,
    header::SEC_WEBSOCKET_PROTOCOL,
];

/// `Transfer-Encoding`, as a `static` (a borrowed `const` is a temporary).
static TRANSFER_ENCODING: HeaderName = header::TRANSFER_ENCODING;

/// `HTTP2-Settings`, the h2c upgrade's settings.
static HTTP2_SETTINGS: HeaderName = HeaderName::from_static("http2-settings");

/// The protocols of an HTTP/1.1 request's upgrade offer (`Connection: upgrade` and `Upgrade`) that
/// the route allows (`allowed`: lowercase protocol names, matched without their `/version`), in
/// the client's order, read before the hop-by-hop headers are stripped. `None` when nothing
/// allowed is offered: the request is then served as plain HTTP/1.1 (its `Upgrade` and, for h2c,
/// `HTTP2-Settings` never reach the worker).
pub(crate) fn upgrade_of(version: http::Version, fields: &Fields, allowed: &[String]) -> Option<HeaderValue> {
    if version != http::Version::HTTP_11 {
        return None;
    }
    let asks = fields
        .get_all(&header::CONNECTION)
        .any(|v| v.split(|&b| b == b',').any(|t| t.trim_ascii().eq_ignore_ascii_case(b"upgrade")));
    if !asks {
        return None;
    }
    let offered = fields.get_all(&header::UPGRADE).flat_map(|v| v.split(|&b| b == b','));
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
    head: &mut ReqHead,
    upgrades: &[String],
    body_end: bool,
    peer: &Peer,
    via: &Via,
    id: &HeaderValue,
) {
    let upgrade = upgrade_of(head.version, &head.fields, upgrades);
    let fields = &mut head.fields;
    strip_hop_by_hop(fields);
    let websocket = upgrade.as_ref().is_some_and(|u| {
        let names = u.as_bytes().split(|&b| b == b',').map(|p| p.trim_ascii().split(|&b| b == b'/').next());
        names.flatten().any(|n| n.eq_ignore_ascii_case(b"websocket"))
    });
    if !websocket {
        // A handshake that is not tunnelled is not forwarded either: without its upgrade, a
        // worker that still acts on the key would answer a plain request with a 101.
        for name in &WEBSOCKET_HANDSHAKE {
            fields.remove(name);
        }
    }
    if let Some(u) = upgrade {
        fields.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        fields.insert(header::UPGRADE, u);
    }
    // A body whose length is not known (it came chunked) goes on chunked: a head without framing
    // fields would send a GET or HEAD without it.
    if !body_end && !fields.contains(&header::CONTENT_LENGTH) {
        fields.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
    }
    add_forwarded(fields, peer);
    via.append(fields);
    fields.insert(REQUEST_ID.clone(), id.clone());
}

/// Whether the client accepts trailers (`TE: trailers`), read before the hop-by-hop fields go.
pub(crate) fn accepts_trailers(fields: &Fields) -> bool {
    fields.get_all(&header::TE).any(|v| {
        v.split(|&b| b == b',')
            .any(|t| t.split(|&b| b == b';').next().is_some_and(|t| t.trim_ascii().eq_ignore_ascii_case(b"trailers")))
    })
}

/// Whether an offered protocol (`name` or `name/version`) is one of `allowed`. `h2c` never is.
pub(crate) fn upgrade_allowed(protocol: &[u8], allowed: &[String]) -> bool {
    let name = protocol.split(|&b| b == b'/').next().unwrap_or_default();
    !name.eq_ignore_ascii_case(b"h2c") && allowed.iter().any(|a| a.as_bytes().eq_ignore_ascii_case(name))
}

/// Whether the request's `Content-Length` values (if any) are one valid number that agrees with
/// the body's exact length, when that is known.
pub(crate) fn framing_ok(fields: &Fields, exact: Option<u64>) -> bool {
    let mut length = None;
    for v in fields.get_all(&header::CONTENT_LENGTH) {
        let Some(n) = text(v).and_then(|t| t.trim().parse::<u64>().ok()) else { return false };
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
pub(crate) fn canonicalize(version: Version, uri: &mut Uri, fields: &mut Fields) -> Result<(), BadHead> {
    let mut hosts = fields.get_all(&header::HOST);
    let first = hosts.next();
    if hosts.next().is_some() {
        return Err(BadHead::DuplicateHost);
    }
    // Even with an absolute-form target, an HTTP/1.1 request must carry one valid Host
    // (RFC 9112 section 3.2); the target's authority then replaces it.
    // An HTTP/2 request names its host by `:authority` (the URI's, here) or Host, and must name
    // one (RFC 9113 section 8.3.1), as an HTTP/1.1 request must send Host.
    match first {
        Some(h) if valid_authority(text(h).ok_or(BadHead::InvalidHost)?) => {}
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
        fields.insert(header::HOST, v);
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
pub(crate) fn host_of(fields: &Fields) -> Option<&str> {
    let h = text(fields.get(&header::HOST)?)?;
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
pub(crate) fn add_forwarded(fields: &mut Fields, peer: &Peer) {
    let xff = match fields.get(&X_FORWARDED_FOR).and_then(text) {
        Some(prev) => HeaderValue::try_from(format!("{prev}, {}", peer.addr.ip())).ok(),
        None => Some(peer.xff.clone()),
    };
    if let Some(v) = xff {
        fields.insert(X_FORWARDED_FOR.clone(), v);
    }
    fields.insert(X_FORWARDED_PROTO.clone(), HeaderValue::from_static(if peer.tls { "https" } else { "http" }));
    let host = fields.value(&header::HOST);
    // `Forwarded`: the previous value, then this hop's `for=...;proto=...` and its quoted host,
    // written once into a buffer of the exact size (a value whose buffer has spare room is
    // copied again on its way into a header value).
    let prev = fields.get(&header::FORWARDED).filter(|v| text(v).is_some());
    let host_text =
        host.as_ref().map(HeaderValue::as_bytes).filter(|t| t.iter().all(|&b| b.is_ascii_graphic() && b != b'"'));
    let len = prev.map_or(0, |p| p.len() + 2) + peer.forwarded.len() + host_text.map_or(0, |h| h.len() + 8);
    let fwd = crate::arena::bytes(len, |fwd| {
        if let Some(p) = prev {
            fwd.extend_from_slice(p);
            fwd.extend_from_slice(b", ");
        }
        fwd.extend_from_slice(peer.forwarded.as_bytes());
        if let Some(h) = host_text {
            fwd.extend_from_slice(b";host=\"");
            fwd.extend_from_slice(h);
            fwd.extend_from_slice(b"\"");
        }
    });
    if let Some(h) = host {
        fields.insert(X_FORWARDED_HOST.clone(), h);
    }
    if let Ok(v) = HeaderValue::from_maybe_shared(fwd) {
        fields.insert(header::FORWARDED, v);
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
    pub(crate) fn looped(&self, fields: &Fields) -> bool {
        fields.get_all(&header::VIA).filter_map(text).flat_map(|v| v.split(',')).any(|e| e.trim() == self.entry)
    }

    /// Appends the entry.
    pub(crate) fn append(&self, fields: &mut Fields) {
        if !fields.contains(&header::VIA) {
            fields.insert(header::VIA, self.value.clone());
            return;
        }
        let joined = {
            let prev: Vec<&str> = fields.get_all(&header::VIA).filter_map(text).collect();
            if prev.is_empty() { self.entry.clone() } else { format!("{}, {}", prev.join(", "), self.entry) }
        };
        if let Ok(v) = HeaderValue::try_from(joined) {
            fields.insert(header::VIA, v);
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
pub(crate) fn request_id(fields: &Fields, next: impl FnOnce() -> u64) -> HeaderValue {
    if let Some(v) = fields.value(&REQUEST_ID)
        && (1..=128).contains(&v.len())
        && v.as_bytes().iter().all(u8::is_ascii_graphic)
    {
        return v;
    }
    let mut hex = [0u8; 16];
    let _ = std::io::Write::write_fmt(&mut &mut hex[..], format_args!("{:016x}", keyroute::hash::mix64(next())));
    // In the thread's shared block (`crate::arena`): the request path clones the value into the
    // upstream head, which then copies nothing, and no allocation is made for it.
    HeaderValue::from_maybe_shared(crate::arena::bytes(hex.len(), |b| b.extend_from_slice(&hex)))
        .unwrap_or_else(|_| HeaderValue::from_static("0000000000000000"))
}

/// A worker's response head as the client gets it: no hop-by-hop headers, and the pool's worker
/// header naming who served.
pub(super) fn worker_head(
    fields: &mut Fields,
    http: &crate::config::HttpPoolConfig,
    worker: &keyroute_fleet::pool::WorkerState,
) {
    strip_hop_by_hop(fields);
    if let Some(h) = &http.worker_header
        && let Ok(v) = HeaderValue::try_from(worker.name.as_str())
    {
        fields.insert(h.clone(), v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderMap;

    fn text(v: Option<&[u8]>) -> Option<String> {
        v.map(|v| String::from_utf8_lossy(v).into_owned())
    }

    /// A request head as the HTTP/1.1 engine parses it, in both forms the request path reads:
    /// as received, and as a map. `None` when the engine refuses it.
    fn both_forms(raw: &str) -> Option<(ReqHead, ReqHead)> {
        let limits = keyroute_http1::Limits { max_head_bytes: 1 << 20, max_headers: 300 };
        let buf = bytes::Bytes::copy_from_slice(raw.as_bytes());
        let keyroute_http1::Parsed::Complete(head, _) = keyroute_http1::parse_request(&buf, &limits).ok()? else {
            return None;
        };
        let received = ReqHead::from_http1(head)?;
        let mapped = ReqHead::from_parts(received.to_parts());
        assert!(matches!(mapped.fields, Fields::Map(_)));
        Some((received, mapped))
    }

    fn canon(version: Version, target: &str, hosts: &[&str]) -> Result<(String, Option<String>), BadHead> {
        let mut uri: Uri = target.parse().expect("uri");
        let mut h = Fields::Map(HeaderMap::new());
        for host in hosts {
            h.append(header::HOST, HeaderValue::from_str(host).expect("value"));
        }
        let map = canonicalize(version, &mut uri, &mut h).map(|()| (uri.to_string(), text(h.get(&header::HOST))));
        // The same head as the HTTP/1 engine reads it (kept as received) is canonicalised alike.
        if version < Version::HTTP_2 {
            let v = if version == Version::HTTP_10 { "1.0" } else { "1.1" };
            let lines: String = hosts.iter().map(|h| format!("Host: {h}\r\n")).collect();
            if let Some((mut received, _)) = both_forms(&format!("GET {target} HTTP/{v}\r\n{lines}\r\n")) {
                assert!(matches!(received.fields, Fields::Raw(_)));
                let raw = canonicalize(version, &mut received.uri, &mut received.fields)
                    .map(|()| (received.uri.to_string(), text(received.fields.get(&header::HOST))));
                assert_eq!(raw, map, "{target} {hosts:?}");
            }
        }
        map
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
        let mut h = Fields::Map(HeaderMap::new());
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
        let mut h = Fields::Map(HeaderMap::new());
        h.insert(header::TRANSFER_ENCODING, HeaderValue::from_static("chunked"));
        h.insert(header::CONTENT_LENGTH, HeaderValue::from_static("5"));
        h.insert(header::CONNECTION, HeaderValue::from_static("x-secret, host"));
        h.insert(HeaderName::from_static("x-secret"), HeaderValue::from_static("1"));
        h.insert(header::HOST, HeaderValue::from_static("a"));
        strip_hop_by_hop(&mut h);
        assert!(!h.contains(&header::CONTENT_LENGTH));
        assert!(!h.contains(&header::TRANSFER_ENCODING));
        assert!(h.get_named("x-secret").is_none());
        assert!(h.contains(&header::HOST));
        // Found by fuzzing: a Connection value with non-ASCII bytes was not read at all.
        let mut h = Fields::Map(HeaderMap::new());
        h.insert(header::CONNECTION, HeaderValue::from_bytes(b"x-secret, caf\xc3\xa9").expect("value"));
        h.insert(HeaderName::from_static("x-secret"), HeaderValue::from_static("s"));
        strip_hop_by_hop(&mut h);
        assert!(h.get_named("x-secret").is_none());
    }

    #[test]
    fn via_detects_its_own_loop_only() {
        let (a, b) = (Via::random(), Via::random());
        let mut h = Fields::Map(HeaderMap::new());
        h.insert(header::VIA, HeaderValue::from_static("1.0 fred"));
        b.append(&mut h);
        assert!(!a.looped(&h));
        assert!(b.looped(&h));
        a.append(&mut h);
        assert!(a.looped(&h));
        assert!(text(h.get(&header::VIA)).is_some_and(|v| v.starts_with("1.0 fred, 1.1 keyroute-")));
    }

    #[test]
    fn request_ids_are_kept_when_sane() {
        let mut h = Fields::Map(HeaderMap::new());
        h.insert(REQUEST_ID.clone(), HeaderValue::from_static("abc-123"));
        assert_eq!(request_id(&h, || 1), "abc-123");
        let none = Fields::Map(HeaderMap::new());
        assert_eq!(request_id(&none, || 1), format!("{:016x}", keyroute::hash::mix64(1)).as_str());
        h.insert(REQUEST_ID.clone(), HeaderValue::from_static("has space"));
        assert_eq!(request_id(&h, || 1).len(), 16);
        assert_ne!(request_id(&h, || 1), request_id(&h, || 2));
    }

    #[test]
    fn hop_by_hop_names_are_within_the_length_filter() {
        for h in HOP_BY_HOP.iter().chain([&TRANSFER_ENCODING, &HTTP2_SETTINGS]) {
            assert!((2..=19).contains(&h.as_str().len()), "{h}");
        }
    }

    /// What a worker reads of a rewritten head: its target, and its fields with names lowercased,
    /// sorted by name (the order of fields of different names means nothing; of one name, it
    /// does, and a stable sort keeps it).
    fn as_worker_reads(head: &ReqHead) -> (String, Vec<(String, String)>) {
        let mut out = format!("{} {} HTTP/1.1\r\n", head.method, head.uri).into_bytes();
        head.fields.write(&mut out);
        out.extend_from_slice(b"\r\n");
        let buf = bytes::Bytes::from(out);
        let limits = keyroute_http1::Limits { max_head_bytes: 1 << 20, max_headers: 400 };
        let Ok(keyroute_http1::Parsed::Complete(h, n)) = keyroute_http1::parse_request(&buf, &limits) else {
            panic!("the written head does not parse: {buf:?}");
        };
        assert_eq!(n, buf.len(), "one head, nothing after it");
        let mut fields: Vec<(String, String)> =
            h.fields().iter().map(|(n, v)| (n.to_ascii_lowercase(), String::from_utf8_lossy(v).into_owned())).collect();
        fields.sort_by(|a, b| a.0.cmp(&b.0));
        (h.target().to_owned(), fields)
    }

    /// The request path rewrites a head kept as received exactly as it rewrites the same head as a
    /// map: what the worker reads is the same, field for field.
    #[test]
    fn both_forms_rewrite_alike() {
        let filler: String = (0..100).map(|i| format!("X-Filler-{i}: {i}\r\n")).collect();
        let many: String = (0..150).map(|i| format!("X-Many-{i}: {i}\r\n")).collect();
        let cases: Vec<(String, bool, &[&str])> = vec![
            ("GET /a?k=1 HTTP/1.1\r\nHost: a.example\r\n\r\n".into(), true, &[]),
            (
                "GET /a HTTP/1.1\r\nhost: a.example\r\nConnection: keep-alive, X-Secret\r\nX-Secret: s\r\n\
                 Keep-Alive: 5\r\nTE: trailers\r\nProxy-Authorization: p\r\nProxy-Connection: x\r\n\
                 Trailer: t\r\nHTTP2-Settings: AAA\r\nAccept: */*\r\nconnection: close\r\n\r\n"
                    .into(),
                true,
                &[],
            ),
            (
                "POST /up HTTP/1.1\r\nHost: a\r\nTransfer-Encoding: chunked\r\nX-Forwarded-For: 10.0.0.1\r\n\
                 x-forwarded-for: 10.0.0.2\r\nFORWARDED: for=1.2.3.4\r\nVia: 1.0 fred\r\nvia: 1.1 bob\r\n\
                 X-Request-Id: abc\r\nX-Forwarded-Proto: https\r\nX-Forwarded-Host: evil\r\n\r\n"
                    .into(),
                false,
                &[],
            ),
            (
                "PUT /p HTTP/1.1\r\nHost: a\r\nContent-Length: 3\r\nCookie: a=1\r\nCookie: b=2\r\n\r\n".into(),
                false,
                &[],
            ),
            (
                "GET /chat HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket, h2c\r\n\
                 Sec-WebSocket-Key: k\r\nSec-WebSocket-Version: 13\r\nHTTP2-Settings: x\r\n\r\n"
                    .into(),
                true,
                &["websocket"],
            ),
            (
                "GET /chat HTTP/1.1\r\nHost: a\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
                 Sec-WebSocket-Key: k\r\nSec-WebSocket-Protocol: p\r\n\r\n"
                    .into(),
                true,
                &[],
            ),
            ("GET http://b.example:8080/x/../y HTTP/1.1\r\nHost: a.example\r\n\r\n".into(), true, &[]),
            ("GET /old HTTP/1.0\r\nUser-Agent: u\r\n\r\n".into(), true, &[]),
            // Fields past the 64th (the edit set's second word), one of them dropped.
            (
                format!("GET / HTTP/1.1\r\nHost: a\r\n{filler}Connection: X-Late\r\nX-Late: 1\r\nX-After: 2\r\n\r\n"),
                true,
                &[],
            ),
            // More than the edit set can mark: a map from the start.
            (format!("GET / HTTP/1.1\r\nHost: a\r\n{many}Connection: X-Many-7\r\n\r\n"), true, &[]),
        ];
        let peer = Peer::with("192.0.2.7:4000".parse().expect("addr"), true, false);
        let via = Via::random();
        let id = HeaderValue::from_static("0123456789abcdef");
        for (raw, body_end, upgrades) in &cases {
            let upgrades: Vec<String> = upgrades.iter().map(|u| (*u).to_owned()).collect();
            let (mut received, mut mapped) = both_forms(raw).expect("the engine accepts the case");
            let many_fields = raw.contains("X-Many-149");
            assert_eq!(matches!(received.fields, Fields::Map(_)), many_fields, "{raw}");
            for head in [&mut received, &mut mapped] {
                canonicalize(head.version, &mut head.uri, &mut head.fields).expect("a valid head");
                let want = if raw.contains("X-Request-Id: abc") {
                    "abc".to_owned()
                } else {
                    format!("{:016x}", keyroute::hash::mix64(9))
                };
                assert_eq!(request_id(&head.fields, || 9), want.as_str(), "{raw}");
                upstream_head(head, &upgrades, *body_end, &peer, &via, &id);
            }
            let (a, b) = (as_worker_reads(&received), as_worker_reads(&mapped));
            assert_eq!(a, b, "{raw}");
            // And what the rewrite is for, on the form kept as received.
            let names: Vec<&str> = a.1.iter().map(|(n, _)| n.as_str()).collect();
            for gone in [
                "keep-alive",
                "te",
                "proxy-authorization",
                "proxy-connection",
                "trailer",
                "http2-settings",
                "x-secret",
                "x-late",
            ] {
                assert!(!names.contains(&gone), "{gone} forwarded: {raw}");
            }
            assert_eq!(names.iter().filter(|n| **n == "x-forwarded-for").count(), 1, "{raw}");
            assert_eq!(names.iter().filter(|n| **n == "via").count(), 1, "{raw}");
            assert!(a.1.contains(&("x-request-id".into(), "0123456789abcdef".into())), "{raw}");
        }
    }

    /// A worker's response head goes back as it came, rewritten exactly as the same head in a map
    /// is: hop-by-hop fields gone, a repeated `Content-Length` once, the worker header added; a
    /// head with a line ended by a bare LF is taken into a map and goes back in CRLF lines.
    #[test]
    fn both_forms_of_a_response_rewrite_alike() {
        use keyroute_http1::OutgoingHead as _;
        let cases = [
            "HTTP/1.1 200 OK\r\nServer: w\r\nContent-Length: 2\r\nContent-Type: text/plain\r\n\r\n",
            "HTTP/1.1 200 OK\r\nContent-Length: 2\r\ncontent-length: 2\r\nConnection: keep-alive, X-Hop\r\n\
             X-Hop: 1\r\nKeep-Alive: timeout=5\r\nSet-Cookie: a=1\r\nSet-Cookie: b=2\r\nX-Cache: HIT\r\n\r\n",
            "HTTP/1.1 404 Not Found\r\nTransfer-Encoding: chunked\r\nTrailer: x\r\nVary: Accept\r\n\r\n",
            "HTTP/1.1 200 OK\nContent-Length: 2\nX-Bare: lf\r\nUpgrade: h2c\n\n",
        ];
        let limits = keyroute_http1::Limits::default();
        let reads = |head: &crate::head::RespHead| {
            let mut out = b"HTTP/1.1 200 OK\r\n".to_vec();
            head.write_fields(&mut out, &|_| false);
            out.extend_from_slice(b"\r\n");
            assert!(!out.windows(2).any(|w| w[1] == b'\n' && w[0] != b'\r'), "a bare LF written");
            let buf = bytes::Bytes::from(out);
            let Ok(keyroute_http1::Parsed::Complete(h, _)) = keyroute_http1::parse_response(&buf, &limits, false)
            else {
                panic!("the written head does not parse: {buf:?}")
            };
            let mut fields: Vec<(String, String)> = h
                .fields()
                .iter()
                .map(|(n, v)| (n.to_ascii_lowercase(), String::from_utf8_lossy(v).into_owned()))
                .collect();
            fields.sort_by(|a, b| a.0.cmp(&b.0));
            fields
        };
        for raw in cases {
            let buf = bytes::Bytes::from_static(raw.as_bytes());
            let Ok(keyroute_http1::Parsed::Complete(h, _)) = keyroute_http1::parse_response(&buf, &limits, false)
            else {
                panic!("the case does not parse: {raw}")
            };
            let mut received = crate::head::Answer::from_worker(h.clone(), ());
            assert_eq!(matches!(received.head.fields, Fields::Raw(_)), !raw.contains("\nX-Bare"), "{raw}");
            let mut mapped = crate::head::Answer::from(crate::head::Answer::from_worker(h, ()).into_response());
            assert!(matches!(mapped.head.fields, Fields::Map(_)));
            // What `worker_head` does, with a pool's worker header.
            for a in [&mut received, &mut mapped] {
                strip_hop_by_hop(&mut a.head.fields);
                a.head.fields.insert(HeaderName::from_static("x-served-by"), HeaderValue::from_static("w1"));
            }
            let (a, b) = (reads(&received.head), reads(&mapped.head));
            assert_eq!(a, b, "{raw}");
            let names: Vec<&str> = a.iter().map(|(n, _)| n.as_str()).collect();
            for gone in ["connection", "keep-alive", "x-hop", "transfer-encoding", "trailer", "upgrade"] {
                assert!(!names.contains(&gone), "{gone} passed back: {raw}");
            }
            assert!(names.iter().filter(|n| **n == "content-length").count() <= 1, "{raw}");
            assert!(a.contains(&("x-served-by".into(), "w1".into())), "{raw}");
        }
    }
}
