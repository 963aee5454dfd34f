//! The server side: one client connection, its request heads, their bodies and the responses.
//!
//! A [`ServerConn`] is the connection's transport and the bytes read past the current head
//! (its body's, or the next pipelined request's), and nothing else: between requests it holds no
//! buffer (reads go through the thread's buffer, [`crate::buf`]). The task that serves the
//! connection calls [`ServerConn::read_head`], hands the request's [`ServerBody`] to whoever
//! consumes it, and writes the response with [`ServerConn::respond`]: its head and its first
//! body frame in one vectored write when the frame is already there, each later frame as it
//! comes, chunked or not as the response and the client allow (RFC 9112 section 6). A write the
//! client does not take for the send timeout fails the response.
//!
//! The body reads from the same connection as the responses are written to, from the same task:
//! the transport sits behind a mutex that is only ever held for one non-blocking call, never
//! across a wait, so an upload and its (early) response can both move.

use std::io::{self, IoSlice};
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, ready};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;

use crate::body::{BodyDecoder, BodyError, LAST_CHUNK, PollError, chunk_header};
use crate::client::{BoxError, RequestBody};
use crate::head::{Framing, HeadError, Limits, Parsed, RequestHead, Version, parse_request};

/// A client connection's transport: anything that reads and writes, read through the thread's
/// buffer. A plain socket reads by readiness and keeps no buffer; a TLS stream reads through its
/// own (rustls's).
pub trait Transport: AsyncRead + AsyncWrite + Unpin + Send + 'static {
    /// Reads what is there into the thread's buffer (see [`crate::buf`]); empty at the end.
    ///
    /// # Errors
    ///
    /// The transport's error.
    fn poll_read_bytes(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        crate::buf::poll_read_into(self, cx)
    }
}

impl Transport for TcpStream {
    fn poll_read_bytes(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
        crate::buf::poll_read(&self, cx)
    }
}

/// What the connection's task and its request's body share.
struct Shared<S> {
    /// `None` once taken for a tunnel.
    io: Option<S>,
    /// Bytes read past the current head: its body's, then the next request's.
    tail: Bytes,
    /// The current request's body: how far it has got.
    decoder: BodyDecoder,
    /// `100 Continue` is owed before the body is read (`Expect: 100-continue`), and how much of
    /// it is written.
    continue_owed: Option<usize>,
    /// The client closed or broke the connection while its body was read.
    broken: bool,
}

/// A client connection. See the [module documentation](self).
pub struct ServerConn<S> {
    shared: Arc<Mutex<Shared<S>>>,
}

impl<S> std::fmt::Debug for ServerConn<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerConn").finish_non_exhaustive()
    }
}

/// Why no request head was read.
#[derive(Debug)]
pub enum ReadError {
    /// The client closed the connection (`partial`: in the middle of a head).
    Closed {
        /// Bytes of a head had arrived.
        partial: bool,
    },
    /// The head was refused ([`HeadError::status`] is the answer).
    Head(HeadError),
    /// The transport failed.
    Io(io::Error),
}

const CONTINUE: &[u8] = b"HTTP/1.1 100 Continue\r\n\r\n";

fn lock<S>(m: &Mutex<Shared<S>>) -> MutexGuard<'_, Shared<S>> {
    m.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

impl<S: Transport> ServerConn<S> {
    /// A connection over an accepted transport.
    pub fn new(io: S) -> Self {
        ServerConn {
            shared: Arc::new(Mutex::new(Shared {
                io: Some(io),
                tail: Bytes::new(),
                decoder: BodyDecoder::Done,
                continue_owed: None,
                broken: false,
            })),
        }
    }

    /// Whether bytes of a next head have arrived (a head timeout then answers 408).
    pub fn has_partial_head(&self) -> bool {
        !lock(&self.shared).tail.is_empty()
    }

    /// Whether the current request's body has been read to its end.
    pub fn body_done(&self) -> bool {
        lock(&self.shared).decoder.is_done()
    }

    /// Reads the next request head (bytes already here first: pipelining).
    ///
    /// # Errors
    ///
    /// See [`ReadError`]. Nothing more can be read from the connection after one.
    pub async fn read_head(&self, limits: &Limits) -> Result<RequestHead, ReadError> {
        loop {
            {
                let mut sh = lock(&self.shared);
                if !sh.tail.is_empty() {
                    let bytes = std::mem::take(&mut sh.tail);
                    match parse_request(&bytes, limits) {
                        Ok(Parsed::Complete(head, n)) => {
                            sh.tail = bytes.slice(n..);
                            sh.decoder = BodyDecoder::new(head.framing());
                            sh.continue_owed = (head.expects_continue() && !sh.decoder.is_done()).then_some(0);
                            return Ok(head);
                        }
                        // A partial head waits in a buffer of its own: the thread's block it was
                        // read into is not pinned by a client that stops half-way.
                        Ok(Parsed::Partial) => {
                            sh.tail = match bytes.try_into_mut() {
                                Ok(own) => own.freeze(),
                                Err(shared) => Bytes::copy_from_slice(&shared),
                            }
                        }
                        Err(e) => return Err(ReadError::Head(e)),
                    }
                }
            }
            let read = std::future::poll_fn(|cx| {
                let mut sh = lock(&self.shared);
                match sh.io.as_mut() {
                    Some(io) => Pin::new(io).poll_read_bytes(cx),
                    None => Poll::Ready(Ok(Bytes::new())),
                }
            })
            .await;
            let mut sh = lock(&self.shared);
            match read {
                Ok(b) if b.is_empty() => return Err(ReadError::Closed { partial: !sh.tail.is_empty() }),
                Ok(b) if sh.tail.is_empty() => sh.tail = b,
                Ok(b) => {
                    // The partial head is this connection's own buffer (copied out of the
                    // thread's once): it grows in place, so a head that trickles in a byte at a
                    // time costs linear copying, not quadratic.
                    let mut joined =
                        std::mem::take(&mut sh.tail).try_into_mut().unwrap_or_else(|t| BytesMut::from(&t[..]));
                    joined.extend_from_slice(&b);
                    sh.tail = joined.freeze();
                }
                Err(e) => return Err(ReadError::Io(e)),
            }
        }
    }

    /// The body of the request whose head was read last.
    pub fn body(&self, head: &RequestHead) -> ServerBody<S> {
        ServerBody { shared: Arc::clone(&self.shared), exact: head_length(head) }
    }

    /// Writes bytes the connection's task made itself (an error response, a `408`), waiting at
    /// most `timeout` for the client to take them.
    ///
    /// # Errors
    ///
    /// The transport's error, or `TimedOut`.
    pub async fn write_raw(&self, bytes: &[u8], timeout: Duration) -> io::Result<()> {
        Writer { shared: &self.shared, timeout }.write_all(&[IoSlice::new(bytes)]).await
    }

    /// Writes a response to a request (see [`Respond`] for what the request said): its head, then
    /// its body framed for the client; `send_timeout` bounds every wait for the client to take
    /// bytes. Returns whether the connection may carry another request.
    ///
    /// # Errors
    ///
    /// The client's transport failed or timed out (`TimedOut`), or the body failed: the
    /// connection cannot go on.
    pub async fn respond<H: OutgoingHead>(
        &self,
        head: &H,
        body: RequestBody,
        req: Respond,
        send_timeout: Duration,
    ) -> Result<bool, RespondError> {
        let status = head.status().as_u16();
        let bodiless = req.head_request || status < 200 || status == 204 || status == 304;
        let mut body = body;
        let length =
            head.field(&http::header::CONTENT_LENGTH).and_then(|v| std::str::from_utf8(v).ok()?.parse::<u64>().ok());
        let framing = if bodiless {
            Framing::Empty
        } else if let Some(n) = length {
            Framing::Length(n)
        } else if let Some(n) = body.size_hint().exact() {
            Framing::Length(n)
        } else if req.version == Version::Http11 {
            Framing::Chunked
        } else {
            Framing::UntilClose
        };
        let says_close = head.says_close();
        let keep_alive = req.keep_alive && !says_close && framing != Framing::UntilClose && status != 101;
        let mut out = crate::buf::head_buffer();
        encode_head(&mut out, head, framing, length.is_none() && !bodiless, keep_alive, req.version, status == 101);
        let mut writer = Writer { shared: &self.shared, timeout: send_timeout };
        if bodiless {
            writer.write_all(&[IoSlice::new(&out)]).await?;
            return Ok(keep_alive);
        }
        // The first frame goes with the head when it is already there (one write for a whole
        // small response).
        let mut sent = 0u64;
        let mut first = poll_now(&mut body);
        loop {
            let frame = match first.take() {
                Some(f) => f,
                None => {
                    if !out.is_empty() {
                        writer.write_all(&[IoSlice::new(&out)]).await?;
                        out.clear();
                    }
                    body.frame().await
                }
            };
            let data = match frame {
                None => None,
                Some(Err(e)) => return Err(RespondError::Body(e)),
                Some(Ok(f)) => match f.into_data() {
                    Ok(d) => Some(d),
                    Err(_) => continue,
                },
            };
            let end = data.is_none() || body.is_end_stream();
            let data = data.unwrap_or_default();
            sent += data.len() as u64;
            if let Framing::Length(n) = framing
                && sent > n
            {
                return Err(RespondError::Length);
            }
            let mut size = [0u8; 18];
            let chunked = framing == Framing::Chunked;
            let size_line: &[u8] = if chunked && !data.is_empty() { chunk_header(data.len(), &mut size) } else { &[] };
            let crlf: &[u8] = if chunked && !data.is_empty() { b"\r\n" } else { &[] };
            let last: &[u8] = if chunked && end { LAST_CHUNK } else { &[] };
            writer
                .write_all(&[
                    IoSlice::new(&out),
                    IoSlice::new(size_line),
                    IoSlice::new(&data),
                    IoSlice::new(crlf),
                    IoSlice::new(last),
                ])
                .await?;
            out.clear();
            if end {
                if let Framing::Length(n) = framing
                    && sent != n
                {
                    return Err(RespondError::Length);
                }
                return Ok(keep_alive);
            }
        }
    }

    /// The transport and the bytes the client sent past the head, for a tunnel after a `101`.
    pub fn into_upgraded(self) -> Option<(S, Bytes)> {
        let mut sh = lock(&self.shared);
        let io = sh.io.take()?;
        Some((io, std::mem::take(&mut sh.tail)))
    }

    /// Closes the connection after a last response the way NGINX's lingering close does: the
    /// write side is shut, then what the client still sends (the rest of an upload nobody read) is
    /// read and dropped, for at most `time` and `bytes`. Closing with unread bytes would reset
    /// the connection, and a reset can destroy the response before the client has read it.
    pub async fn linger(&self, time: Duration, bytes: u64) {
        self.shutdown().await;
        let mut left = bytes;
        let drain = async {
            while left > 0 {
                let read = std::future::poll_fn(|cx| {
                    let mut sh = lock(&self.shared);
                    sh.tail = Bytes::new();
                    match sh.io.as_mut() {
                        Some(io) => Pin::new(io).poll_read_bytes(cx),
                        None => Poll::Ready(Ok(Bytes::new())),
                    }
                })
                .await;
                match read {
                    Ok(b) if !b.is_empty() => left = left.saturating_sub(b.len() as u64),
                    _ => return,
                }
            }
        };
        let _ = tokio::time::timeout(time, drain).await;
    }

    /// Shuts the write side down (after a last response, before closing).
    pub async fn shutdown(&self) {
        let _ = std::future::poll_fn(|cx| {
            let mut sh = lock(&self.shared);
            match sh.io.as_mut() {
                Some(io) => Pin::new(io).poll_shutdown(cx),
                None => Poll::Ready(Ok(())),
            }
        })
        .await;
    }
}

/// What a request says about its response.
#[derive(Clone, Copy, Debug)]
pub struct Respond {
    /// The request was HEAD: no body is written.
    pub head_request: bool,
    /// The request's version.
    pub version: Version,
    /// The request lets the connection go on (see [`RequestHead::keep_alive`]).
    pub keep_alive: bool,
}

/// Why a response could not be written whole.
#[derive(Debug)]
pub enum RespondError {
    /// The client's transport failed, or took nothing for the send timeout (`TimedOut`).
    Io(io::Error),
    /// The response's body failed.
    Body(BoxError),
    /// The body's length differs from its `Content-Length`.
    Length,
}

impl std::fmt::Display for RespondError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RespondError::Io(e) => write!(f, "{e}"),
            RespondError::Body(e) => write!(f, "response body: {e}"),
            RespondError::Length => f.write_str("the response body does not match its Content-Length"),
        }
    }
}

impl std::error::Error for RespondError {}

impl From<io::Error> for RespondError {
    fn from(e: io::Error) -> Self {
        RespondError::Io(e)
    }
}

/// A body's first frame, if it is there without waiting.
fn poll_now(body: &mut RequestBody) -> Option<Option<Result<Frame<Bytes>, BoxError>>> {
    let mut cx = Context::from_waker(std::task::Waker::noop());
    match Pin::new(body).poll_frame(&mut cx) {
        Poll::Ready(f) => Some(f),
        Poll::Pending => None,
    }
}

/// A response head the engine writes ([`ServerConn::respond`]): `http`'s parts, or a caller's
/// own form of a head (a proxy's, kept as a worker sent it).
pub trait OutgoingHead {
    /// The status.
    fn status(&self) -> http::StatusCode;
    /// The first value of field `name`.
    fn field(&self, name: &http::HeaderName) -> Option<&[u8]>;
    /// Whether a `Connection` field lists `close`.
    fn says_close(&self) -> bool;
    /// Writes each field as a line (`name: value` and CRLF) in order, except those whose name
    /// (as the head holds it: any case) `skip` picks.
    fn write_fields(&self, out: &mut Vec<u8>, skip: &dyn Fn(&[u8]) -> bool);
}

impl OutgoingHead for http::response::Parts {
    fn status(&self) -> http::StatusCode {
        self.status
    }

    fn field(&self, name: &http::HeaderName) -> Option<&[u8]> {
        self.headers.get(name).map(http::HeaderValue::as_bytes)
    }

    fn says_close(&self) -> bool {
        let values = self.headers.get_all(http::header::CONNECTION);
        values.iter().any(|v| crate::head::list(v.as_bytes()).any(|o| o.eq_ignore_ascii_case(b"close")))
    }

    fn write_fields(&self, out: &mut Vec<u8>, skip: &dyn Fn(&[u8]) -> bool) {
        for (name, value) in &self.headers {
            if skip(name.as_str().as_bytes()) {
                continue;
            }
            out.extend_from_slice(name.as_str().as_bytes());
            out.extend_from_slice(b": ");
            out.extend_from_slice(value.as_bytes());
            out.extend_from_slice(b"\r\n");
        }
    }
}

/// The response head in HTTP/1.1 form: the status line, the fields as the head writes them, and
/// what the framing and the connection need.
fn encode_head<H: OutgoingHead>(
    out: &mut Vec<u8>,
    head: &H,
    framing: Framing,
    add_length: bool,
    keep_alive: bool,
    version: Version,
    switching: bool,
) {
    let status = head.status();
    out.extend_from_slice(b"HTTP/1.1 ");
    out.extend_from_slice(status.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(status.canonical_reason().unwrap_or("").as_bytes());
    out.extend_from_slice(b"\r\n");
    let has_date = head.field(&http::header::DATE).is_some();
    // The engine frames the body and says what the connection does: the head's own framing and
    // `Connection` fields do not go (but a 101's `Connection: upgrade` does).
    let chunked = framing == Framing::Chunked;
    head.write_fields(out, &|name| {
        name.eq_ignore_ascii_case(b"transfer-encoding")
            || (!switching && name.eq_ignore_ascii_case(b"connection"))
            || (chunked && name.eq_ignore_ascii_case(b"content-length"))
    });
    match framing {
        Framing::Chunked => out.extend_from_slice(b"transfer-encoding: chunked\r\n"),
        Framing::Length(n) if add_length => {
            use std::io::Write as _;
            let _ = write!(out, "content-length: {n}\r\n");
        }
        _ => {}
    }
    if !switching {
        if !keep_alive {
            out.extend_from_slice(b"connection: close\r\n");
        } else if version == Version::Http10 {
            out.extend_from_slice(b"connection: keep-alive\r\n");
        }
    }
    if !has_date {
        out.extend_from_slice(b"date: ");
        crate::date::append(out);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// The request body's exact length, when its framing says it.
fn head_length(head: &RequestHead) -> Option<u64> {
    match head.framing() {
        Framing::Empty => Some(0),
        Framing::Length(n) => Some(n),
        _ => None,
    }
}

/// Writes to the shared transport, every wait bounded by the send timeout.
struct Writer<'a, S> {
    shared: &'a Mutex<Shared<S>>,
    timeout: Duration,
}

impl<S: Transport> Writer<'_, S> {
    async fn write_all(&mut self, parts: &[IoSlice<'_>]) -> io::Result<()> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut done = 0;
        let mut deadline: Option<Pin<Box<tokio::time::Sleep>>> = None;
        while done < total {
            let n = std::future::poll_fn(|cx| {
                let mut sh = lock(self.shared);
                let Some(io) = sh.io.as_mut() else { return Poll::Ready(Err(io::ErrorKind::NotConnected.into())) };
                let mut slices = [IoSlice::new(&[]); MAX_PARTS];
                let k = remaining(parts, done, &mut slices);
                let r = Pin::new(io).poll_write_vectored(cx, &slices[..k]);
                drop(sh);
                match r {
                    Poll::Pending => {
                        let timeout = self.timeout;
                        let sleep = deadline.get_or_insert_with(|| Box::pin(tokio::time::sleep(timeout)));
                        ready!(sleep.as_mut().poll(cx));
                        Poll::Ready(Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            "the client read nothing for the send timeout",
                        )))
                    }
                    Poll::Ready(r) => Poll::Ready(r),
                }
            })
            .await?;
            if n == 0 {
                return Err(io::ErrorKind::WriteZero.into());
            }
            deadline = None;
            done += n;
        }
        std::future::poll_fn(|cx| {
            let mut sh = lock(self.shared);
            match sh.io.as_mut() {
                Some(io) => Pin::new(io).poll_flush(cx),
                None => Poll::Ready(Ok(())),
            }
        })
        .await
    }
}

/// The most parts of one write (a head, a chunk's size line, its data, its CRLF, the last chunk).
const MAX_PARTS: usize = 5;

/// The parts' bytes from offset `done` on, in `out`; how many.
fn remaining<'a>(parts: &'a [IoSlice<'a>], mut done: usize, out: &mut [IoSlice<'a>; MAX_PARTS]) -> usize {
    let mut k = 0;
    for p in parts {
        let b: &'a [u8] = &p[..];
        if done >= b.len() {
            done -= b.len();
            continue;
        }
        if k == MAX_PARTS {
            break;
        }
        out[k] = IoSlice::new(&b[done..]);
        done = 0;
        k += 1;
    }
    k
}

/// A request's body, read from its connection as it is polled. See the [module
/// documentation](self).
pub struct ServerBody<S> {
    shared: Arc<Mutex<Shared<S>>>,
    exact: Option<u64>,
}

impl<S> std::fmt::Debug for ServerBody<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerBody").finish_non_exhaustive()
    }
}

/// Why a request body could not be read.
#[derive(Debug)]
pub enum ReadBodyError {
    /// Malformed chunked framing.
    Framing(BodyError),
    /// The client closed the connection before the body ended.
    Closed,
    /// The transport failed.
    Io(io::Error),
}

impl std::fmt::Display for ReadBodyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadBodyError::Framing(e) => write!(f, "{e}"),
            ReadBodyError::Closed => f.write_str("the client closed the connection before the body ended"),
            ReadBodyError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for ReadBodyError {}

impl<S: Transport> Body for ServerBody<S> {
    type Data = Bytes;
    type Error = ReadBodyError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ReadBodyError>>> {
        let mut sh = lock(&self.shared);
        let sh = &mut *sh;
        if sh.broken {
            return Poll::Ready(Some(Err(ReadBodyError::Closed)));
        }
        // `100 Continue` first, when the client waits for it.
        while let Some(done) = sh.continue_owed {
            if !sh.tail.is_empty() {
                sh.continue_owed = None;
                break;
            }
            let Some(io) = sh.io.as_mut() else { break };
            match Pin::new(io).poll_write(cx, &CONTINUE[done..]) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(Ok(n)) if n > 0 && done + n < CONTINUE.len() => sh.continue_owed = Some(done + n),
                Poll::Ready(Ok(n)) if n > 0 => sh.continue_owed = None,
                _ => {
                    sh.broken = true;
                    return Poll::Ready(Some(Err(ReadBodyError::Closed)));
                }
            }
        }
        let Shared { io, tail, decoder, broken, .. } = sh;
        let Some(io) = io.as_mut() else { return Poll::Ready(Some(Err(ReadBodyError::Closed))) };
        match ready!(decoder.poll_data(tail, cx, |cx| Pin::new(&mut *io).poll_read_bytes(cx))) {
            None => Poll::Ready(None),
            Some(Ok(d)) => Poll::Ready(Some(Ok(Frame::data(d)))),
            Some(Err(e)) => {
                *broken = true;
                Poll::Ready(Some(Err(match e {
                    PollError::Framing(BodyError::Truncated) => ReadBodyError::Closed,
                    PollError::Framing(e) => ReadBodyError::Framing(e),
                    PollError::Io(e) => ReadBodyError::Io(e),
                })))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        // Most requests have no body: known without the lock.
        self.exact == Some(0) || lock(&self.shared).decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.exact {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

/// A transport with bytes already read from it in front (a tunnel's client side after a 101).
#[derive(Debug)]
pub struct Prefixed<S> {
    rest: Bytes,
    io: S,
}

impl<S> Prefixed<S> {
    /// `io`, whose next bytes are `rest`.
    pub fn new(rest: Bytes, io: S) -> Self {
        Prefixed { rest, io }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Prefixed<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        if !self.rest.is_empty() {
            let n = self.rest.len().min(buf.remaining());
            let part = self.rest.split_to(n);
            buf.put_slice(&part);
            return Poll::Ready(Ok(()));
        }
        Pin::new(&mut self.io).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Prefixed<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncWriteExt;

    #[tokio::test]
    async fn a_head_that_trickles_in_a_byte_at_a_time_is_read() {
        let (ours, mut client) = tokio::io::duplex(64);
        let conn = ServerConn::new(ours);
        let text = b"GET /x HTTP/1.1\r\nHost: a\r\nX-Long: 0123456789\r\n\r\nGET /next HTTP/1.1\r\n";
        let writer = tokio::spawn(async move {
            for byte in text {
                client.write_all(&[*byte]).await.expect("write");
                tokio::task::yield_now().await;
            }
            client
        });
        let head = conn.read_head(&Limits::default()).await.expect("a head");
        assert_eq!((head.target(), head.header("x-long")), ("/x", Some(&b"0123456789"[..])));
        let _client = writer.await.expect("writer");
        // The pipelined next head's first bytes are read, and wait in the connection's own buffer.
        let next = tokio::time::timeout(Duration::from_millis(50), conn.read_head(&Limits::default())).await;
        assert!(next.is_err() && conn.has_partial_head());
    }

    #[tokio::test]
    async fn a_response_without_a_length_is_chunked_for_http_11_and_closes_for_http_10() {
        use http_body_util::{BodyExt, StreamBody};
        use tokio::io::AsyncReadExt;
        for (version, chunked) in [(Version::Http11, true), (Version::Http10, false)] {
            let (ours, mut client) = tokio::io::duplex(4096);
            let conn = ServerConn::new(ours);
            let frames = vec![Ok::<_, BoxError>(Frame::data(Bytes::from_static(b"hello")))];
            let body = StreamBody::new(futures_iter(frames)).boxed_unsync();
            let (parts, ()) = http::Response::new(()).into_parts();
            let keep = conn
                .respond(
                    &parts,
                    body,
                    Respond { head_request: false, version, keep_alive: true },
                    Duration::from_secs(1),
                )
                .await
                .expect("written");
            drop(conn);
            let mut out = Vec::new();
            client.read_to_end(&mut out).await.expect("read");
            let out = String::from_utf8_lossy(&out);
            assert_eq!(keep, chunked, "{out}");
            if chunked {
                assert!(
                    out.contains("transfer-encoding: chunked\r\n") && out.ends_with("\r\n\r\n5\r\nhello\r\n0\r\n\r\n"),
                    "{out}"
                );
            } else {
                assert!(out.contains("connection: close\r\n") && out.ends_with("\r\n\r\nhello"), "{out}");
            }
        }
    }

    /// A stream of the given items (no `futures` dependency for one test).
    fn futures_iter<T: Unpin>(items: Vec<T>) -> impl futures_core::Stream<Item = T> + Unpin {
        struct Iter<T>(std::vec::IntoIter<T>);
        impl<T: Unpin> futures_core::Stream for Iter<T> {
            type Item = T;
            fn poll_next(mut self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<Option<T>> {
                Poll::Ready(self.0.next())
            }
        }
        Iter(items.into_iter())
    }
}
