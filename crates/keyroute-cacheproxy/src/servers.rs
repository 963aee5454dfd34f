//! A client connection's ways to its pool's servers: the thread's shared connections (see
//! [`crate::pipe`]) for its batches, and side connections of its own ([`ServerConn`]) for the
//! exchanges made one at a time outside them (the warm-up and fill routes). The requests of a
//! batch are gathered per server and submitted at once ([`flush`]); its answers are read server
//! by server ([`read_all`]).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use keyroute_fleet::pool::{Snapshot, WorkerState};
use tokio::time::Instant;

use crate::conn::{CONNECTION_LOST, Garbled, Lost, ServerConn, TIMEOUT};
use crate::pipe::{Pipe, Reader, Registry};

/// A client connection's way to one server, with the requests of the batch being made for it.
pub(crate) struct Server {
    pub(crate) addr: SocketAddr,
    link: Link,
    /// The requests gathered for it in this batch.
    pub(crate) out: Vec<u8>,
    /// It failed in this batch: its later answers are not waited for, and it is dropped after.
    pub(crate) broken: bool,
}

enum Link {
    /// A connection of this client's own (the side connections, used one exchange at a time).
    /// Boxed: most clients only ever hold shared links, and every server entry is as large as
    /// the largest link.
    Own(Box<ServerConn>),
    /// The thread's shared connection: the ticket of this batch's requests, and the read side
    /// while it is this client's turn.
    Shared { pipe: Arc<Pipe>, ticket: Option<u64>, turn: Option<tokio::sync::OwnedMutexGuard<Reader>> },
}

impl Server {
    /// What has been read of the server's answers and not yet consumed (on a shared connection,
    /// only during this client's turn: see [`Server::begin`]).
    pub(crate) fn buffered(&self) -> &[u8] {
        match &self.link {
            Link::Own(conn) => conn.buffered(),
            Link::Shared { turn: Some(r), .. } => &r.buf,
            Link::Shared { .. } => &[],
        }
    }

    /// Drops the first `n` bytes read (an answer taken).
    pub(crate) fn consume(&mut self, n: usize) {
        match &mut self.link {
            Link::Own(conn) => conn.consume(n),
            Link::Shared { turn: Some(r), .. } => bytes::Buf::advance(&mut r.buf, n),
            Link::Shared { .. } => {}
        }
    }

    /// On a shared connection, waits for this batch's turn to read.
    async fn begin(&mut self) -> Result<(), Lost> {
        if let Link::Shared { pipe, ticket, turn } = &mut self.link
            && turn.is_none()
        {
            let t = ticket.ok_or(CONNECTION_LOST)?;
            *turn = Some(pipe.turn(t).await.map_err(|_| CONNECTION_LOST)?);
        }
        Ok(())
    }

    /// Reads more of the server's answers.
    async fn fill(&mut self) -> Result<(), Lost> {
        let read = match &mut self.link {
            Link::Own(conn) => conn.fill().await,
            Link::Shared { pipe, turn: Some(r), .. } => pipe.read(&mut r.buf).await,
            Link::Shared { .. } => return Err(CONNECTION_LOST),
        };
        match read {
            Ok(0) | Err(_) => Err(CONNECTION_LOST),
            Ok(_) => Ok(()),
        }
    }

    /// The server failed in this batch: on a shared connection, every client waiting on it fails
    /// too (the connection is out of step).
    fn fail(&mut self) {
        self.broken = true;
        if let Link::Shared { pipe, ticket, turn } = &mut self.link {
            pipe.poison();
            *ticket = None;
            *turn = None;
        }
    }

    /// This batch's answers on this server are read: the turn passes to the next client. A
    /// ticket whose answers were never read leaves the connection out of step, so it is poisoned
    /// instead.
    pub(crate) fn release(&mut self) {
        if let Link::Shared { pipe, ticket, turn } = &mut self.link
            && let Some(t) = ticket.take()
        {
            if turn.take().is_some() {
                pipe.pass(t);
            } else {
                pipe.poison();
            }
        }
    }

    /// Writes the requests gathered now, on a connection of this client's own (the side
    /// connections); `false` when it failed.
    pub(crate) async fn send_now(&mut self, timeout: Duration) -> bool {
        let Link::Own(conn) = &mut self.link else { return false };
        let ok = matches!(tokio::time::timeout(timeout, conn.write(&self.out)).await, Ok(Ok(())));
        self.out.clear();
        if !ok {
            self.broken = true;
        }
        ok
    }

    /// Whether this connection cannot take the batch's requests: it failed, or (between
    /// batches) its server closed it, in which case a new one is opened and the request is
    /// never lost to a connection that was already gone (issue 31).
    fn dead(&self) -> bool {
        self.broken
            || match &self.link {
                Link::Shared { pipe, ticket: None, .. } => pipe.closed_while_idle(),
                Link::Shared { pipe, .. } => pipe.is_broken(),
                Link::Own(conn) => self.out.is_empty() && conn.closed(),
            }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // A client gone in the middle of its turn (its task cancelled) leaves the rest of its
        // answers unread.
        if let Link::Shared { pipe, ticket: Some(_), .. } = &self.link {
            pipe.poison();
        }
    }
}

/// A client connection's servers: few (a pool's), so found by a scan. With a registry, they are
/// the thread's shared connections; without, connections of the client's own.
#[derive(Default)]
pub(crate) struct Servers(pub(crate) Vec<Server>, Option<Arc<Registry>>);

impl Servers {
    /// Servers reached over the thread's shared connections.
    pub(crate) fn shared() -> Servers {
        Servers(Vec::new(), Some(Registry::current()))
    }

    fn find(&self, addr: SocketAddr) -> Option<usize> {
        self.0.iter().position(|s| s.addr == addr)
    }

    /// Ends the batch: each turn passes on, and the servers that failed are dropped.
    pub(crate) fn sweep(&mut self) {
        for s in &mut self.0 {
            s.release();
        }
        self.0.retain(|s| !s.broken);
    }

    /// Sets the link to `addr` at `at` (or a new one): its index.
    fn put(&mut self, at: Option<usize>, addr: SocketAddr, link: Link) -> usize {
        let mut server = Server { addr, link, out: Vec::new(), broken: false };
        match at {
            Some(i) => {
                // What the batch gathered for the dead link and has not submitted goes on the new
                // one: its commands' answers are read from this index.
                server.out = std::mem::take(&mut self.0[i].out);
                self.0[i] = server;
                i
            }
            None => {
                // One entry at a time: a client that only ever talks to one server (most, for a
                // while) holds room for one, not for four.
                self.0.reserve_exact(1);
                self.0.push(server);
                self.0.len() - 1
            }
        }
    }

    /// Gives the batch buffers of an idle client back to the thread.
    pub(crate) fn idle(&mut self) {
        for s in &mut self.0 {
            crate::stash::give(&mut s.out);
        }
    }

    /// This client's connection to `w` (its index), made now if needed (within `connect`, and
    /// greeted with `greeting`, whose whole answer `whole` tells). `None` when it cannot be
    /// made: the caller counts the failure.
    pub(crate) async fn connect(&mut self, w: &WorkerState, greeting: &Greeting, connect: Duration) -> Option<usize> {
        let at = self.find(w.address);
        if let Some(i) = at {
            if self.0[i].broken {
                return None;
            }
            if !self.0[i].dead() {
                return Some(i);
            }
            // The shared connection failed in another client's batch: this one takes the new one
            // (in place: the batch's commands name their server by its index).
        }
        let shared = self.1.as_ref().and_then(|r| r.get(w.address, &greeting.bytes));
        if let Some(pipe) = shared {
            return Some(self.put(at, w.address, Link::Shared { pipe, ticket: None, turn: None }));
        }
        let open = async {
            let mut conn = ServerConn::open(w.address, connect).await?;
            if let Some(bytes) = &greeting.bytes {
                // Redis's AUTH, HELLO, READONLY: a reply each, a status or (HELLO's) a map.
                let answer = conn.greet(bytes, |a| (greeting.greeted)(bytes, a).is_some()).await?;
                if (greeting.greeted)(bytes, &answer) != Some(true) {
                    // The refusal: the first error line (or the first line).
                    let mut lines = answer.split(|&b| b == b'\n');
                    let why = lines.clone().find(|l| l.starts_with(b"-")).or_else(|| lines.next()).unwrap_or_default();
                    tracing::warn!(server = %w.address, answer = %String::from_utf8_lossy(why).trim_end(), "the server refused the proxy's greeting (AUTH, HELLO or READONLY)");
                    return Err(std::io::Error::other("refused the proxy's greeting"));
                }
            }
            Ok::<ServerConn, std::io::Error>(conn)
        };
        let conn = tokio::time::timeout(connect, open).await.ok()?.ok()?;
        let link = match &self.1 {
            Some(registry) => {
                // Another client may have opened one meanwhile: one connection per server.
                let pipe = registry.get(w.address, &greeting.bytes).unwrap_or_else(|| {
                    let pipe = Pipe::new(w.address, conn.into_stream(), greeting.write_timeout);
                    registry.put(greeting.bytes.clone(), &pipe);
                    pipe
                });
                Link::Shared { pipe, ticket: None, turn: None }
            }
            None => Link::Own(Box::new(conn)),
        };
        Some(self.put(at, w.address, link))
    }
}

/// What a new server connection is sent first, and how its answer is framed.
#[derive(Clone)]
pub(crate) struct Greeting {
    /// Redis's `AUTH`, `HELLO 3`, `READONLY`, whose answers must be statuses (`+OK`) or a map
    /// (`HELLO`'s).
    pub(crate) bytes: Option<Arc<[u8]>>,
    /// The answer to the greeting: `None` while it has not all come, else whether it accepted.
    pub(crate) greeted: fn(&[u8], &[u8]) -> Option<bool>,
    /// Each write on a shared connection must complete within this.
    pub(crate) write_timeout: Duration,
}

/// Sends each server's requests of the batch. On shared connections they are submitted together
/// (one ticket per server, in the same order on every connection) and written by each
/// connection's writer with other clients' requests; on the client's own, written now. A server
/// that cannot take them is broken.
pub(crate) async fn flush(servers: &mut Servers, timeout: Duration) {
    if let Some(registry) = &servers.1 {
        let _order = registry.submit.lock();
        for server in &mut servers.0 {
            if let Link::Shared { pipe, ticket, .. } = &mut server.link
                && !server.out.is_empty()
            {
                match pipe.submit(&server.out) {
                    Some(t) => *ticket = Some(t),
                    None => server.broken = true,
                }
                server.out.clear();
            }
        }
    }
    for server in &mut servers.0 {
        if !server.out.is_empty() && matches!(server.link, Link::Own(_)) {
            server.send_now(timeout).await;
        }
    }
}

/// Reads until `frame` finds a whole answer at the start of the server's buffer; its length.
pub(crate) async fn frame(
    server: &mut Server,
    frame: &impl Fn(&[u8]) -> Result<Option<usize>, Garbled>,
) -> Result<usize, Lost> {
    server.begin().await?;
    loop {
        if let Some(n) = frame(server.buffered()).map_err(|_| crate::conn::GARBLED)? {
            return Ok(n);
        }
        server.fill().await?;
    }
}

/// Runs `read` (which appends one answer to `out`) within `timeout`. A server that failed in this
/// batch gives none: it is marked broken, its later answers are not waited for, and its connection
/// is dropped at the batch's end.
pub(crate) async fn answer_into(
    server: &mut Server,
    timeout: Duration,
    out: &mut Vec<u8>,
    read: impl AsyncFnOnce(&mut Server, &mut Vec<u8>) -> Result<(), Lost>,
) -> Result<(), Lost> {
    if server.broken {
        return Err(CONNECTION_LOST);
    }
    let result = tokio::time::timeout(timeout, read(server, out)).await.unwrap_or(Err(TIMEOUT));
    if result.is_err() {
        server.fail();
    }
    result
}

/// An answer read in the first pass of a batch's answers: where it is in the batch's arena, or
/// why the server gave none.
pub(crate) type Slot = Result<std::ops::Range<usize>, Lost>;

/// One answer a command of the batch reads: its server (an index into the client's), the node
/// whose stall clock runs while it is awaited (none for an answer only dropped), and how the
/// protocol frames it.
pub(crate) struct Read<F> {
    pub(crate) server: usize,
    pub(crate) node: Option<usize>,
    pub(crate) how: F,
}

/// How a protocol reads one answer of a server: appended to `out`.
pub(crate) trait Framing {
    fn read<'a>(
        &'a self,
        server: &'a mut Server,
        timeout: Duration,
        out: &'a mut Vec<u8>,
    ) -> impl Future<Output = Result<(), Lost>> + Send + 'a;
}

/// Reads every answer of a batch (`reads`: each command's, in the client's order) into `arena`,
/// server by server, before any is used: a shared connection's turn is then held only while this
/// client's answers on it are read, never while it waits on another server, so a slow server
/// holds up only the commands sent to it. One slot per read, in `reads`' order.
pub(crate) async fn read_all<F: Framing>(
    snap: &Snapshot,
    servers: &mut Servers,
    timeout: Duration,
    reads: &[Read<F>],
    arena: &mut Vec<u8>,
    slots: &mut Vec<Slot>,
    order: &mut Vec<usize>,
) {
    slots.clear();
    slots.resize(reads.len(), Err(CONNECTION_LOST));
    order.clear();
    for r in reads {
        if !order.contains(&r.server) {
            order.push(r.server);
        }
    }
    for &server in order.iter() {
        // The turn on a shared connection is waited for outside every read's timeout and stall
        // clock: the clients before this one on the connection are bounded by their own reads'
        // timeouts, and waiting behind one that waits on another, silent server says nothing of
        // this one (counted against it, a healthy server was ejected for a silent one).
        if servers.0[server].begin().await.is_err() {
            servers.0[server].fail();
        }
        for (r, slot) in reads.iter().zip(slots.iter_mut()).filter(|(r, _)| r.server == server) {
            let start = arena.len();
            let answer = r.how.read(&mut servers.0[server], timeout, arena);
            let result = match r.node.and_then(|n| snap.workers().get(n)) {
                Some(w) => awaiting(w, answer).await,
                None => answer.await,
            };
            *slot = match result {
                Ok(()) => Ok(start..arena.len()),
                Err(why) => {
                    arena.truncate(start);
                    Err(why)
                }
            };
        }
        servers.0[server].release();
    }
}

/// Waits for a server's answer as a try waits for an HTTP worker's response headers: the server
/// counts as awaited meanwhile, and an answer is its sign of life. A server that answers nothing
/// for the pool's stall window (`[pool.passive] stall_ms`) while commands wait on it is stalled,
/// and new commands go around it, as for an HTTP worker.
pub(crate) async fn awaiting<T, E>(w: &Arc<WorkerState>, answer: impl Future<Output = Result<T, E>>) -> Result<T, E> {
    let _waiting = w.awaiting(Instant::now());
    let result = answer.await;
    if result.is_ok() {
        w.answered(Instant::now());
    }
    result
}
