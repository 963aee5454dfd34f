//! Request and response heads, parsed in place (RFC 9112 sections 2 to 6).
//!
//! A head is parsed by `httparse` straight from the bytes as they were read, and kept as those
//! bytes ([`Bytes`], a slice of the buffer they were read into: nothing is copied) plus an index
//! of spans: the request line's parts and each field's name and value. A proxy reads the head
//! through the index and writes it on as slices of the original with its own lines added.
//!
//! ## What is refused, and why
//!
//! The rules are those of RFC 9112 read strictly, so that no two parsers on a request's path can
//! disagree on where a message ends (request smuggling):
//!
//! | input | answer | why |
//! |---|---|---|
//! | a line folded onto the previous one (obs-fold) | 400 | RFC 9112 section 5.2: a server must reject it or replace it |
//! | whitespace between a field name and its colon | 400 | section 5.1: must be rejected |
//! | a bare CR, or a CTL other than HTAB, in a field value | 400 | section 2.2; httparse refuses them |
//! | a request line or field line ended by a bare LF | 400 | section 2.2 allows a recipient to accept it; a proxy that forwards the original bytes must not |
//! | `Content-Length` that is not 1 to 19 digits, or given twice | 400 | section 6.3: an invalid length is unrecoverable; a list or a repeat is refused rather than folded |
//! | `Content-Length` and `Transfer-Encoding` together | 400 | section 6.1 allows rejecting them: the classic smuggling pair |
//! | `Transfer-Encoding` on HTTP/1.0 | 400 | section 6.1: the framing is faulty |
//! | a coding other than `chunked` | 501 | section 6.1: a server that does not understand a coding answers 501 |
//! | `chunked` not last, or twice | 400 | section 6.3 |
//! | a target with a byte outside visible ASCII, or `#` | 400 | RFC 9110 section 4.1 and RFC 3986: a fragment is never sent |
//! | a target that is neither origin (`/...`), absolute (`http://...`), `*` (OPTIONS) nor an authority (CONNECT) | 400 | section 3.2 |
//! | more fields than the limit, or a head longer than the limit | 431 | RFC 6585 |
//! | a version other than HTTP/1.0 or HTTP/1.1 | 505 | |
//! | a request line of other than three parts (a space inside the target) | 400 | section 3: method SP target SP version; the version is then unknown, not unsupported |
//! | `Expect: 100-continue` on HTTP/1.0 | ignored | RFC 9110 section 10.1.1: an HTTP/1.0 client cannot read a `100` |
//!
//! Responses (from workers) are read as strictly, except that a bare LF ends a line, a repeated
//! `Content-Length` with one value is that value, and `Transfer-Encoding` without `chunked` last
//! means the body runs to the connection's close (section 6.3, rule 4). An HTTP/1.0 response
//! with `Transfer-Encoding` is refused (section 6.1: its framing is faulty, whatever it says).
//! After a `101` the connection speaks another protocol: it never carries another exchange.

use bytes::Bytes;

use crate::buf::{Pool, Spare};

/// How far a head may grow.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Limits {
    /// The longest head, in bytes (its request or status line, its fields and the empty line).
    pub max_head_bytes: usize,
    /// The most fields.
    pub max_headers: usize,
}

impl Default for Limits {
    /// 64 KiB and 100 fields (hyper's and NGINX's field counts are of this order; a head past
    /// 64 KiB is an attack or a bug).
    fn default() -> Self {
        Limits { max_head_bytes: 64 * 1024, max_headers: 100 }
    }
}

/// The protocol version of a head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum Version {
    /// HTTP/1.0: one request per connection unless `Connection: keep-alive`.
    Http10,
    /// HTTP/1.1: persistent unless `Connection: close`.
    Http11,
}

impl Version {
    /// `HTTP/1.0` or `HTTP/1.1`.
    pub fn as_str(self) -> &'static str {
        match self {
            Version::Http10 => "HTTP/1.0",
            Version::Http11 => "HTTP/1.1",
        }
    }
}

/// Where a message's body ends (RFC 9112 section 6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
    /// No body.
    Empty,
    /// Exactly this many bytes.
    Length(u64),
    /// Chunked transfer coding.
    Chunked,
    /// Until the connection closes (responses only).
    UntilClose,
}

/// Why a head was refused. [`HeadError::status`] is the answer a server gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum HeadError {
    /// The head is longer than [`Limits::max_head_bytes`].
    TooLarge,
    /// More fields than [`Limits::max_headers`].
    TooManyHeaders,
    /// The request or status line, or a field line, is malformed (obs-fold, whitespace before a
    /// colon, a bare CR or LF, a CTL, an invalid token or target).
    Syntax,
    /// An invalid, repeated or conflicting `Content-Length`.
    ContentLength,
    /// `Transfer-Encoding` that cannot frame the message: `chunked` not last or twice, on
    /// HTTP/1.0, or beside `Content-Length`.
    TransferEncoding,
    /// A transfer coding other than `chunked`.
    UnknownCoding,
    /// A version other than HTTP/1.0 and HTTP/1.1.
    Version,
}

impl HeadError {
    /// The status a server answers with.
    pub fn status(self) -> u16 {
        match self {
            HeadError::TooLarge | HeadError::TooManyHeaders => 431,
            HeadError::UnknownCoding => 501,
            HeadError::Version => 505,
            _ => 400,
        }
    }

    /// A short public reason class (`snake_case`).
    pub fn reason(self) -> &'static str {
        match self {
            HeadError::TooLarge => "head_too_large",
            HeadError::TooManyHeaders => "too_many_headers",
            HeadError::Syntax => "bad_request_head",
            HeadError::ContentLength => "invalid_content_length",
            HeadError::TransferEncoding => "invalid_transfer_encoding",
            HeadError::UnknownCoding => "unsupported_transfer_coding",
            HeadError::Version => "unsupported_version",
        }
    }
}

impl std::fmt::Display for HeadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            HeadError::TooLarge => "the head is larger than the limit",
            HeadError::TooManyHeaders => "the head has more fields than the limit",
            HeadError::Syntax => "the head is malformed",
            HeadError::ContentLength => "the Content-Length is invalid",
            HeadError::TransferEncoding => "the Transfer-Encoding cannot frame the message",
            HeadError::UnknownCoding => "a transfer coding other than chunked",
            HeadError::Version => "the version is not HTTP/1.0 or HTTP/1.1",
        })
    }
}

impl std::error::Error for HeadError {}

/// A byte range of a head.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Span {
    start: u32,
    end: u32,
}

impl Span {
    fn of(base: &[u8], part: &[u8]) -> Span {
        // Both come from the same buffer (httparse returns sub-slices of its input).
        let start = (part.as_ptr() as usize).saturating_sub(base.as_ptr() as usize) as u32;
        Span { start, end: start + part.len() as u32 }
    }

    fn range(self) -> std::ops::Range<usize> {
        self.start as usize..self.end as usize
    }
}

/// One field line's name and value, as spans of the head.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Field {
    /// The whole line, from the name to its CRLF included.
    line: Span,
    name: Span,
    value: Span,
}

/// What `Connection` says (RFC 9110 section 7.6.1; its other options name hop-by-hop fields).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ConnectionOptions {
    /// `close`.
    pub close: bool,
    /// `keep-alive` (HTTP/1.0's opt-in).
    pub keep_alive: bool,
    /// `upgrade`.
    pub upgrade: bool,
}

/// A head's bytes and its field lines: what requests and responses share.
#[derive(Clone, Debug)]
pub struct Fields {
    bytes: Bytes,
    version: Version,
    fields: Spare<Vec<Field>>,
    connection: ConnectionOptions,
    /// The first line, CRLF included.
    first: Span,
}

impl Fields {
    /// The fields, in order: name as sent, value without its surrounding whitespace.
    pub fn iter(&self) -> impl Iterator<Item = (&str, &[u8])> + '_ {
        self.fields.iter().map(|f| (name_str(&self.bytes[f.name.range()]), &self.bytes[f.value.range()]))
    }

    /// Field `i`: its name as sent (a token: ASCII), its value without surrounding whitespace.
    pub fn field(&self, i: usize) -> Option<(&[u8], &[u8])> {
        self.fields.get(i).map(|f| (&self.bytes[f.name.range()], &self.bytes[f.value.range()]))
    }

    /// The first field of that name (ASCII case-insensitive).
    pub fn get(&self, name: &str) -> Option<&[u8]> {
        self.fields
            .iter()
            .find(|f| self.bytes[f.name.range()].eq_ignore_ascii_case(name.as_bytes()))
            .map(|f| &self.bytes[f.value.range()])
    }

    /// The number of fields.
    pub fn len(&self) -> usize {
        self.fields.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    /// The value of field `i` as a slice of the head's buffer (no copy).
    pub fn value_bytes(&self, i: usize) -> Option<Bytes> {
        self.fields.get(i).map(|f| self.bytes.slice(f.value.range()))
    }

    /// The whole line of field `i`, name to line end, as received (to write it on unchanged).
    pub fn line_bytes(&self, i: usize) -> Option<Bytes> {
        self.fields.get(i).map(|f| self.bytes.slice(f.line.range()))
    }

    /// Where the whole line of field `i` is in [`Fields::as_bytes`] (name to line end, as
    /// received): consecutive lines are adjacent ranges.
    pub fn line_span(&self, i: usize) -> Option<std::ops::Range<usize>> {
        self.fields.get(i).map(|f| f.line.range())
    }

    /// The first line (request or status line), its line end included.
    pub fn first_line(&self) -> Bytes {
        self.bytes.slice(self.first.range())
    }

    /// The head's bytes, as received.
    pub fn as_bytes(&self) -> &Bytes {
        &self.bytes
    }

    /// Whether the version and `Connection` let the connection carry another message (RFC 9112
    /// section 9.3: HTTP/1.1 unless `close`, HTTP/1.0 only with `keep-alive`).
    fn persistent(&self) -> bool {
        let c = self.connection;
        match self.version {
            Version::Http11 => !c.close,
            Version::Http10 => c.keep_alive && !c.close,
        }
    }
}

/// httparse checked that names are tokens (ASCII): never the empty default.
fn name_str(b: &[u8]) -> &str {
    std::str::from_utf8(b).unwrap_or_default()
}

/// A parsed request head. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct RequestHead {
    head: Fields,
    method: Span,
    target: Span,
    /// The target as `http` reads it (parsed once, here: a target it refuses is refused).
    uri: http::Uri,
    framing: Framing,
    expect_continue: bool,
}

/// A parsed response head. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct ResponseHead {
    head: Fields,
    status: u16,
    reason: Span,
    framing: Framing,
}

/// What parsing found so far.
#[derive(Debug)]
pub enum Parsed<T> {
    /// A whole head, and its length in bytes (what follows is its body, or the next message).
    Complete(T, usize),
    /// Not a whole head yet: read more and parse again from the start.
    Partial,
}

/// The most fields parsed on the stack; a larger limit uses the heap.
const STACK_HEADERS: usize = 128;

/// Parses a request head from the start of `buf` (leading empty lines are skipped, RFC 9112
/// section 2.2). The head is `buf.slice(..len)`: nothing is copied.
///
/// # Errors
///
/// The head breaks a rule of the [module documentation](self), or a limit.
pub fn parse_request(buf: &Bytes, limits: &Limits) -> Result<Parsed<RequestHead>, HeadError> {
    with_headers(limits, |headers| {
        let mut req = httparse::Request::new(&mut []);
        let status = httparse::ParserConfig::default().parse_request_with_uninit_headers(&mut req, buf, headers);
        let len = match status {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return if buf.len() >= limits.max_head_bytes { Err(HeadError::TooLarge) } else { Ok(Parsed::Partial) };
            }
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
            Err(httparse::Error::Version) => return Err(version_error(buf)),
            Err(_) => return Err(HeadError::Syntax),
        };
        if len > limits.max_head_bytes {
            return Err(HeadError::TooLarge);
        }
        let base = &buf[..];
        let (Some(method), Some(path), Some(version)) = (req.method, req.path, req.version) else {
            return Err(HeadError::Syntax);
        };
        let version = if version == 0 { Version::Http10 } else { Version::Http11 };
        let method_span = Span::of(base, method.as_bytes());
        let target = Span::of(base, path.as_bytes());
        check_line_endings(&base[..len])?;
        check_target(method.as_bytes(), path.as_bytes())?;
        let uri = http::Uri::from_maybe_shared(buf.slice(target.range())).map_err(|_| HeadError::Syntax)?;
        let (fields, first) = index(base, method_span.start, req.headers, len)?;
        let head = Fields { bytes: buf.slice(..len), version, fields, connection: ConnectionOptions::default(), first };
        let mut head =
            RequestHead { head, method: method_span, target, uri, framing: Framing::Empty, expect_continue: false };
        head.read_fields()?;
        Ok(Parsed::Complete(head, len))
    })
}

/// Parses a response head to a request (`head_request`: the request was HEAD, so the response
/// has no body whatever its fields say).
///
/// # Errors
///
/// The head is malformed, or breaks a limit, or its `Content-Length` is invalid.
pub fn parse_response(buf: &Bytes, limits: &Limits, head_request: bool) -> Result<Parsed<ResponseHead>, HeadError> {
    with_headers(limits, |headers| {
        let mut resp = httparse::Response::new(&mut []);
        let status = httparse::ParserConfig::default().parse_response_with_uninit_headers(&mut resp, buf, headers);
        let len = match status {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => {
                return if buf.len() >= limits.max_head_bytes { Err(HeadError::TooLarge) } else { Ok(Parsed::Partial) };
            }
            Err(httparse::Error::TooManyHeaders) => return Err(HeadError::TooManyHeaders),
            Err(httparse::Error::Version) => return Err(HeadError::Version),
            Err(_) => return Err(HeadError::Syntax),
        };
        if len > limits.max_head_bytes {
            return Err(HeadError::TooLarge);
        }
        let base = &buf[..];
        let (Some(code), Some(version)) = (resp.code, resp.version) else { return Err(HeadError::Syntax) };
        let version = if version == 0 { Version::Http10 } else { Version::Http11 };
        let reason = resp.reason.filter(|r| !r.is_empty()).map(|r| Span::of(base, r.as_bytes())).unwrap_or_default();
        // The status line starts where the (skipped) empty lines end.
        let start = base.iter().position(|&b| b != b'\r' && b != b'\n').unwrap_or(0) as u32;
        let (fields, first) = index(base, start, resp.headers, len)?;
        let head = Fields { bytes: buf.slice(..len), version, fields, connection: ConnectionOptions::default(), first };
        let mut head = ResponseHead { head, status: code, reason, framing: Framing::Empty };
        head.read_fields(head_request)?;
        Ok(Parsed::Complete(head, len))
    })
}

/// Runs `f` with room for `limits.max_headers` fields: on the stack up to [`STACK_HEADERS`].
fn with_headers<'b, T>(
    limits: &Limits,
    f: impl FnOnce(&mut [std::mem::MaybeUninit<httparse::Header<'b>>]) -> Result<T, HeadError>,
) -> Result<T, HeadError> {
    let n = limits.max_headers.max(1);
    if n <= STACK_HEADERS {
        let mut headers = [const { std::mem::MaybeUninit::<httparse::Header<'b>>::uninit() }; STACK_HEADERS];
        f(&mut headers[..n])
    } else {
        let mut headers = Vec::with_capacity(n);
        headers.resize_with(n, std::mem::MaybeUninit::uninit);
        f(&mut headers)
    }
}

/// httparse refuses versions it does not know; `HTTP/2.0` and the like are 505, anything that
/// does not look like a version at all is 400.
/// What httparse's version error was: a well-formed request line (three parts, the leading
/// empty lines skipped) whose version is another `HTTP/x.y` is an unsupported version (505);
/// anything else, a space inside the target among them, is a malformed line (400).
fn version_error(buf: &[u8]) -> HeadError {
    let line = buf
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l))
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (Some(_), Some(_), Some(last), None) = (parts.next(), parts.next(), parts.next(), parts.next()) else {
        return HeadError::Syntax;
    };
    let looks = last.len() == 8 && last.starts_with(b"HTTP/") && last[5].is_ascii_digit() && last[7].is_ascii_digit();
    if looks && last[6] == b'.' { HeadError::Version } else { HeadError::Syntax }
}

/// Every LF of a request head is preceded by CR (httparse accepts a bare LF).
fn check_line_endings(head: &[u8]) -> Result<(), HeadError> {
    let mut prev = 0u8;
    for &b in head {
        if b == b'\n' && prev != b'\r' {
            return Err(HeadError::Syntax);
        }
        prev = b;
    }
    Ok(())
}

/// The request target's form and bytes (see the [module documentation](self)).
fn check_target(method: &[u8], target: &[u8]) -> Result<(), HeadError> {
    if target.is_empty() || !target.iter().all(|&b| (0x21..=0x7e).contains(&b) && b != b'#') {
        return Err(HeadError::Syntax);
    }
    if target[0] == b'/' {
        return Ok(());
    }
    if target == b"*" {
        return if method == b"OPTIONS" { Ok(()) } else { Err(HeadError::Syntax) };
    }
    if method == b"CONNECT" {
        // Authority form: host:port, nothing else.
        return if target.contains(&b':') && !target.contains(&b'/') && !target.contains(&b'@') {
            Ok(())
        } else {
            Err(HeadError::Syntax)
        };
    }
    // Absolute form: scheme "://" ...
    let Some(colon) = target.iter().position(|&b| b == b':') else { return Err(HeadError::Syntax) };
    let scheme = &target[..colon];
    let scheme_ok = scheme.first().is_some_and(u8::is_ascii_alphabetic)
        && scheme.iter().all(|&b| b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.'));
    if scheme_ok && target[colon..].starts_with(b"://") { Ok(()) } else { Err(HeadError::Syntax) }
}

/// The largest field index a thread keeps for the next heads.
const SPARE_FIELDS: usize = 128;

thread_local! {
    /// Field indexes of heads that were dropped on this thread, for the next heads parsed here:
    /// a proxy parses a request and a response head a request, and each would allocate one.
    static INDEX_SPARES: std::cell::RefCell<Vec<Vec<Field>>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Heads' field indexes (64 kept per thread, none over [`SPARE_FIELDS`] fields).
static INDEXES: Pool<Vec<Field>> = Pool::new(&INDEX_SPARES, 64, SPARE_FIELDS);

/// An empty index with room for `n` fields: a spare one of this thread's if it has one (it goes
/// back when its head is dropped).
fn spare_index(n: usize) -> Spare<Vec<Field>> {
    let mut index = Spare::take(&INDEXES, || Vec::with_capacity(n.max(16)));
    index.reserve(n);
    index
}

/// The spans of every field (name, value, whole line) and of the first line.
fn index(
    base: &[u8],
    first_start: u32,
    headers: &[httparse::Header<'_>],
    len: usize,
) -> Result<(Spare<Vec<Field>>, Span), HeadError> {
    let mut fields = spare_index(headers.len());
    for h in headers {
        let name = Span::of(base, h.name.as_bytes());
        // The line runs from the name to its LF (OWS after the value and the CR included); a
        // value holds no LF. An empty value's slice may point anywhere: it is placed at the end.
        let lf = name.end as usize
            + base[name.end as usize..len].iter().position(|&b| b == b'\n').ok_or(HeadError::Syntax)?;
        let value =
            if h.value.is_empty() { Span { start: lf as u32, end: lf as u32 } } else { Span::of(base, h.value) };
        if value.start < name.end || value.end as usize > lf {
            return Err(HeadError::Syntax);
        }
        fields.push(Field { line: Span { start: name.start, end: lf as u32 + 1 }, name, value });
    }
    let first_end = match fields.first() {
        Some(f) => f.line.start,
        None => {
            // No fields: the first line ends at the LF before the final empty line.
            let lf = base[first_start as usize..len].iter().position(|&b| b == b'\n').ok_or(HeadError::Syntax)?;
            first_start + lf as u32 + 1
        }
    };
    Ok((fields, Span { start: first_start, end: first_end }))
}

/// The comma-separated elements of a field value, trimmed, empty ones skipped (RFC 9110
/// section 5.6.1).
pub fn list(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value.split(|&b| b == b',').map(<[u8]>::trim_ascii).filter(|e| !e.is_empty())
}

/// A `Content-Length` value: 1 to 19 digits (so that it fits a `u64`).
fn content_length(value: &[u8]) -> Option<u64> {
    if value.is_empty() || value.len() > 19 || !value.iter().all(u8::is_ascii_digit) {
        return None;
    }
    value.iter().try_fold(0u64, |n, &d| n.checked_mul(10)?.checked_add(u64::from(d - b'0')))
}

/// What the framing fields of a head say.
#[derive(Default)]
struct FramingFields {
    lengths: u32,
    length: Option<u64>,
    length_conflict: bool,
    invalid_length: bool,
    codings: u32,
    /// `chunked` is the last coding, and appears once.
    chunked_last: bool,
    chunked_twice: bool,
    other_coding: bool,
}

fn read_framing_fields(head: &mut Fields) -> (FramingFields, Option<Span>) {
    let mut ff = FramingFields::default();
    let mut expect = None;
    let mut connection = ConnectionOptions::default();
    for f in head.fields.iter() {
        let name = &head.bytes[f.name.range()];
        let value = &head.bytes[f.value.range()];
        if name.eq_ignore_ascii_case(b"content-length") {
            ff.lengths += 1;
            match content_length(value) {
                Some(n) if ff.length.is_some_and(|l| l != n) => ff.length_conflict = true,
                Some(n) => ff.length = Some(n),
                None => ff.invalid_length = true,
            }
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let mut any = false;
            for coding in list(value) {
                any = true;
                ff.codings += 1;
                ff.chunked_twice |= ff.chunked_last;
                ff.chunked_last = coding.eq_ignore_ascii_case(b"chunked");
                ff.other_coding |= !ff.chunked_last;
            }
            if !any {
                // An empty Transfer-Encoding frames nothing.
                ff.codings += 1;
                ff.other_coding = true;
            }
            // An empty element (`chunked,`) is refused, not skipped: hyper refuses it too, and
            // two readings of one list are what smuggling is made of.
            if value.split(|&b| b == b',').any(|e| e.trim_ascii().is_empty()) {
                ff.other_coding = true;
                ff.chunked_last = false;
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in list(value) {
                connection.close |= option.eq_ignore_ascii_case(b"close");
                connection.keep_alive |= option.eq_ignore_ascii_case(b"keep-alive");
                connection.upgrade |= option.eq_ignore_ascii_case(b"upgrade");
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            expect = Some(f.value);
        }
    }
    head.connection = connection;
    (ff, expect)
}

impl RequestHead {
    fn read_fields(&mut self) -> Result<(), HeadError> {
        let (ff, expect) = read_framing_fields(&mut self.head);
        // An HTTP/1.0 client's expectation is ignored (RFC 9110 section 10.1.1).
        self.expect_continue = self.head.version == Version::Http11
            && expect.is_some_and(|v| self.head.bytes[v.range()].trim_ascii().eq_ignore_ascii_case(b"100-continue"));
        self.framing = if ff.codings > 0 {
            if self.head.version == Version::Http10 || ff.lengths > 0 || ff.chunked_twice {
                return Err(HeadError::TransferEncoding);
            }
            if ff.other_coding {
                return Err(if ff.chunked_last { HeadError::UnknownCoding } else { HeadError::TransferEncoding });
            }
            Framing::Chunked
        } else if ff.lengths > 0 {
            if ff.lengths > 1 || ff.invalid_length || ff.length_conflict {
                return Err(HeadError::ContentLength);
            }
            match ff.length {
                Some(0) | None => Framing::Empty,
                Some(n) => Framing::Length(n),
            }
        } else {
            Framing::Empty
        };
        Ok(())
    }

    /// The method, as sent (a token: case matters).
    pub fn method(&self) -> &str {
        name_str(&self.head.bytes[self.method.range()])
    }

    /// The request target, as sent (visible ASCII).
    pub fn target(&self) -> &str {
        name_str(&self.head.bytes[self.target.range()])
    }

    /// The request target as a slice of the head's buffer (no copy).
    pub fn target_bytes(&self) -> Bytes {
        self.head.bytes.slice(self.target.range())
    }

    /// The request target as `http` reads it.
    pub fn uri(&self) -> &http::Uri {
        &self.uri
    }

    /// Takes the target out of the head (which keeps `/`), for a caller that owns the head and
    /// keeps the target on its own.
    pub fn take_uri(&mut self) -> http::Uri {
        std::mem::take(&mut self.uri)
    }

    /// The head's bytes and field index, for a caller that has read the rest.
    pub fn into_fields(self) -> Fields {
        self.head
    }

    /// HTTP/1.0 or HTTP/1.1.
    pub fn version(&self) -> Version {
        self.head.version
    }

    /// Where the body ends.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// What `Connection` says.
    pub fn connection(&self) -> ConnectionOptions {
        self.head.connection
    }

    /// Whether the client waits for `100 Continue` before it sends its body.
    pub fn expects_continue(&self) -> bool {
        self.expect_continue
    }

    /// Whether the connection stays open after this request's response (RFC 9112 section 9.3).
    pub fn keep_alive(&self) -> bool {
        self.head.persistent()
    }

    /// The head's bytes and fields.
    pub fn fields(&self) -> &Fields {
        &self.head
    }

    /// The first field of that name (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.head.get(name)
    }
}

impl ResponseHead {
    fn read_fields(&mut self, head_request: bool) -> Result<(), HeadError> {
        let (ff, _) = read_framing_fields(&mut self.head);
        let bodiless = head_request || (100..200).contains(&self.status) || self.status == 204 || self.status == 304;
        self.framing = if bodiless {
            Framing::Empty
        } else if ff.codings > 0 {
            // RFC 9112 section 6.1: an HTTP/1.0 message with Transfer-Encoding has faulty framing
            // (chunk framing passed on as the body, or a body cut at the wrong place): refused.
            if self.head.version == Version::Http10 {
                return Err(HeadError::TransferEncoding);
            }
            // RFC 9112 section 6.3, rules 3 and 4: chunked last frames the body (whatever a
            // Content-Length says); anything else runs to the close.
            if ff.chunked_last && !ff.chunked_twice { Framing::Chunked } else { Framing::UntilClose }
        } else if ff.lengths > 0 {
            if ff.invalid_length || ff.length_conflict {
                return Err(HeadError::ContentLength);
            }
            match ff.length {
                Some(0) | None => Framing::Empty,
                Some(n) => Framing::Length(n),
            }
        } else {
            Framing::UntilClose
        };
        Ok(())
    }

    /// The status code (100 to 999).
    pub fn status(&self) -> u16 {
        self.status
    }

    /// The reason phrase, as sent.
    pub fn reason(&self) -> &[u8] {
        &self.head.bytes[self.reason.range()]
    }

    /// HTTP/1.0 or HTTP/1.1.
    pub fn version(&self) -> Version {
        self.head.version
    }

    /// Where the body ends.
    pub fn framing(&self) -> Framing {
        self.framing
    }

    /// What `Connection` says.
    pub fn connection(&self) -> ConnectionOptions {
        self.head.connection
    }

    /// Whether the connection may carry another request after this response's body: both sides
    /// persistent, a body with an end, and not a `101` (after which the connection speaks another
    /// protocol, asked for or not).
    pub fn keep_alive(&self) -> bool {
        self.head.persistent() && self.framing != Framing::UntilClose && self.status != 101
    }

    /// The head's bytes and fields.
    pub fn fields(&self) -> &Fields {
        &self.head
    }

    /// The head's bytes and field index, for a caller that has read the rest.
    pub fn into_fields(self) -> Fields {
        self.head
    }

    /// The first field of that name (ASCII case-insensitive).
    pub fn header(&self, name: &str) -> Option<&[u8]> {
        self.head.get(name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn req(text: &str) -> Result<RequestHead, HeadError> {
        match parse_request(&Bytes::copy_from_slice(text.as_bytes()), &Limits::default())? {
            Parsed::Complete(h, n) => {
                assert!(n <= text.len());
                Ok(h)
            }
            Parsed::Partial => panic!("partial: {text:?}"),
        }
    }

    fn resp(text: &str, head: bool) -> Result<ResponseHead, HeadError> {
        match parse_response(&Bytes::copy_from_slice(text.as_bytes()), &Limits::default(), head)? {
            Parsed::Complete(h, _) => Ok(h),
            Parsed::Partial => panic!("partial: {text:?}"),
        }
    }

    #[test]
    fn a_dropped_heads_index_serves_the_next_head() {
        let first = req("GET / HTTP/1.1\r\nHost: a\r\nX: 1\r\n\r\n").expect("parsed");
        let at = first.fields().fields.as_ptr();
        drop(first);
        let next = req("GET /b HTTP/1.1\r\nHost: b\r\n\r\n").expect("parsed");
        assert_eq!(next.fields().fields.as_ptr(), at, "the index was reused, not allocated again");
        assert_eq!(next.fields().iter().collect::<Vec<_>>(), vec![("Host", &b"b"[..])], "and holds only its own");
        drop(next);
        // An index larger than a thread keeps is freed.
        let many: String = (0..SPARE_FIELDS + 1).map(|i| format!("X-{i}: v\r\n")).collect();
        let limits = Limits { max_headers: SPARE_FIELDS + 10, ..Limits::default() };
        let text = format!("GET / HTTP/1.1\r\nHost: a\r\n{many}\r\n");
        let spares = INDEX_SPARES.with(|s| s.borrow().len());
        match parse_request(&Bytes::from(text), &limits) {
            Ok(Parsed::Complete(h, _)) => drop(h),
            other => panic!("{other:?}"),
        }
        assert!(INDEX_SPARES.with(|s| s.borrow().len()) < spares, "took a spare and kept none back");
    }

    #[test]
    fn a_plain_request_is_indexed_in_place() {
        let h = req("GET /a?b=c HTTP/1.1\r\nHost: x\r\nX-A:  1 \r\n\r\n").expect("valid");
        assert_eq!((h.method(), h.target(), h.version()), ("GET", "/a?b=c", Version::Http11));
        assert_eq!(h.header("host"), Some(&b"x"[..]));
        assert_eq!(h.header("X-a"), Some(&b"1"[..]));
        assert_eq!(&h.fields().line_bytes(1).expect("line")[..], b"X-A:  1 \r\n");
        assert_eq!(&h.fields().first_line()[..], b"GET /a?b=c HTTP/1.1\r\n");
        assert_eq!(h.framing(), Framing::Empty);
        assert!(h.keep_alive());
    }

    #[test]
    fn partial_heads_ask_for_more_until_the_limit() {
        let limits = Limits { max_head_bytes: 64, max_headers: 4 };
        let b = Bytes::from_static(b"GET / HTTP/1.1\r\nHost: x\r\n");
        assert!(matches!(parse_request(&b, &limits), Ok(Parsed::Partial)));
        let long = Bytes::from(format!("GET /{} HTTP/1.1\r\n", "a".repeat(80)));
        assert_eq!(parse_request(&long, &limits).err(), Some(HeadError::TooLarge));
        let many = Bytes::from_static(b"GET / HTTP/1.1\r\na: 1\r\nb: 1\r\nc: 1\r\nd: 1\r\ne: 1\r\n\r\n");
        assert_eq!(parse_request(&many, &limits).err(), Some(HeadError::TooManyHeaders));
    }

    #[test]
    fn rfc_9112_corner_cases_of_requests() {
        use HeadError::*;
        let cases: &[(&str, Result<Framing, HeadError>)] = &[
            // obs-fold
            ("GET / HTTP/1.1\r\nHost: x\r\nX: a\r\n b\r\n\r\n", Err(Syntax)),
            // whitespace before the colon
            ("GET / HTTP/1.1\r\nHost : x\r\n\r\n", Err(Syntax)),
            // bare LF, bare CR
            ("GET / HTTP/1.1\nHost: x\n\n", Err(Syntax)),
            ("GET / HTTP/1.1\r\nHost: x\r\nX: a\rb\r\n\r\n", Err(Syntax)),
            // Content-Length: signed, listed, repeated, huge, empty
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: +5\r\n\r\n", Err(ContentLength)),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5, 5\r\n\r\n", Err(ContentLength)),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n", Err(ContentLength)),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999999999999\r\n\r\n", Err(ContentLength)),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length:\r\n\r\n", Err(ContentLength)),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\n", Ok(Framing::Length(5))),
            ("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n", Ok(Framing::Empty)),
            // Transfer-Encoding lists
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n", Ok(Framing::Chunked)),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: CHUNKED \r\n\r\n", Ok(Framing::Chunked)),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", Err(UnknownCoding)),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", Err(TransferEncoding)),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked, chunked\r\n\r\n", Err(TransferEncoding)),
            (
                "POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(TransferEncoding),
            ),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: \r\n\r\n", Err(TransferEncoding)),
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: xchunked\r\n\r\n", Err(TransferEncoding)),
            // Found by the differential test: an empty element after chunked.
            ("POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked,\r\n\r\n", Err(TransferEncoding)),
            // Found by the differential test: targets http's URI parser refuses.
            ("GET /` HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("GET http://a.e<xample/x HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            // Both framings; TE on HTTP/1.0
            (
                "POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n",
                Err(TransferEncoding),
            ),
            ("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n", Err(TransferEncoding)),
            // Targets
            ("GET http://a.example/x HTTP/1.1\r\nHost: a.example\r\n\r\n", Ok(Framing::Empty)),
            ("OPTIONS * HTTP/1.1\r\nHost: x\r\n\r\n", Ok(Framing::Empty)),
            ("GET * HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("GET a.example HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("GET /a#frag HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("CONNECT a.example:443 HTTP/1.1\r\nHost: a.example:443\r\n\r\n", Ok(Framing::Empty)),
            // Versions
            ("GET / HTTP/2.0\r\nHost: x\r\n\r\n", Err(Version)),
            ("GET / HTTP/1.2\r\nHost: x\r\n\r\n", Err(Version)),
            ("GET / FOO\r\nHost: x\r\n\r\n", Err(Syntax)),
            // A space inside the target: the line has four parts, and is malformed (issue 31).
            ("GET /a b HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("GET /a  HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("\r\nGET /a b HTTP/1.1\r\nHost: x\r\n\r\n", Err(Syntax)),
            ("\r\nGET / HTTP/3.0\r\nHost: x\r\n\r\n", Err(Version)),
        ];
        for (text, want) in cases {
            assert_eq!(req(text).map(|h| h.framing()), *want, "{text:?}");
        }
    }

    #[test]
    fn keep_alive_by_version_and_connection() {
        assert!(!req("GET / HTTP/1.0\r\n\r\n").expect("valid").keep_alive());
        assert!(req("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n").expect("valid").keep_alive());
        assert!(!req("GET / HTTP/1.1\r\nHost: x\r\nConnection: foo, close\r\n\r\n").expect("valid").keep_alive());
        let up = req("GET / HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n").expect("valid");
        assert!(up.connection().upgrade);
        let e = req("PUT / HTTP/1.1\r\nHost: x\r\nExpect: 100-Continue\r\nContent-Length: 1\r\n\r\n").expect("valid");
        assert!(e.expects_continue());
        // An HTTP/1.0 client's expectation is ignored (RFC 9110 section 10.1.1).
        let e = req("PUT / HTTP/1.0\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n").expect("valid");
        assert!(!e.expects_continue());
    }

    /// Issue 31 (22, 26): a `101` never leaves its connection reusable; an HTTP/1.0 response with
    /// `Transfer-Encoding` is refused; a repeated equal `Content-Length` frames the body once.
    #[test]
    fn responses_whose_connection_cannot_go_on() {
        let switched =
            resp("HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n", false);
        assert!(!switched.expect("valid").keep_alive());
        assert!(resp("HTTP/1.1 100 Continue\r\n\r\n", false).expect("valid").keep_alive());
        for te in ["chunked", "gzip", "gzip, chunked"] {
            let r = resp(&format!("HTTP/1.0 200 OK\r\nTransfer-Encoding: {te}\r\n\r\n"), false);
            assert_eq!(r.map(|h| h.framing()), Err(HeadError::TransferEncoding), "{te}");
        }
        let twice = resp("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nContent-Length: 2\r\n\r\n", false);
        assert_eq!(twice.map(|h| h.framing()), Ok(Framing::Length(2)));
    }

    #[test]
    fn leading_empty_lines_are_skipped() {
        let h = req("\r\nGET / HTTP/1.1\r\nHost: x\r\n\r\n").expect("valid");
        assert_eq!(&h.fields().first_line()[..], b"GET / HTTP/1.1\r\n");
    }

    #[test]
    fn response_framing() {
        let f = |t: &str, head| resp(t, head).map(|r| (r.framing(), r.keep_alive()));
        assert_eq!(f("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", false), Ok((Framing::Length(3), true)));
        assert_eq!(f("HTTP/1.1 200 OK\r\nContent-Length: 3\r\n\r\n", true), Ok((Framing::Empty, true)));
        assert_eq!(f("HTTP/1.1 304 Not Modified\r\nContent-Length: 3\r\n\r\n", false), Ok((Framing::Empty, true)));
        assert_eq!(f("HTTP/1.1 204 No Content\r\n\r\n", false), Ok((Framing::Empty, true)));
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n", false),
            Ok((Framing::Chunked, true))
        );
        assert_eq!(f("HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip\r\n\r\n", false), Ok((Framing::UntilClose, false)));
        assert_eq!(f("HTTP/1.1 200 OK\r\n\r\n", false), Ok((Framing::UntilClose, false)));
        assert_eq!(f("HTTP/1.0 200 OK\r\nContent-Length: 1\r\n\r\n", false), Ok((Framing::Length(1), false)));
        assert_eq!(
            f("HTTP/1.0 200 OK\r\nContent-Length: 1\r\nConnection: keep-alive\r\n\r\n", false),
            Ok((Framing::Length(1), true))
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 1\r\n\r\n", false),
            Ok((Framing::Length(1), true))
        );
        assert_eq!(
            f("HTTP/1.1 200 OK\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n", false),
            Err(HeadError::ContentLength)
        );
        // A bare LF ends a line of a response.
        assert_eq!(f("HTTP/1.1 200 OK\nContent-Length: 2\n\n", false), Ok((Framing::Length(2), true)));
        let r = resp("HTTP/1.1 404 Not Found\r\nX: y\r\n\r\n", false).expect("valid");
        assert_eq!((r.status(), r.reason()), (404, &b"Not Found"[..]));
    }
}
