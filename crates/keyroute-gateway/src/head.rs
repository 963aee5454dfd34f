//! A request's head on its way through the request path: its method, target and version, and
//! its fields, in one of two forms.
//!
//! - **As received** ([`Fields::Raw`]): an HTTP/1.1 client's head stays the bytes the engine
//!   parsed ([`keyroute_http1::RequestHead`], an index of spans over the buffer the bytes were read
//!   into), and the request path's changes are kept beside it as edits: lines dropped (a bit per
//!   field) and lines added (a list from the thread's spares). A worker's response head comes
//!   back the same way ([`Answer::from_worker`]) and is written to the client as it came. Reading
//!   a field scans the index (a 64-bit filter of the names present answers most lookups, which
//!   are of names a head does not have, without a scan); writing a head copies the kept lines as
//!   they came (runs of consecutive lines in one copy), then the added ones. Nothing is parsed
//!   into a map, hashed or allocated per field.
//! - **As a map** ([`Fields::Map`]): an HTTP/2 client's head (hyper gives a `HeaderMap`), a
//!   caller of [`crate::ProxyService::call`], and a head with more fields than the edit set can
//!   mark (over 128).
//!
//! Both answer the same questions the same way ([`Fields::get`] is the first value, as
//! `HeaderMap::get`; [`Fields::insert`] replaces every line of the name; names match ASCII
//! case-insensitively), so every stage reads one type; the tests `both_forms_rewrite_alike` and
//! `both_forms_of_a_response_rewrite_alike` (in `proxy::headers`) hold them to it. The response
//! cache, which keeps heads, takes a map ([`ReqHead::to_parts`], [`Answer::into_response`]): it
//! serves hot keys only, so the copy is made for them alone.

use bytes::Bytes;
use http::header::{HeaderMap, HeaderName, HeaderValue};
use http::{Method, Response, StatusCode, Uri, Version};
use keyroute_http1::buf::{Pool, Spare};
use keyroute_http1::{RequestHead, ResponseHead};
use std::cell::RefCell;

use crate::body::ProxyBody;

/// A request head: what the request path reads and rewrites (see the [module documentation](self)).
#[derive(Debug)]
pub(crate) struct ReqHead {
    /// The method.
    pub(crate) method: Method,
    /// The target (origin form once the route stage has canonicalised it).
    pub(crate) uri: Uri,
    /// The client's protocol version.
    pub(crate) version: Version,
    /// The fields.
    pub(crate) fields: Fields,
    /// The client said it accepts trailers (`TE: trailers`): read before the hop-by-hop fields
    /// go, for an HTTP/2 worker, which gets it (gRPC servers require it).
    pub(crate) trailers: bool,
}

/// The most fields a head as received may have: one bit each in [`Raw::dropped`].
const MAX_RAW_FIELDS: usize = 128;

/// The room a list of added fields is made with: `X-Forwarded-For`, `-Proto`, `-Host`,
/// `Forwarded`, `Via` and the request id, and two more (a new `Host`, framing, `Connection` and
/// `Upgrade` are rarer).
const ADDED_ROOM: usize = 8;

thread_local! {
    static ADDED_SPARES: RefCell<Vec<Vec<(HeaderName, HeaderValue)>>> = const { RefCell::new(Vec::new()) };
}

/// Lists of the fields the request path adds to a head: the head stays small (it is moved with
/// the futures that hold it) and, in steady state, allocates nothing (64 kept per thread, none
/// with room for more than 32).
static ADDED: Pool<Vec<(HeaderName, HeaderValue)>> = Pool::new(&ADDED_SPARES, 64, 32);

/// A head's fields, as received with edits, or as a map.
#[derive(Debug)]
pub(crate) enum Fields {
    /// An HTTP/1 head as the engine parsed it, and the request path's edits.
    Raw(Raw),
    /// A map.
    Map(HeaderMap),
}

/// A parsed head and its edits.
#[derive(Debug)]
pub(crate) struct Raw {
    head: keyroute_http1::Fields,
    /// Bit `i`: field `i` of the head is dropped.
    dropped: u128,
    /// Fields added, in order, after the head's.
    added: Spare<Vec<(HeaderName, HeaderValue)>>,
    /// A filter of the names the head holds ([`name_bit`] of each): most lookups are of names a
    /// head does not have (hop-by-hop fields, forwarding fields about to be added), and this
    /// answers them without a scan.
    seen: u64,
}

impl ReqHead {
    /// An HTTP/1.1 engine's head, its fields kept as received; `None` for a method `http` cannot
    /// represent (answered 400).
    pub(crate) fn from_http1(mut head: RequestHead) -> Option<ReqHead> {
        let method = Method::from_bytes(head.method().as_bytes()).ok()?;
        let uri = head.take_uri();
        let version = match head.version() {
            keyroute_http1::Version::Http10 => Version::HTTP_10,
            keyroute_http1::Version::Http11 => Version::HTTP_11,
        };
        let fields = if head.fields().len() <= MAX_RAW_FIELDS {
            Fields::Raw(Raw::new(head.into_fields()))
        } else {
            Fields::Map(map_of(head.fields(), false)?)
        };
        Some(ReqHead { method, uri, version, fields, trailers: false })
    }

    /// A head whose fields are a map (HTTP/2, [`crate::ProxyService::call`]).
    pub(crate) fn from_parts(parts: http::request::Parts) -> ReqHead {
        ReqHead {
            method: parts.method,
            uri: parts.uri,
            version: parts.version,
            fields: Fields::Map(parts.headers),
            trailers: false,
        }
    }

    /// The head as `http` parts with its fields in a map (a copy: the response cache keeps it).
    pub(crate) fn to_parts(&self) -> http::request::Parts {
        let mut r = http::Request::new(());
        *r.method_mut() = self.method.clone();
        *r.uri_mut() = self.uri.clone();
        *r.version_mut() = self.version;
        *r.headers_mut() = self.fields.to_map();
        r.into_parts().0
    }
}

/// A parsed head's fields as a map. A request's: `None` for a field `http` refuses (the request
/// is answered 400). A worker's response's (`response`): such a field is left out, and a repeated
/// `Content-Length` goes once (see [`Answer::from_worker`]).
fn map_of(fields: &keyroute_http1::Fields, response: bool) -> Option<HeaderMap> {
    let mut map = HeaderMap::with_capacity(fields.len() + ADDED_ROOM);
    for (i, (name, _)) in fields.iter().enumerate() {
        let name = HeaderName::from_bytes(name.as_bytes()).ok();
        let value = fields.value_bytes(i).and_then(|v| HeaderValue::from_maybe_shared(v).ok());
        let (Some(name), Some(value)) = (name, value) else {
            if response {
                continue;
            }
            return None;
        };
        if response && name == http::header::CONTENT_LENGTH && map.contains_key(http::header::CONTENT_LENGTH) {
            continue;
        }
        map.append(name, value);
    }
    Some(map)
}

/// A field value as text, as `HeaderValue::to_str` reads one: only when every byte is visible
/// ASCII, a space or a tab (a value with other bytes is not read as text anywhere, in either
/// form, so that both forms, and the gateway before them, agree).
pub(crate) fn text(value: &[u8]) -> Option<&str> {
    if value.iter().all(|&b| b == b'\t' || (b' '..=b'~').contains(&b)) { std::str::from_utf8(value).ok() } else { None }
}

/// Whether a field name as received is `name` (whose text is lowercase).
pub(crate) fn name_is(received: &[u8], name: &[u8]) -> bool {
    received.len() == name.len() && received.eq_ignore_ascii_case(name)
}

/// A field name's bit in [`Raw::seen`]: of its length and its first and last letters, any case.
fn name_bit(name: &[u8]) -> u64 {
    let (first, last) = (name.first().copied().unwrap_or(0), name.last().copied().unwrap_or(0));
    let h = name.len() as u32 * 7 + u32::from(first | 0x20) * 3 + u32::from(last | 0x20);
    1 << (h % 64)
}

/// The values of one name ([`Fields::get_all`]).
#[derive(Debug)]
pub(crate) struct Values<'a> {
    from: Source<'a>,
}

#[derive(Debug)]
enum Source<'a> {
    Map(http::header::ValueIter<'a, HeaderValue>),
    /// Field `next` of the head and on; past the head's fields, the added ones.
    Raw {
        raw: &'a Raw,
        name: HeaderName,
        next: usize,
    },
}

impl<'a> Iterator for Values<'a> {
    type Item = &'a [u8];

    fn next(&mut self) -> Option<&'a [u8]> {
        match &mut self.from {
            Source::Map(values) => values.next().map(HeaderValue::as_bytes),
            Source::Raw { raw, name, next } => {
                let fields = &raw.head;
                let received = fields.len();
                let want = name.as_str().as_bytes();
                while *next < received {
                    let i = *next;
                    *next += 1;
                    if raw.dropped & (1u128 << i) == 0
                        && let Some((n, v)) = fields.field(i)
                        && name_is(n, want)
                    {
                        return Some(v);
                    }
                }
                while let Some((n, v)) = raw.added.get(*next - received) {
                    *next += 1;
                    if n == name {
                        return Some(v.as_bytes());
                    }
                }
                None
            }
        }
    }
}

impl Raw {
    fn new(head: keyroute_http1::Fields) -> Raw {
        let seen = (0..head.len()).filter_map(|i| head.field(i)).fold(0, |seen, (n, _)| seen | name_bit(n));
        Raw { head, dropped: 0, added: Spare::later(&ADDED), seen }
    }

    /// The head's fields not dropped, with their indexes.
    fn kept(&self) -> impl Iterator<Item = (usize, (&[u8], &[u8]))> + '_ {
        let f = &self.head;
        (0..f.len()).filter(|&i| self.dropped & (1u128 << i) == 0).filter_map(move |i| Some((i, f.field(i)?)))
    }

    /// The first kept field of the head named `name` (lowercase), by index.
    fn find(&self, name: &[u8]) -> Option<(usize, &[u8])> {
        if self.seen & name_bit(name) == 0 {
            return None;
        }
        self.kept().find(|(_, (n, _))| name_is(n, name)).map(|(i, (_, v))| (i, v))
    }
}

impl Fields {
    /// The first value of `name`.
    pub(crate) fn get(&self, name: &HeaderName) -> Option<&[u8]> {
        match self {
            Fields::Map(m) => m.get(name).map(HeaderValue::as_bytes),
            Fields::Raw(r) => r
                .find(name.as_str().as_bytes())
                .map(|(_, v)| v)
                .or_else(|| r.added.iter().find(|(n, _)| n == name).map(|(_, v)| v.as_bytes())),
        }
    }

    /// The first value of the field named `name` (any case): for a name known only as text.
    pub(crate) fn get_named(&self, name: &str) -> Option<&[u8]> {
        match self {
            Fields::Map(m) => m.get(name).map(HeaderValue::as_bytes),
            Fields::Raw(r) => {
                let received = r.kept().find(|(_, (n, _))| n.eq_ignore_ascii_case(name.as_bytes()));
                received.map(|(_, (_, v))| v).or_else(|| {
                    r.added.iter().find(|(n, _)| n.as_str().eq_ignore_ascii_case(name)).map(|(_, v)| v.as_bytes())
                })
            }
        }
    }

    /// Every value of `name`, in order.
    pub(crate) fn get_all(&self, name: &HeaderName) -> Values<'_> {
        Values {
            from: match self {
                Fields::Map(m) => Source::Map(m.get_all(name).into_iter()),
                Fields::Raw(r) => {
                    // Past the head's fields at once when the filter says none has the name.
                    let next = if r.seen & name_bit(name.as_str().as_bytes()) == 0 { r.head.len() } else { 0 };
                    Source::Raw { raw: r, name: name.clone(), next }
                }
            },
        }
    }

    /// Whether `name` is present.
    pub(crate) fn contains(&self, name: &HeaderName) -> bool {
        self.get(name).is_some()
    }

    /// Every field, as (name, value), in order (a name as received keeps its case).
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&[u8], &[u8])> + '_ {
        let (raw, map) = match self {
            Fields::Raw(r) => (Some(r), None),
            Fields::Map(m) => (None, Some(m.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())))),
        };
        let received = raw.into_iter().flat_map(|r| r.kept().map(|(_, f)| f));
        let added = raw.into_iter().flat_map(|r| r.added.iter().map(|(n, v)| (n.as_str().as_bytes(), v.as_bytes())));
        received.chain(added).chain(map.into_iter().flatten())
    }

    /// Drops every field of `name`.
    pub(crate) fn remove(&mut self, name: &HeaderName) {
        match self {
            Fields::Map(m) => {
                m.remove(name);
            }
            Fields::Raw(r) => {
                let want = name.as_str().as_bytes();
                if r.seen & name_bit(want) != 0 {
                    let fields = &r.head;
                    for i in 0..fields.len() {
                        if fields.field(i).is_some_and(|(n, _)| name_is(n, want)) {
                            r.dropped |= 1u128 << i;
                        }
                    }
                }
                if !r.added.is_empty() {
                    r.added.retain(|(n, _)| n != name);
                }
            }
        }
    }

    /// Sets `name` to `value` alone (every other field of the name dropped).
    pub(crate) fn insert(&mut self, name: HeaderName, value: HeaderValue) {
        match self {
            Fields::Map(m) => {
                m.insert(name, value);
            }
            Fields::Raw(_) => {
                self.remove(&name);
                self.append(name, value);
            }
        }
    }

    /// Adds a field of `name`, after those there are.
    pub(crate) fn append(&mut self, name: HeaderName, value: HeaderValue) {
        match self {
            Fields::Map(m) => {
                m.append(name, value);
            }
            Fields::Raw(r) => {
                let added = r.added.get_mut();
                if added.capacity() == 0 {
                    added.reserve_exact(ADDED_ROOM);
                }
                added.push((name, value));
            }
        }
    }

    /// The fields as a map (a copy).
    pub(crate) fn to_map(&self) -> HeaderMap {
        match self {
            Fields::Map(m) => m.clone(),
            Fields::Raw(r) => {
                let fields = &r.head;
                let mut map = HeaderMap::with_capacity(fields.len() + r.added.len());
                for (i, (name, _)) in r.kept() {
                    let value = fields.value_bytes(i).map(HeaderValue::from_maybe_shared);
                    if let (Ok(name), Some(Ok(value))) = (HeaderName::from_bytes(name), value) {
                        map.append(name, value);
                    }
                }
                for (n, v) in r.added.iter() {
                    map.append(n.clone(), v.clone());
                }
                map
            }
        }
    }

    /// The first value of `name` as a header value (a slice of the head as received: no copy).
    pub(crate) fn value(&self, name: &HeaderName) -> Option<HeaderValue> {
        match self {
            Fields::Map(m) => m.get(name).cloned(),
            Fields::Raw(r) => {
                let fields = &r.head;
                let received = r.find(name.as_str().as_bytes()).and_then(|(i, _)| fields.value_bytes(i));
                match received {
                    Some(b) => HeaderValue::from_maybe_shared(b).ok(),
                    None => r.added.iter().find(|(n, _)| n == name).map(|(_, v)| v.clone()),
                }
            }
        }
    }

    /// Writes the fields as HTTP/1.1 field lines: those kept as received (runs of consecutive
    /// lines in one copy), then the added ones.
    pub(crate) fn write(&self, out: &mut Vec<u8>) {
        self.write_except(out, &|_| false);
    }

    /// [`Fields::write`], except the fields whose name (any case) `skip` picks.
    pub(crate) fn write_except(&self, out: &mut Vec<u8>, skip: &dyn Fn(&[u8]) -> bool) {
        let line = |out: &mut Vec<u8>, n: &[u8], v: &[u8]| {
            out.extend_from_slice(n);
            out.extend_from_slice(b": ");
            out.extend_from_slice(v);
            out.extend_from_slice(b"\r\n");
        };
        match self {
            Fields::Map(m) => {
                for (n, v) in m {
                    if !skip(n.as_str().as_bytes()) {
                        line(out, n.as_str().as_bytes(), v.as_bytes());
                    }
                }
            }
            Fields::Raw(r) => {
                let fields = &r.head;
                let bytes: &Bytes = fields.as_bytes();
                let mut run: Option<std::ops::Range<usize>> = None;
                for i in 0..fields.len() {
                    let Some(span) = fields.line_span(i) else { continue };
                    if r.dropped & (1u128 << i) != 0 || fields.field(i).is_some_and(|(n, _)| skip(n)) {
                        continue;
                    }
                    run = match run {
                        Some(open) if open.end == span.start => Some(open.start..span.end),
                        Some(open) => {
                            out.extend_from_slice(&bytes[open]);
                            Some(span)
                        }
                        None => Some(span),
                    };
                }
                if let Some(open) = run {
                    out.extend_from_slice(&bytes[open]);
                }
                for (n, v) in r.added.iter() {
                    if !skip(n.as_str().as_bytes()) {
                        line(out, n.as_str().as_bytes(), v.as_bytes());
                    }
                }
            }
        }
    }
}

/// A response's head on its way back to the client: its status, its fields (a worker's as it
/// sent them, with the request path's edits; or a map: the gateway's own answers, the cache's)
/// and its extensions (what the access log and a tunnel carry to the connection).
#[derive(Debug)]
pub(crate) struct RespHead {
    /// The status.
    pub(crate) status: StatusCode,
    /// The fields.
    pub(crate) fields: Fields,
    /// What travels with the response inside the gateway.
    pub(crate) extensions: http::Extensions,
}

/// A response: its head ([`RespHead`]) and its body.
#[derive(Debug)]
pub(crate) struct Answer<B = ProxyBody> {
    /// The head.
    pub(crate) head: RespHead,
    /// The body.
    pub(crate) body: B,
}

impl<B> Answer<B> {
    /// A worker's response, its fields kept as it sent them (a map when it has more than the edit
    /// set can mark, or a line that ended in a bare LF, which is read but not passed on as it
    /// came). A repeated `Content-Length` goes on once, the first: two are a smuggling pair to
    /// the next reader. (The engine checked the values agree when the length frames the body; a
    /// response that has none, to HEAD or a 1xx, 204 or 304, is framed empty whatever it says.)
    pub(crate) fn from_worker(head: ResponseHead, body: B) -> Answer<B> {
        let status = StatusCode::from_u16(head.status()).unwrap_or(StatusCode::BAD_GATEWAY);
        let f = head.fields();
        let crlf = (0..f.len()).all(|i| f.line_span(i).is_some_and(|l| f.as_bytes()[l].ends_with(b"\r\n")));
        let fields = if f.len() <= MAX_RAW_FIELDS && crlf {
            let mut raw = Raw::new(head.into_fields());
            let length = http::header::CONTENT_LENGTH.as_str().as_bytes();
            if raw.seen & name_bit(length) != 0 {
                let head = &raw.head;
                let lengths = (0..head.len()).filter(|&i| head.field(i).is_some_and(|(n, _)| name_is(n, length)));
                for i in lengths.skip(1) {
                    raw.dropped |= 1u128 << i;
                }
            }
            Fields::Raw(raw)
        } else {
            Fields::Map(map_of(f, true).unwrap_or_default())
        };
        Answer { head: RespHead { status, fields, extensions: http::Extensions::new() }, body }
    }

    /// The same head with another body.
    pub(crate) fn map<C>(self, f: impl FnOnce(B) -> C) -> Answer<C> {
        Answer { head: self.head, body: f(self.body) }
    }

    /// As an `http` response (its fields in a map: for HTTP/2 clients, the cache and callers of
    /// [`crate::ProxyService::call`]).
    pub(crate) fn into_response(self) -> Response<B> {
        let mut resp = Response::new(self.body);
        *resp.status_mut() = self.head.status;
        *resp.headers_mut() = match self.head.fields {
            Fields::Map(m) => m,
            raw => raw.to_map(),
        };
        *resp.extensions_mut() = self.head.extensions;
        resp
    }
}

impl<B> From<Response<B>> for Answer<B> {
    fn from(resp: Response<B>) -> Answer<B> {
        let (parts, body) = resp.into_parts();
        Answer {
            head: RespHead { status: parts.status, fields: Fields::Map(parts.headers), extensions: parts.extensions },
            body,
        }
    }
}

impl keyroute_http1::OutgoingHead for RespHead {
    fn status(&self) -> StatusCode {
        self.status
    }

    fn field(&self, name: &HeaderName) -> Option<&[u8]> {
        self.fields.get(name)
    }

    fn says_close(&self) -> bool {
        let mut values = self.fields.get_all(&http::header::CONNECTION);
        values.any(|v| keyroute_http1::head::list(v).any(|o| o.eq_ignore_ascii_case(b"close")))
    }

    fn write_fields(&self, out: &mut Vec<u8>, skip: &dyn Fn(&[u8]) -> bool) {
        self.fields.write_except(out, skip);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value is text as `HeaderValue::to_str` reads it, so that no stage reads more of a head
    /// as received than it read of a map.
    #[test]
    fn text_is_what_header_values_call_text() {
        for v in [&b"a b\tc"[..], b"", b"~!", b"caf\xc3\xa9", b"\x7f", b"a\x01", b"\xff"] {
            let map = HeaderValue::from_bytes(v).ok().and_then(|h| h.to_str().ok().map(str::to_owned));
            assert_eq!(text(v).map(str::to_owned), map, "{v:?}");
        }
    }
}
