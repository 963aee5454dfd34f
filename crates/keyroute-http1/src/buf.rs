//! The runtime thread's read buffer: every connection of a thread reads into it, so that a
//! connection owns no buffer while it waits.
//!
//! A read appends to the thread's [`BytesMut`] and the bytes read are split off at once as a
//! [`Bytes`]: a slice of the same allocation, which the message that holds it keeps alive. The
//! thread's buffer is therefore always empty between reads and only its spare capacity is reused;
//! when that runs low a new 64 KiB block is allocated, and an old one is freed when the last
//! message that points into it is dropped (the head of a request in flight, a body chunk being
//! written). A connection between requests holds nothing of it.
//!
//! Readiness: tokio keeps a socket marked readable until a read fails with `WouldBlock`, which
//! costs a read syscall that finds nothing after every message that arrived whole. A read that
//! returns less than it asked for has drained the socket, so the mark is cleared then, without
//! a syscall ([`TcpStream::try_io`] with `WouldBlock`; tokio clears it only if no new readiness
//! event came in between).

use std::cell::RefCell;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncRead, Interest, ReadBuf};
use tokio::net::TcpStream;

/// The size of a new block of the thread's buffer.
pub const BLOCK: usize = 64 * 1024;

/// Below this much spare capacity, the next read gets a new block (so that one read can take a
/// whole ordinary response or request at once).
const MIN_SPARE: usize = 16 * 1024;

thread_local! {
    static READ: RefCell<BytesMut> = RefCell::new(BytesMut::new());
}

/// Reads what `io` has into the thread's buffer, without waiting: `Ok(None)` when nothing is
/// there, `Ok(Some(bytes))` with the bytes read (empty at the end of the stream).
///
/// # Errors
///
/// The socket's error.
pub fn try_read(io: &TcpStream) -> io::Result<Option<Bytes>> {
    READ.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.capacity() - buf.len() < MIN_SPARE {
            buf.reserve(BLOCK);
        }
        match read_draining(io, &mut buf) {
            Ok(n) => Ok(Some(buf.split_to(n).freeze())),
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(None),
            Err(e) => Err(e),
        }
    })
}

/// Reads what `io` has into `buf`'s spare room, without waiting. A read that returned less than
/// it had room for drained the socket, so the readiness the poller had reported *before* it is
/// forgotten, and the next wait starts on the poller rather than with a read that finds nothing.
/// Readiness raised by bytes that arrived after the read is a later event, and is kept: clearing
/// it (a clear after the read) would lose those bytes' wakeup, and the next wait would sleep on
/// data already there.
///
/// # Errors
///
/// The socket's error; `WouldBlock` when nothing is there.
pub fn read_draining(io: &TcpStream, buf: &mut BytesMut) -> io::Result<usize> {
    let spare = buf.capacity() - buf.len();
    let mut drained = None;
    // `try_io` forgets the readiness it saw before the closure ran when the closure says
    // `WouldBlock`: a short read says so, keeping what it read aside.
    let result = io.try_io(Interest::READABLE, || {
        let n = io.try_read_buf(buf)?;
        if n > 0 && n < spare {
            drained = Some(n);
            return Err(io::ErrorKind::WouldBlock.into());
        }
        Ok(n)
    });
    match (result, drained) {
        (_, Some(n)) => Ok(n),
        (result, None) => result,
    }
}

/// Waits until `io` is readable, then reads what it has (see [`try_read`]); empty at the end of
/// the stream.
///
/// # Errors
///
/// The socket's error.
pub fn poll_read(io: &TcpStream, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
    loop {
        ready!(io.poll_read_ready(cx))?;
        if let Some(bytes) = try_read(io)? {
            return Poll::Ready(Ok(bytes));
        }
    }
}

/// Reads what any transport has into the thread's buffer (a TLS stream, which decrypts into it);
/// empty at the end of the stream.
///
/// # Errors
///
/// The transport's error.
pub fn poll_read_into<S: AsyncRead + ?Sized>(io: Pin<&mut S>, cx: &mut Context<'_>) -> Poll<io::Result<Bytes>> {
    READ.with(|cell| {
        let mut buf = cell.borrow_mut();
        if buf.capacity() - buf.len() < MIN_SPARE {
            buf.reserve(BLOCK);
        }
        let mut rb = ReadBuf::uninit(buf.spare_capacity_mut());
        ready!(io.poll_read(cx, &mut rb))?;
        let n = rb.filled().len();
        // SAFETY: `poll_read` initialised the first `n` bytes of the spare capacity (a
        // `ReadBuf`'s filled part is always initialised), and the buffer was empty before.
        let len = buf.len() + n;
        unsafe { buf.set_len(len) };
        Poll::Ready(Ok(buf.split_to(n).freeze()))
    })
}

/// Writes all of `buf`, trying at once and waiting for writability only when the socket is full.
///
/// # Errors
///
/// The socket's error; `WriteZero` if it takes nothing.
pub async fn write_all(io: &TcpStream, mut buf: &[u8]) -> io::Result<()> {
    while !buf.is_empty() {
        match io.try_write(buf) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => io.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
