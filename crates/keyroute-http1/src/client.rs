//! The client side: one request on one connection to a server, driven by the task that asked
//! for it. There is no connection task and no channel: [`send`] writes the head, uploads the
//! body while it watches for the response, and parses the response head from the thread's read
//! buffer; the [`ResponseBody`] then reads the body (and finishes an upload the server answered
//! early) as it is polled, and hands the connection back when the exchange has ended cleanly
//! ([`ResponseBody::take_reusable`]). Pooling is the caller's: a [`ClientConn`] is a socket and
//! nothing else, so an idle one costs what the kernel keeps for it.
//!
//! Failures are told apart the way a proxy needs them:
//! - [`SendError::NotSent`]: the head could not be written (the server had closed the pooled
//!   connection): the server saw nothing, and the body (untouched) is handed back, so the request
//!   can go on another connection whatever its method;
//! - [`SendError::Failed`]: afterwards; the server may have acted on it.

use std::future::poll_fn;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, Waker, ready};

use bytes::{Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};
use tokio::net::TcpStream;

use crate::body::{BodyDecoder, BodyError, LAST_CHUNK, PollError, chunk_header};
use crate::buf;
use crate::head::{HeadError, Limits, Parsed, ResponseHead, parse_response};

/// The error type of request bodies, boxed.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A request body: any body, boxed (one concrete type keeps the futures that hold it `Send`
/// without higher-ranked bounds on its error type).
pub type RequestBody = http_body_util::combinators::UnsyncBoxBody<Bytes, BoxError>;

/// A connection to a server: a socket, and nothing else while it is idle.
#[derive(Debug)]
pub struct ClientConn {
    io: TcpStream,
}

impl ClientConn {
    /// A connection over a connected socket (`TCP_NODELAY` is set: a head and a body go out as
    /// they are written).
    pub fn new(io: TcpStream) -> Self {
        let _ = io.set_nodelay(true);
        ClientConn { io }
    }

    /// Whether an idle connection can carry a request: the server has not closed it and has sent
    /// nothing unasked. Costs no syscall unless the socket was marked readable.
    pub fn is_usable(&self) -> bool {
        let mut cx = Context::from_waker(Waker::noop());
        match self.io.poll_read_ready(&mut cx) {
            Poll::Pending => true,
            Poll::Ready(Err(_)) => false,
            // Readable: the end of the stream, bytes nobody asked for, or a stale mark.
            Poll::Ready(Ok(())) => {
                let mut one = [0u8; 1];
                matches!(self.io.try_read(&mut one), Err(e) if e.kind() == io::ErrorKind::WouldBlock)
            }
        }
    }

    /// The socket (for a tunnel, after `101 Switching Protocols`).
    pub fn into_inner(self) -> TcpStream {
        self.io
    }

    /// The socket.
    pub fn socket(&self) -> &TcpStream {
        &self.io
    }
}

/// How the request body is framed on the wire (the head already says so).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outgoing {
    /// No body.
    Empty,
    /// `Content-Length` bytes.
    Length(u64),
    /// Chunked: each data frame becomes a chunk.
    Chunked,
}

/// Why an exchange failed after its head was written.
#[derive(Debug)]
pub enum ExchangeError {
    /// The socket failed.
    Io(io::Error),
    /// The server closed the connection before a whole response head.
    Closed,
    /// The response head was malformed or too large.
    Head(HeadError),
    /// The response body's framing was malformed, or it was cut short.
    Body(BodyError),
    /// The request body (the client's upload) failed.
    Upload(BoxError),
    /// The request body did not match its framing (more or fewer bytes than its length).
    UploadLength,
}

impl std::fmt::Display for ExchangeError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ExchangeError::Io(e) => write!(f, "{e}"),
            ExchangeError::Closed => f.write_str("the connection closed before a response"),
            ExchangeError::Head(e) => write!(f, "response head: {e}"),
            ExchangeError::Body(e) => write!(f, "response body: {e}"),
            ExchangeError::Upload(e) => write!(f, "request body: {e}"),
            ExchangeError::UploadLength => f.write_str("the request body did not match its length"),
        }
    }
}

impl std::error::Error for ExchangeError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            ExchangeError::Io(e) => Some(e),
            ExchangeError::Head(e) => Some(e),
            ExchangeError::Body(e) => Some(e),
            ExchangeError::Upload(e) => Some(&**e),
            _ => None,
        }
    }
}

/// Why [`send`] failed.
#[derive(Debug)]
pub enum SendError {
    /// The head could not be written: the server saw nothing. The body comes back untouched.
    NotSent(io::Error, RequestBody),
    /// The exchange failed after the head was written.
    Failed(ExchangeError),
}

/// A response head and its body.
#[derive(Debug)]
pub struct Response {
    /// The head (a `1xx` other than 101 was skipped).
    pub head: ResponseHead,
    /// The body, which owns the connection until it ends.
    pub body: ResponseBody,
}

/// Sends a request on `conn`: `head` (its framing fields saying `outgoing`), then `body` while
/// watching for the response; returns once a final response head has arrived (interim `1xx`
/// responses other than `101` are skipped). `head_request`: the request is HEAD, so the response
/// has no body.
///
/// # Errors
///
/// See [`SendError`].
pub async fn send(
    conn: ClientConn,
    head: &[u8],
    body: RequestBody,
    outgoing: Outgoing,
    head_request: bool,
    limits: &Limits,
) -> Result<Response, SendError> {
    if let Err(e) = buf::write_all(&conn.io, head).await {
        return Err(SendError::NotSent(e, body));
    }
    let mut upload = Upload::new(body, outgoing);
    let mut partial = BytesMut::new();
    loop {
        // The upload's own failure (the client's body broke) ends the exchange when it happens,
        // not when the server answers or the caller's timeout runs out.
        let read = poll_fn(|cx| {
            upload.drive(&conn.io, cx);
            if upload.client_failed() {
                return Poll::Ready(None);
            }
            buf::poll_read(&conn.io, cx).map(Some)
        })
        .await;
        if let Some(e) = upload.take_client_error() {
            return Err(SendError::Failed(e));
        }
        let Some(read) = read else { return Err(SendError::Failed(ExchangeError::Closed)) };
        let mut bytes = match read {
            Ok(b) if b.is_empty() => return Err(SendError::Failed(ExchangeError::Closed)),
            Ok(b) if partial.is_empty() => b,
            Ok(b) => {
                partial.extend_from_slice(&b);
                partial.split().freeze()
            }
            Err(e) => return Err(SendError::Failed(ExchangeError::Io(e))),
        };
        // One read may hold interim responses, the final head and some of the body.
        loop {
            match parse_response(&bytes, limits, head_request) {
                Ok(Parsed::Complete(h, n)) => {
                    let rest = bytes.slice(n..);
                    if (100..200).contains(&h.status()) && h.status() != 101 {
                        bytes = rest;
                        if bytes.is_empty() {
                            break;
                        }
                        continue;
                    }
                    let mut body = ResponseBody {
                        conn: Some(conn),
                        decoder: BodyDecoder::new(h.framing()),
                        buffered: rest,
                        upload,
                        keep_alive: h.keep_alive(),
                        failed: false,
                    };
                    if let Err(e) = body.decoder.settle(&mut body.buffered) {
                        return Err(SendError::Failed(ExchangeError::Body(e)));
                    }
                    return Ok(Response { head: h, body });
                }
                Ok(Parsed::Partial) => {
                    partial.extend_from_slice(&bytes);
                    break;
                }
                Err(e) => return Err(SendError::Failed(ExchangeError::Head(e))),
            }
        }
    }
}

/// The request body on its way out, written as the socket takes it.
#[derive(Debug)]
struct Upload {
    body: Option<RequestBody>,
    outgoing: Outgoing,
    sent: u64,
    /// Bytes taken from the body but not yet written: a chunk's size line, its data, its CRLF.
    size_line: ([u8; 18], u8, u8),
    data: Bytes,
    tail: &'static [u8],
    state: UploadState,
    /// The body's end was seen while joining frames ([`Upload::gather`]).
    ended: bool,
}

/// Data frames smaller than this are joined with those the body already has ready, up to this
/// size, before they are written (as one chunk, when chunked): 16 KiB, nginx's
/// `client_body_buffer_size` on 64-bit machines.
const COALESCE: usize = 16 * 1024;

#[derive(Debug)]
enum UploadState {
    Sending,
    /// All written.
    Done,
    /// The client's body failed (reported once, then `Dead`).
    ClientFailed(ExchangeError),
    /// The socket stopped taking it (the server answered early, or closed), or it was reported.
    Dead,
}

impl Upload {
    fn new(body: RequestBody, outgoing: Outgoing) -> Self {
        let done = body.is_end_stream() && outgoing == Outgoing::Empty;
        Upload {
            body: Some(body),
            outgoing,
            sent: 0,
            size_line: ([0; 18], 0, 0),
            data: Bytes::new(),
            tail: &[],
            state: if done { UploadState::Done } else { UploadState::Sending },
            ended: false,
        }
    }

    fn is_done(&self) -> bool {
        matches!(self.state, UploadState::Done)
    }

    fn is_sending(&self) -> bool {
        matches!(self.state, UploadState::Sending)
    }

    fn client_failed(&self) -> bool {
        matches!(self.state, UploadState::ClientFailed(_))
    }

    fn take_client_error(&mut self) -> Option<ExchangeError> {
        match std::mem::replace(&mut self.state, UploadState::Dead) {
            UploadState::ClientFailed(e) => Some(e),
            other => {
                self.state = other;
                None
            }
        }
    }

    fn pending(&self) -> bool {
        self.size_line.2 < self.size_line.1 || !self.data.is_empty() || !self.tail.is_empty()
    }

    /// Moves the upload on as far as it goes without waiting; registers `cx` for what it waits
    /// on (the client's body, or a full socket).
    fn drive(&mut self, io: &TcpStream, cx: &mut Context<'_>) {
        while self.is_sending() {
            if self.pending() {
                if !self.write(io, cx) {
                    return;
                }
                continue;
            }
            let Some(body) = self.body.as_mut() else {
                self.state = UploadState::Done;
                return;
            };
            if self.ended || body.is_end_stream() {
                self.finish();
                continue;
            }
            match Pin::new(body).poll_frame(cx) {
                Poll::Pending => return,
                Poll::Ready(None) => self.finish(),
                Poll::Ready(Some(Err(e))) => self.state = UploadState::ClientFailed(ExchangeError::Upload(e)),
                Poll::Ready(Some(Ok(frame))) => {
                    // Trailers are dropped (a re-framing proxy may).
                    let Ok(mut data) = frame.into_data() else { continue };
                    if data.is_empty() {
                        continue;
                    }
                    if data.len() < COALESCE {
                        data = self.gather(data, cx);
                        if !self.is_sending() {
                            return;
                        }
                    }
                    self.sent += data.len() as u64;
                    match self.outgoing {
                        Outgoing::Chunked => {
                            let n = chunk_header(data.len(), &mut self.size_line.0).len();
                            self.size_line.1 = n as u8;
                            self.size_line.2 = 0;
                            self.tail = b"\r\n";
                        }
                        Outgoing::Length(n) if self.sent <= n => {}
                        _ => {
                            self.state = UploadState::ClientFailed(ExchangeError::UploadLength);
                            return;
                        }
                    }
                    self.data = data;
                }
            }
        }
    }

    /// Joins the data frames the body has ready now to `first`, up to [`COALESCE`] bytes: a
    /// client that sends many small chunks costs the server one chunk (and one write) per batch,
    /// not one per chunk of its own (300,000 one-byte chunks are 1.8 MB of chunk framing). Notes
    /// the body's end or failure for the caller.
    fn gather(&mut self, first: Bytes, cx: &mut Context<'_>) -> Bytes {
        let Some(body) = self.body.as_mut() else { return first };
        let mut joined: Option<BytesMut> = None;
        while joined.as_ref().map_or(first.len(), BytesMut::len) < COALESCE && !body.is_end_stream() {
            match Pin::new(&mut *body).poll_frame(cx) {
                Poll::Pending => break,
                Poll::Ready(None) => {
                    self.ended = true;
                    break;
                }
                Poll::Ready(Some(Err(e))) => {
                    self.state = UploadState::ClientFailed(ExchangeError::Upload(e));
                    break;
                }
                Poll::Ready(Some(Ok(frame))) => {
                    if let Ok(d) = frame.into_data() {
                        joined.get_or_insert_with(|| BytesMut::from(&first[..])).extend_from_slice(&d);
                    }
                }
            }
        }
        joined.map_or(first, BytesMut::freeze)
    }

    /// The body ended: the last chunk, or a check of the length.
    fn finish(&mut self) {
        self.body = None;
        match self.outgoing {
            Outgoing::Chunked => self.tail = LAST_CHUNK,
            Outgoing::Length(n) if self.sent != n => {
                self.state = UploadState::ClientFailed(ExchangeError::UploadLength);
            }
            _ => {}
        }
        if self.is_sending() && !self.pending() {
            self.state = UploadState::Done;
        }
    }

    /// Writes what is pending; false when the socket is full (cx registered) or failed.
    fn write(&mut self, io: &TcpStream, cx: &mut Context<'_>) -> bool {
        loop {
            match io.poll_write_ready(cx) {
                Poll::Pending => return false,
                Poll::Ready(Err(_)) => {
                    self.state = UploadState::Dead;
                    return false;
                }
                Poll::Ready(Ok(())) => {}
            }
            let (line, len, off) = &self.size_line;
            let parts = [
                io::IoSlice::new(&line[usize::from(*off)..usize::from(*len)]),
                io::IoSlice::new(&self.data),
                io::IoSlice::new(self.tail),
            ];
            match io.try_write_vectored(&parts) {
                Ok(0) => {
                    self.state = UploadState::Dead;
                    return false;
                }
                Ok(n) => {
                    self.advance(n);
                    if !self.pending() {
                        if self.body.is_none() {
                            self.state = UploadState::Done;
                        }
                        return true;
                    }
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(_) => {
                    // The server stopped reading (it may have answered already).
                    self.state = UploadState::Dead;
                    return false;
                }
            }
        }
    }

    fn advance(&mut self, mut n: usize) {
        let line_left = usize::from(self.size_line.1 - self.size_line.2);
        let from_line = n.min(line_left);
        self.size_line.2 += from_line as u8;
        n -= from_line;
        let from_data = n.min(self.data.len());
        let _ = self.data.split_to(from_data);
        n -= from_data;
        self.tail = &self.tail[n.min(self.tail.len())..];
    }
}

/// A response body being read from its connection, with the rest of the request's upload if the
/// server answered before it ended. Implements [`Body`]; hand the connection back with
/// [`ResponseBody::take_reusable`] once it has ended.
#[derive(Debug)]
pub struct ResponseBody {
    conn: Option<ClientConn>,
    decoder: BodyDecoder,
    /// Bytes read but not yet taken: body, or (after the end) what the server sent unasked.
    buffered: Bytes,
    upload: Upload,
    keep_alive: bool,
    failed: bool,
}

impl ResponseBody {
    /// The connection, if the exchange ended cleanly and it may carry another request: the body
    /// read to its end with nothing after it, the upload done, and both sides persistent.
    pub fn take_reusable(&mut self) -> Option<ClientConn> {
        if self.decoder.is_done()
            && self.keep_alive
            && !self.failed
            && self.upload.is_done()
            && self.buffered.is_empty()
        {
            self.conn.take()
        } else {
            None
        }
    }

    /// After `101 Switching Protocols`: the socket and the bytes the server already sent past
    /// the head (the new protocol's).
    pub fn into_upgraded(mut self) -> Option<(TcpStream, Bytes)> {
        let conn = self.conn.take()?;
        Some((conn.io, std::mem::take(&mut self.buffered)))
    }

    /// Whether the request's upload was written whole.
    pub fn upload_done(&self) -> bool {
        self.upload.is_done()
    }
}

impl Body for ResponseBody {
    type Data = Bytes;
    type Error = ExchangeError;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, ExchangeError>>> {
        let this = self.get_mut();
        let Some(conn) = this.conn.as_ref() else {
            return Poll::Ready(if this.decoder.is_done() { None } else { Some(Err(ExchangeError::Closed)) });
        };
        if this.upload.is_sending() {
            this.upload.drive(&conn.io, cx);
            if let Some(e) = this.upload.take_client_error() {
                this.failed = true;
                return Poll::Ready(Some(Err(e)));
            }
        }
        let (decoder, buffered) = (&mut this.decoder, &mut this.buffered);
        match ready!(decoder.poll_data(buffered, cx, |cx| buf::poll_read(&conn.io, cx))) {
            None => Poll::Ready(None),
            Some(Ok(d)) => Poll::Ready(Some(Ok(Frame::data(d)))),
            Some(Err(e)) => {
                this.failed = true;
                Poll::Ready(Some(Err(match e {
                    PollError::Framing(e) => ExchangeError::Body(e),
                    PollError::Io(e) => ExchangeError::Io(e),
                })))
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.decoder.is_done()
    }

    fn size_hint(&self) -> SizeHint {
        match self.decoder.remaining() {
            Some(n) => SizeHint::with_exact(n),
            None => SizeHint::default(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http_body_util::{BodyExt, Empty, Full};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::TcpListener;

    /// A server that reads one request head (and `body` more bytes), then writes `reply`.
    async fn server(reply: &'static [u8], body: usize) -> (std::net::SocketAddr, tokio::task::JoinHandle<Vec<u8>>) {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let task = tokio::spawn(async move {
            let (mut s, _) = l.accept().await.expect("accept");
            let mut got = Vec::new();
            let mut buf = [0u8; 4096];
            loop {
                if let Some(i) = got.windows(4).position(|w| w == b"\r\n\r\n")
                    && got.len() >= i + 4 + body
                {
                    break;
                }
                let n = s.read(&mut buf).await.expect("read");
                if n == 0 {
                    break;
                }
                got.extend_from_slice(&buf[..n]);
            }
            s.write_all(reply).await.expect("write");
            // Keep the connection open a moment for reuse checks.
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            got
        });
        (addr, task)
    }

    async fn conn(addr: std::net::SocketAddr) -> ClientConn {
        ClientConn::new(TcpStream::connect(addr).await.expect("connect"))
    }

    #[tokio::test]
    async fn a_request_and_its_response_on_one_connection() {
        let (addr, srv) =
            server(b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nhello", 0).await;
        let c = conn(addr).await;
        let r = send(
            c,
            b"GET / HTTP/1.1\r\nhost: a\r\n\r\n",
            boxed(Empty::<Bytes>::new()),
            Outgoing::Empty,
            false,
            &Limits::default(),
        )
        .await
        .map_err(|_| "send")
        .expect("sent");
        assert_eq!(r.head.status(), 200);
        let mut body = r.body;
        let data = (&mut body).collect().await.expect("body").to_bytes();
        assert_eq!(&data[..], b"hello");
        assert!(body.take_reusable().is_some());
        assert_eq!(srv.await.expect("server"), b"GET / HTTP/1.1\r\nhost: a\r\n\r\n");
    }

    #[tokio::test]
    async fn a_chunked_upload_and_a_chunked_response() {
        let (addr, srv) =
            server(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n3\r\nabc\r\n0\r\n\r\n", 16).await;
        let body = boxed(Frames([Bytes::from_static(b"hello"), Bytes::from_static(b"!")].into()));
        let r = send(
            conn(addr).await,
            b"POST / HTTP/1.1\r\nhost: a\r\ntransfer-encoding: chunked\r\n\r\n",
            body,
            Outgoing::Chunked,
            false,
            &Limits::default(),
        )
        .await
        .map_err(|_| "send")
        .expect("sent");
        let mut body = r.body;
        assert_eq!(&(&mut body).collect().await.expect("body").to_bytes()[..], b"abc");
        assert!(body.take_reusable().is_some());
        let got = srv.await.expect("server");
        // The two frames were ready together: one chunk (issue 31, 26: small chunks coalesced).
        assert!(got.ends_with(b"\r\n\r\n6\r\nhello!\r\n0\r\n\r\n"), "{:?}", String::from_utf8_lossy(&got));
    }

    #[tokio::test]
    async fn a_response_cut_short_is_an_error_and_not_reused() {
        let (addr, _srv) = server(b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc", 0).await;
        let r = send(
            conn(addr).await,
            b"GET / HTTP/1.1\r\n\r\n",
            boxed(Full::new(Bytes::new())),
            Outgoing::Empty,
            false,
            &Limits::default(),
        )
        .await
        .map_err(|_| "send")
        .expect("sent");
        let mut body = r.body;
        let err = (&mut body).collect().await.expect_err("truncated");
        assert!(matches!(err, ExchangeError::Body(BodyError::Truncated)), "{err}");
        assert!(body.take_reusable().is_none());
    }

    #[tokio::test]
    async fn a_closed_idle_connection_is_not_usable() {
        let l = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = l.local_addr().expect("addr");
        let c = conn(addr).await;
        let (s, _) = l.accept().await.expect("accept");
        assert!(c.is_usable());
        drop(s);
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        assert!(!c.is_usable());
    }

    fn boxed<B>(b: B) -> RequestBody
    where
        B: Body<Data = Bytes> + Send + 'static,
        B::Error: Into<BoxError>,
    {
        b.map_err(Into::into).boxed_unsync()
    }

    /// A body of the given data frames, each polled separately.
    struct Frames(std::collections::VecDeque<Bytes>);

    impl Body for Frames {
        type Data = Bytes;
        type Error = std::convert::Infallible;
        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Self::Error>>> {
            Poll::Ready(self.0.pop_front().map(|b| Ok(Frame::data(b))))
        }
    }
}
