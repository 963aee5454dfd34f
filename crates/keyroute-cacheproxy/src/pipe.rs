//! Server connections shared by the cache listeners' client connections of one thread
//! (nutcracker's model): one connection per server, greeting and thread, that carries every
//! client's requests, so that the requests of many clients reach a server in one write and their
//! answers come back in one read.
//!
//! # How answers find their client
//!
//! A server answers in the order it was asked. A client connection submits the requests of its
//! batch for a server at once and gets a *ticket*: its place in that order. It reads its answers
//! only when its turn comes (the tickets before it have read theirs), from the connection's one
//! read buffer, with its own framing (its protocol's), then passes the turn on. One writer task
//! per connection writes whatever was submitted since its last write, in one `write`.
//!
//! A client submits to all its servers in one critical section ([`Registry::submit`]), so that
//! the tickets of any two clients are in the same order on every connection they share: neither
//! can hold a turn the other waits for while waiting for one the other holds.
//!
//! A connection that fails (a read or write error, a timeout, a client gone in the middle of its
//! turn) is *poisoned*: every ticket waiting on it fails at once (the clients answer errors, as
//! they did when each had its own connection), and the next batch opens a new one.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::BytesMut;
use parking_lot::Mutex;
use tokio::net::TcpStream;
use tokio::sync::{Notify, OwnedMutexGuard};

/// A shared connection's identity: its server, and the greeting it was opened with (Redis's AUTH
/// or HELLO 3: clients that speak RESP3 share other connections than those that speak RESP2).
type PipeKey = (SocketAddr, Option<Arc<[u8]>>);

/// The shared connections of one thread.
#[derive(Default)]
pub(crate) struct Registry {
    pipes: Mutex<HashMap<PipeKey, Arc<Pipe>>>,
    /// Held while a client submits a batch to each of its servers: the tickets' order is then
    /// the same on every connection.
    pub(crate) submit: Mutex<()>,
}

thread_local! {
    static REGISTRY: Arc<Registry> = Arc::new(Registry::default());
}

impl Registry {
    /// This thread's registry (a client connection keeps the one it started on).
    pub(crate) fn current() -> Arc<Registry> {
        REGISTRY.with(Arc::clone)
    }

    /// The live shared connection to `addr` with `greeting`, if there is one.
    pub(crate) fn get(&self, addr: SocketAddr, greeting: &Option<Arc<[u8]>>) -> Option<Arc<Pipe>> {
        let pipes = self.pipes.lock();
        pipes.get(&(addr, greeting.clone())).filter(|p| !p.closed_while_idle()).cloned()
    }

    /// Keeps `pipe` as the shared connection to its server (replacing a broken one).
    pub(crate) fn put(&self, greeting: Option<Arc<[u8]>>, pipe: &Arc<Pipe>) {
        let mut pipes = self.pipes.lock();
        pipes.retain(|_, p| !p.is_broken());
        pipes.insert((pipe.addr, greeting), Arc::clone(pipe));
    }
}

/// The read side, held by the client whose turn it is: what has been read and not yet taken.
pub(crate) struct Reader {
    pub(crate) buf: BytesMut,
}

/// A server connection shared by a thread's clients.
pub(crate) struct Pipe {
    pub(crate) addr: SocketAddr,
    /// Read by the client whose turn it is, written by the writer task.
    stream: Arc<TcpStream>,
    inner: Arc<Inner>,
    reader: Arc<tokio::sync::Mutex<Reader>>,
}

struct Inner {
    state: Mutex<State>,
    /// Wakes the writer.
    wake: Notify,
}

impl Inner {
    /// The connection is broken (`st` is its state, locked): nothing more is written, and every
    /// ticket waiting for its turn is woken to find it so.
    fn break_off(&self, mut st: parking_lot::MutexGuard<'_, State>) {
        st.broken = true;
        let waiters = std::mem::take(&mut st.waiters);
        st.out = Vec::new();
        drop(st);
        waiters.into_values().for_each(Waker::wake);
        self.wake.notify_one();
    }
}

#[derive(Default)]
struct State {
    /// Submitted, not yet written.
    out: Vec<u8>,
    /// The next ticket given.
    next: u64,
    /// The ticket whose turn it is to read.
    serving: u64,
    /// Tickets waiting for their turn, and how to wake each (no allocation per wait: the map
    /// keeps its room, and a task's waker is a count on the task).
    waiters: HashMap<u64, Waker>,
    broken: bool,
}

/// The connection failed: nothing more is read from or written to it.
#[derive(Debug)]
pub(crate) struct Lost;

impl Pipe {
    /// Shares `stream` (connected, greeted): its writer task starts on the current runtime, and
    /// each write it makes must complete within `timeout`.
    pub(crate) fn new(addr: SocketAddr, stream: TcpStream, timeout: Duration) -> Arc<Pipe> {
        let stream = Arc::new(stream);
        let inner = Arc::new(Inner { state: Mutex::new(State::default()), wake: Notify::new() });
        tokio::spawn(writer(Arc::clone(&inner), Arc::clone(&stream), timeout));
        Arc::new(Pipe {
            addr,
            stream,
            inner,
            reader: Arc::new(tokio::sync::Mutex::new(Reader { buf: BytesMut::new() })),
        })
    }

    /// Reads what the server sent into `buf` (the turn holder's), waiting for it; the bytes read
    /// (0 at the end of the stream).
    pub(crate) async fn read(&self, buf: &mut BytesMut) -> std::io::Result<usize> {
        buf.reserve(16 * 1024);
        loop {
            match crate::conn::read_draining(&self.stream, buf) {
                Ok(n) => return Ok(n),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => self.stream.readable().await?,
                Err(e) => return Err(e),
            }
        }
    }

    pub(crate) fn is_broken(&self) -> bool {
        self.inner.state.lock().broken
    }

    /// Whether the connection is broken, or found closed by its server while nothing is asked
    /// of it (a `timeout` on an idle connection, a `CLIENT KILL`, a restart): it is then poisoned,
    /// so that the next batch opens a new one instead of failing its first command on it. Nothing
    /// is written to a connection found so, so a command that finds it is never sent twice.
    ///
    /// Costs no system call unless the socket is readable: an idle connection has no answer to
    /// give, so readable means its end (or bytes nobody asked for, which put it out of step).
    pub(crate) fn closed_while_idle(&self) -> bool {
        let st = self.inner.state.lock();
        if st.broken {
            return true;
        }
        // The lock is held across the look: no request can be submitted meanwhile, so any byte
        // seen is not an answer to one.
        if st.next != st.serving || !st.out.is_empty() {
            return false;
        }
        if !crate::conn::peer_closed(&self.stream) {
            return false;
        }
        self.inner.break_off(st);
        tracing::debug!(server = %self.addr, "a shared server connection was found closed while idle; it is reopened");
        true
    }

    /// Queues `bytes` for the server; the ticket whose turn reads their answers (`None`: the
    /// connection is broken). Call with the registry's submit lock held.
    pub(crate) fn submit(&self, bytes: &[u8]) -> Option<u64> {
        let mut st = self.inner.state.lock();
        if st.broken {
            return None;
        }
        st.out.extend_from_slice(bytes);
        let ticket = st.next;
        st.next += 1;
        drop(st);
        self.inner.wake.notify_one();
        Some(ticket)
    }

    /// Waits for `ticket`'s turn, and takes the read side.
    pub(crate) async fn turn(&self, ticket: u64) -> Result<OwnedMutexGuard<Reader>, Lost> {
        std::future::poll_fn(|cx| {
            let mut st = self.inner.state.lock();
            if st.broken {
                return Poll::Ready(Err(Lost));
            }
            if st.serving == ticket {
                st.waiters.remove(&ticket);
                return Poll::Ready(Ok(()));
            }
            match st.waiters.get_mut(&ticket) {
                Some(w) => w.clone_from(cx.waker()),
                None => {
                    st.waiters.insert(ticket, cx.waker().clone());
                }
            }
            Poll::Pending
        })
        .await?;
        let reader = Arc::clone(&self.reader).lock_owned().await;
        if self.is_broken() {
            return Err(Lost);
        }
        Ok(reader)
    }

    /// `ticket` read all its answers: the next one's turn.
    pub(crate) fn pass(&self, ticket: u64) {
        let mut st = self.inner.state.lock();
        st.serving = ticket + 1;
        let next = st.waiters.remove(&(ticket + 1));
        drop(st);
        if let Some(w) = next {
            w.wake();
        }
    }

    /// The connection is out of step or gone: every waiting ticket fails, and the writer stops.
    pub(crate) fn poison(&self) {
        self.inner.break_off(self.inner.state.lock());
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.poison();
    }
}

/// Writes all of `buf`, trying at once and waiting for the socket only when it is full.
async fn write_all(stream: &TcpStream, mut buf: &[u8]) -> std::io::Result<()> {
    while !buf.is_empty() {
        match stream.try_write(buf) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => buf = &buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => stream.writable().await?,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Writes whatever was submitted since the last write, in one write, until the connection breaks.
async fn writer(inner: Arc<Inner>, stream: Arc<TcpStream>, timeout: Duration) {
    let mut spare = Vec::new();
    loop {
        let mut batch = {
            let mut st = inner.state.lock();
            if st.broken {
                return;
            }
            std::mem::replace(&mut st.out, std::mem::take(&mut spare))
        };
        if batch.is_empty() {
            spare = batch;
            inner.wake.notified().await;
            continue;
        }
        if !matches!(tokio::time::timeout(timeout, write_all(&stream, &batch)).await, Ok(Ok(()))) {
            inner.break_off(inner.state.lock());
            return;
        }
        batch.clear();
        spare = batch;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    /// Three clients submit in turn; each reads exactly its own answers, in ticket order,
    /// whatever order they ask for their turn in; a poisoned connection fails every waiter.
    #[tokio::test]
    async fn turns_follow_tickets_and_poison_fails_the_waiters() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let echo = tokio::spawn(async move {
            let (mut s, _) = listener.accept().await.expect("accept");
            let mut buf = [0u8; 1024];
            loop {
                match s.read(&mut buf).await {
                    Ok(0) | Err(_) => return,
                    Ok(n) => s.write_all(&buf[..n]).await.expect("echo"),
                }
            }
        });
        let stream = TcpStream::connect(addr).await.expect("connect");
        let pipe = Pipe::new(addr, stream, Duration::from_secs(5));
        let tickets: Vec<u64> =
            ["a\n", "bb\n", "ccc\n"].iter().map(|m| pipe.submit(m.as_bytes()).expect("ticket")).collect();
        assert_eq!(tickets, [0, 1, 2]);
        let read = |pipe: Arc<Pipe>, ticket: u64, len: usize| async move {
            let mut r = pipe.turn(ticket).await.expect("turn");
            while r.buf.len() < len {
                pipe.read(&mut r.buf).await.expect("read");
            }
            let got = r.buf.split_to(len);
            drop(r);
            pipe.pass(ticket);
            got
        };
        // The last one asks first: it waits for the others.
        let third = tokio::spawn(read(Arc::clone(&pipe), 2, 4));
        let second = tokio::spawn(read(Arc::clone(&pipe), 1, 3));
        assert_eq!(&read(Arc::clone(&pipe), 0, 2).await[..], b"a\n");
        assert_eq!(&second.await.expect("join")[..], b"bb\n");
        assert_eq!(&third.await.expect("join")[..], b"ccc\n");
        let t = pipe.submit(b"d\n").expect("ticket");
        let late = pipe.submit(b"e\n").expect("ticket");
        let waiting = tokio::spawn({
            let pipe = Arc::clone(&pipe);
            async move { pipe.turn(late).await.map(|_| ()) }
        });
        tokio::task::yield_now().await;
        pipe.poison();
        assert!(waiting.await.expect("join").is_err(), "a waiter fails when the connection is poisoned");
        assert!(pipe.turn(t).await.is_err());
        assert!(pipe.submit(b"f\n").is_none());
        echo.abort();
    }
}
