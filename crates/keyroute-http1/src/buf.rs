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

/// A value a runtime thread keeps between uses (a head's write buffer, a list, a string): taken
/// from the thread's spares ([`Spare::take`]) and given back, emptied, when dropped, so that
/// in steady state the request path allocates none. A pool keeps at most `kept` spares, none with
/// room for more than `max_room` items (a value grown by an unusual request is freed).
pub struct Pool<T: 'static> {
    spares: &'static std::thread::LocalKey<RefCell<Vec<T>>>,
    kept: usize,
    max_room: usize,
}

impl<T> Pool<T> {
    /// A pool over a thread-local list of spares.
    pub const fn new(spares: &'static std::thread::LocalKey<RefCell<Vec<T>>>, kept: usize, max_room: usize) -> Self {
        Pool { spares, kept, max_room }
    }
}

impl<T> std::fmt::Debug for Pool<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pool").field("kept", &self.kept).field("max_room", &self.max_room).finish()
    }
}

/// What a pooled value must say: how much room it has, and how to empty it for its next use.
pub trait Reuse: Default {
    /// Its room (capacity), in items.
    fn room(&self) -> usize;
    /// Empties it, keeping its room.
    fn empty(&mut self);
}

impl<T> Reuse for Vec<T> {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn empty(&mut self) {
        self.clear();
    }
}

impl Reuse for String {
    fn room(&self) -> usize {
        self.capacity()
    }
    fn empty(&mut self) {
        self.clear();
    }
}

/// A value from a [`Pool`], given back to the dropping thread's spares.
pub struct Spare<T: Reuse + 'static> {
    value: T,
    pool: &'static Pool<T>,
}

impl<T: Reuse> Spare<T> {
    /// A spare of the thread's, or a new value made by `new`.
    pub fn take(pool: &'static Pool<T>, new: impl FnOnce() -> T) -> Self {
        let kept = pool.spares.try_with(|s| s.try_borrow_mut().ok()?.pop()).ok().flatten();
        Spare { value: kept.unwrap_or_else(new), pool }
    }

    /// An empty value that takes a spare only when first written to ([`Spare::get_mut`]).
    pub fn later(pool: &'static Pool<T>) -> Self {
        Spare { value: T::default(), pool }
    }

    /// The value, taking a spare for it first if it has no room yet.
    pub fn get_mut(&mut self) -> &mut T {
        if self.value.room() == 0
            && let Some(kept) = self.pool.spares.try_with(|s| s.try_borrow_mut().ok()?.pop()).ok().flatten()
        {
            self.value = kept;
        }
        &mut self.value
    }
}

impl<T: Reuse + Clone> Clone for Spare<T> {
    /// A copy, given back to the same pool when dropped.
    fn clone(&self) -> Self {
        Spare { value: self.value.clone(), pool: self.pool }
    }
}

impl<T: Reuse + std::fmt::Debug> std::fmt::Debug for Spare<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.value.fmt(f)
    }
}

impl<T: Reuse> std::ops::Deref for Spare<T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.value
    }
}

impl<T: Reuse> std::ops::DerefMut for Spare<T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.value
    }
}

impl<T: Reuse> Drop for Spare<T> {
    fn drop(&mut self) {
        let mut v = std::mem::take(&mut self.value);
        if v.room() == 0 || v.room() > self.pool.max_room {
            return;
        }
        v.empty();
        // A thread being torn down keeps nothing.
        let _ = self.pool.spares.try_with(|s| {
            if let Ok(mut s) = s.try_borrow_mut()
                && s.len() < self.pool.kept
            {
                s.push(v);
            }
        });
    }
}

thread_local! {
    static HEAD_SPARES: RefCell<Vec<Vec<u8>>> = const { RefCell::new(Vec::new()) };
}

/// Heads' write buffers: a head is written out at once and its buffer given back (64 kept per
/// thread, none over 16 KiB).
pub static HEADS: Pool<Vec<u8>> = Pool::new(&HEAD_SPARES, 64, 16 * 1024);

/// A head's write buffer from [`HEADS`].
pub fn head_buffer() -> Spare<Vec<u8>> {
    Spare::take(&HEADS, || Vec::with_capacity(512))
}

#[cfg(test)]
mod spare_tests {
    use super::*;

    #[test]
    fn a_dropped_buffer_serves_the_next_head_and_a_grown_one_is_freed() {
        let mut a = head_buffer();
        a.extend_from_slice(b"HTTP/1.1 200 OK\r\n\r\n");
        let (ptr, cap) = (a.as_ptr(), a.capacity());
        drop(a);
        let b = head_buffer();
        assert!(b.is_empty(), "given back empty");
        assert_eq!((b.as_ptr(), b.capacity()), (ptr, cap), "the same buffer");
        drop(b);
        let mut big = head_buffer();
        big.reserve(64 * 1024);
        let big_ptr = big.as_ptr();
        drop(big);
        assert_ne!(head_buffer().as_ptr(), big_ptr, "a buffer past the limit is not kept");
    }
}
