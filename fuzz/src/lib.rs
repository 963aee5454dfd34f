//! The fuzz targets ([`targets`]: one `run(&[u8])` each, which the libFuzzer binaries in
//! `fuzz_targets/` call and `tests/replay.rs` runs on the committed corpus), and the input
//! decoding they share.
//!
//! The request-shaped targets read a text format close to HTTP/1 on the wire, so seeds are
//! readable and libFuzzer's byte mutations stay meaningful:
//!
//! ```text
//! @peer=10.0.0.7:5555 chunks=3 fail      (optional options line, see [`Options`])
//! GET /thumb/cat.jpg?k=1 HTTP/1.1        (method, target, optional version)
//! Host: img.example                      (headers, `name: value`, until an empty line)
//!
//! body bytes...                          (the rest, as is)
//! ```
//!
//! Lines end with `\n` (a trailing `\r` is dropped). A head that `http` refuses (bad method, URI,
//! header name or value) decodes to `None` and the input is skipped.

pub mod targets {
    //! One module per target, each with `run(&[u8])`: never a panic on any input.
    pub mod admin_json;
    pub mod config;
    pub mod http1_differential;
    pub mod key_template;
    pub mod memcache_codec;
    pub mod request;
    pub mod resp_codec;
}

use std::collections::VecDeque;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::Bytes;
use http::header::{HeaderName, HeaderValue};
use http::{Request, Version};
use http_body_util::BodyExt;
use http_body_util::combinators::UnsyncBoxBody;
use hyper::body::{Body, Frame, SizeHint};

/// Options from the `@` line.
#[derive(Clone, Debug)]
pub struct Options {
    /// The client's address (`peer=`): an `ip:port` or a bare IP; default 127.0.0.1:40000.
    pub peer: SocketAddr,
    /// How many frames the body is split into (`chunks=`, 1..=16); 0 means one `Full` body.
    pub chunks: usize,
    /// The body ends with an error after its frames (`fail`), like a client cut mid-upload.
    pub fail: bool,
}

impl Default for Options {
    fn default() -> Self {
        Options { peer: SocketAddr::from((Ipv4Addr::LOCALHOST, 40000)), chunks: 0, fail: false }
    }
}

fn parse_options(line: &[u8]) -> Options {
    let mut o = Options::default();
    for word in String::from_utf8_lossy(line).split_ascii_whitespace() {
        if let Some(p) = word.strip_prefix("peer=") {
            if let Ok(a) = p.parse::<SocketAddr>() {
                o.peer = a;
            } else if let Ok(ip) = p.parse::<IpAddr>() {
                o.peer = SocketAddr::new(ip, 40000);
            }
        } else if let Some(n) = word.strip_prefix("chunks=") {
            o.chunks = n.parse::<usize>().map_or(0, |n| n.min(16));
        } else if word == "fail" {
            o.fail = true;
        }
    }
    o
}

/// Splits off the first line (without `\n` and a trailing `\r`).
pub fn line(input: &[u8]) -> (&[u8], &[u8]) {
    let (l, rest) = match input.iter().position(|&b| b == b'\n') {
        Some(i) => (&input[..i], &input[i + 1..]),
        None => (input, &[][..]),
    };
    (l.strip_suffix(b"\r").unwrap_or(l), rest)
}

/// A decoded request: options, head (with an empty body), body bytes.
#[derive(Debug)]
pub struct Decoded {
    /// The `@` line's options.
    pub options: Options,
    /// The request head.
    pub head: Request<()>,
    /// The body.
    pub body: Bytes,
}

/// Decodes the format above; `None` when `http` refuses the head.
pub fn decode(input: &[u8]) -> Option<Decoded> {
    let mut rest = input;
    let mut options = Options::default();
    if rest.first() == Some(&b'@') {
        let (l, r) = line(rest);
        options = parse_options(&l[1..]);
        rest = r;
    }
    let (start, mut rest) = line(rest);
    let mut words = start.splitn(3, |&b| b == b' ');
    let method = words.next().unwrap_or(b"GET");
    let target = words.next().unwrap_or(b"/");
    let version = match words.next() {
        Some(b"HTTP/1.0") => Version::HTTP_10,
        _ => Version::HTTP_11,
    };
    let mut b = Request::builder().method(method).uri(target.to_vec()).version(version);
    loop {
        if rest.is_empty() {
            break;
        }
        let (l, r) = line(rest);
        rest = r;
        if l.is_empty() {
            break;
        }
        let (name, value) = match l.iter().position(|&c| c == b':') {
            Some(i) => (&l[..i], &l[i + 1..]),
            None => (l, &[][..]),
        };
        // Optional whitespace around a field value is not part of it (RFC 9112 section 5).
        let value = value.trim_ascii();
        let name = HeaderName::from_bytes(name).ok()?;
        let value = HeaderValue::from_bytes(value).ok()?;
        b = b.header(name, value);
    }
    let head = b.body(()).ok()?;
    Some(Decoded { options, head, body: Bytes::copy_from_slice(rest) })
}

/// A request body in frames, optionally ending with an error (a client's broken upload).
#[derive(Debug)]
pub struct Chunks {
    frames: VecDeque<Bytes>,
    fail: bool,
}

/// The error [`Chunks`] ends with when asked to fail.
#[derive(Debug)]
pub struct UploadCut;

impl std::fmt::Display for UploadCut {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("fuzz: upload cut")
    }
}

impl std::error::Error for UploadCut {}

impl Chunks {
    /// `body` in `n` frames (at least one when the body is not empty).
    pub fn new(body: Bytes, n: usize, fail: bool) -> Self {
        let mut frames = VecDeque::new();
        if !body.is_empty() {
            let size = body.len().div_ceil(n.max(1));
            let mut at = 0;
            while at < body.len() {
                let end = (at + size).min(body.len());
                frames.push_back(body.slice(at..end));
                at = end;
            }
        }
        Chunks { frames, fail }
    }
}

impl Body for Chunks {
    type Data = Bytes;
    type Error = UploadCut;

    fn poll_frame(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, UploadCut>>> {
        if let Some(f) = self.frames.pop_front() {
            return Poll::Ready(Some(Ok(Frame::data(f))));
        }
        if self.fail {
            self.fail = false;
            return Poll::Ready(Some(Err(UploadCut)));
        }
        Poll::Ready(None)
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty() && !self.fail
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

/// The body as the options ask: one `Full` (chunks=0 and no failure), or [`Chunks`].
pub fn body(options: &Options, bytes: Bytes) -> UnsyncBoxBody<Bytes, Box<dyn std::error::Error + Send + Sync>> {
    if options.chunks == 0 && !options.fail {
        http_body_util::Full::new(bytes).map_err(|never| match never {}).boxed_unsync()
    } else {
        Chunks::new(bytes, options.chunks, options.fail).map_err(Into::into).boxed_unsync()
    }
}
