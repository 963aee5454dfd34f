//! A connection to a cache server, used one exchange at a time: the one connection type of the
//! cache proxy. A client's side connections (the warm-up and fill routes), the active checks and
//! `keyroute move` each hold their own; a thread's shared connections ([`crate::pipe`]) start as
//! one too, greeted here, then shared.
//!
//! It owns the socket and what has been read of the server's answers and not yet taken; the
//! caller frames answers with its protocol's framing ([`ServerConn::frame`]).

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf as _, Bytes, BytesMut};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;

/// An answer that cannot be framed: the connection is out of step with its server.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Garbled;

/// Why an answer could not be read. Its text is what a client is told (`SERVER_ERROR server
/// timeout`, `-ERR keyroute: server connection lost`).
pub type Lost = &'static str;

/// The connection closed or failed.
pub const CONNECTION_LOST: Lost = "server connection lost";
/// No answer within the pool's time.
pub const TIMEOUT: Lost = "server timeout";
/// An answer the protocol cannot frame.
pub const GARBLED: Lost = "server answer garbled";

/// A connection to a server, one exchange at a time. See the [module documentation](self).
#[derive(Debug)]
pub struct ServerConn {
    addr: SocketAddr,
    stream: TcpStream,
    buf: BytesMut,
}

impl ServerConn {
    /// Connects to `addr` within `timeout` (`TCP_NODELAY`: a request goes out as it is written).
    ///
    /// # Errors
    ///
    /// The connection was refused or failed, or did not complete in time (`TimedOut`).
    pub async fn open(addr: SocketAddr, timeout: Duration) -> std::io::Result<ServerConn> {
        let stream = match tokio::time::timeout(timeout, TcpStream::connect(addr)).await {
            Ok(s) => s?,
            Err(_) => return Err(std::io::ErrorKind::TimedOut.into()),
        };
        let _ = stream.set_nodelay(true);
        Ok(ServerConn { addr, stream, buf: BytesMut::new() })
    }

    /// Sends `greeting` (Redis's `AUTH`, or `HELLO 3`) and reads its whole answer (`whole` says
    /// when it is), at most 64 KiB.
    ///
    /// # Errors
    ///
    /// The connection failed or closed first.
    pub async fn greet(&mut self, greeting: &[u8], whole: impl Fn(&[u8]) -> bool) -> std::io::Result<Bytes> {
        self.stream.write_all(greeting).await?;
        while !whole(&self.buf) && self.buf.len() < 64 * 1024 {
            if self.fill().await? == 0 {
                break;
            }
        }
        Ok(self.buf.split().freeze())
    }

    /// [`ServerConn::greet`] within `limit`, its answer judged by `greeted` (`None` while it
    /// has not all come, else whether the server accepted the greeting).
    ///
    /// # Errors
    ///
    /// [`CONNECTION_LOST`]: the connection failed, the time ran out, or the server refused.
    pub async fn greet_within(
        &mut self,
        greeting: &[u8],
        greeted: fn(&[u8], &[u8]) -> Option<bool>,
        limit: std::time::Duration,
    ) -> Result<(), Lost> {
        let answer = tokio::time::timeout(limit, self.greet(greeting, |a| greeted(greeting, a).is_some()))
            .await
            .map_err(|_| CONNECTION_LOST)?
            .map_err(|_| CONNECTION_LOST)?;
        match greeted(greeting, &answer) {
            Some(true) => Ok(()),
            _ => Err(CONNECTION_LOST),
        }
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// What has been read and not yet taken.
    pub fn buffered(&self) -> &[u8] {
        &self.buf
    }

    /// Drops the first `n` bytes read (an answer taken).
    pub fn consume(&mut self, n: usize) {
        self.buf.advance(n);
    }

    /// Takes the first `n` bytes read.
    pub fn take(&mut self, n: usize) -> Bytes {
        self.buf.split_to(n).freeze()
    }

    /// Writes all of `out`.
    ///
    /// # Errors
    ///
    /// The socket's.
    pub async fn write(&mut self, out: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(out).await
    }

    /// Reads more of the server's answers: the bytes read, 0 when it closed the connection.
    ///
    /// # Errors
    ///
    /// The socket's.
    pub async fn fill(&mut self) -> std::io::Result<usize> {
        self.buf.reserve(16 * 1024);
        self.stream.read_buf(&mut self.buf).await
    }

    /// Reads until `frame` finds a whole answer at the start of what was read: its length.
    ///
    /// # Errors
    ///
    /// [`GARBLED`] for an answer `frame` refuses, [`CONNECTION_LOST`] when the connection closed
    /// or failed first.
    pub async fn frame(&mut self, frame: impl Fn(&[u8]) -> Result<Option<usize>, Garbled>) -> Result<usize, Lost> {
        loop {
            if let Some(n) = frame(&self.buf).map_err(|_| GARBLED)? {
                return Ok(n);
            }
            match self.fill().await {
                Ok(0) | Err(_) => return Err(CONNECTION_LOST),
                Ok(_) => {}
            }
        }
    }

    /// Whether an idle connection was closed by its server (or has bytes nobody asked for): see
    /// [`peer_closed`]. Nothing read may be waiting to be taken.
    pub fn closed(&self) -> bool {
        !self.buf.is_empty() || peer_closed(&self.stream)
    }

    /// The socket, for sharing ([`crate::pipe::Pipe::new`]), once nothing read is left.
    pub fn into_stream(self) -> TcpStream {
        self.stream
    }
}

/// Whether a connection that owes nothing has been closed by its peer (or has bytes nobody
/// asked for): a look at the socket without taking anything from it, and without a system call
/// unless the poller saw it readable.
pub(crate) fn peer_closed(stream: &TcpStream) -> bool {
    let mut byte = [std::mem::MaybeUninit::uninit(); 1];
    let mut buf = tokio::io::ReadBuf::uninit(&mut byte);
    let mut cx = std::task::Context::from_waker(std::task::Waker::noop());
    matches!(stream.poll_peek(&mut cx, &mut buf), std::task::Poll::Ready(_))
}

/// Reads what `io` has into `buf`'s spare room, without waiting. A read that returned less than
/// it had room for drained the socket, so the readiness the poller had reported *before* it is
/// forgotten, and the next wait starts on the poller rather than with a read that finds nothing.
/// Readiness raised by bytes that arrived after the read is a later event, and is kept: clearing
/// it (a clear after the read) would lose those bytes' wakeup, and the next wait would sleep on
/// data already there. (The HTTP engine reads its sockets the same way.)
///
/// # Errors
///
/// The socket's error; `WouldBlock` when nothing is there.
pub(crate) fn read_draining(io: &TcpStream, buf: &mut BytesMut) -> std::io::Result<usize> {
    let spare = buf.capacity() - buf.len();
    let mut drained = None;
    let result = io.try_io(tokio::io::Interest::READABLE, || {
        let n = io.try_read_buf(buf)?;
        if n > 0 && n < spare {
            drained = Some(n);
            return Err(std::io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (result, drained) {
        (_, Some(n)) => Ok(n),
        (result, None) => result,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers are framed across reads; a refused answer and a closed connection say so.
    #[tokio::test]
    async fn answers_are_framed_across_reads() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let server = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut line = [0u8; 64];
            let _ = s.read(&mut line).await;
            s.write_all(b"+O").await.expect("write");
            tokio::time::sleep(Duration::from_millis(20)).await;
            s.write_all(b"K\r\n!bad\r\n").await.expect("write");
        });
        let mut c = ServerConn::open(addr, Duration::from_secs(2)).await.expect("open");
        c.write(b"PING\r\n").await.expect("write");
        let line = |b: &[u8]| -> Result<Option<usize>, Garbled> {
            match b.first() {
                Some(b'!') => Err(Garbled),
                _ => Ok(b.windows(2).position(|w| w == b"\r\n").map(|i| i + 2)),
            }
        };
        let n = c.frame(line).await.expect("an answer");
        assert_eq!(&c.take(n)[..], b"+OK\r\n");
        assert_eq!(c.frame(line).await, Err(GARBLED));
        c.consume(c.buffered().len());
        server.await.expect("server");
        assert_eq!(c.frame(line).await, Err(CONNECTION_LOST));
    }
}
