//! The one driver of a cache listener's client connections, whatever their protocol (twemproxy's
//! request and response path, `nc_request.c` and `nc_response.c`, over per-protocol functions):
//!
//! 1. **Read** what the client pipelined ([`Client::read`]).
//! 2. **Plan** each whole command buffered, up to [`BATCH`]: the protocol parses it, answers it
//!    itself, or places it (by the pool's one steering rule) and queues its request, split by
//!    server for a command of several keys ([`Protocol::plan`]).
//! 3. **Send** every server's requests of the batch at once ([`crate::servers::flush`]): on the
//!    thread's shared connections, one ticket per server.
//! 4. **Frame** every answer, server by server ([`crate::servers::read_all`]), with the
//!    protocol's framing.
//! 5. **Merge** each command's answers into the client's, in its order ([`Protocol::answer`]),
//!    and write them back at once.
//!
//! What is the same for both protocols is here: the batch, its snapshot of the pool (every
//! command of a batch is placed on one table), the load each request puts on its server while it
//! is in flight (the steering rule reads it: bounded loads and hot-key replicas), placement and
//! its accounting, failures and ejection, the side connections, and the stop.

use std::cell::RefCell;
use std::sync::Arc;
use std::sync::atomic::Ordering::Relaxed;
use std::task::Poll;
use std::thread::LocalKey;
use std::time::Duration;

use bytes::{Buf as _, BytesMut};
use keyroute_fleet::config::PoolConfig;
use keyroute_fleet::idle::IdleTimer;
use keyroute_fleet::metrics::{CommandMetrics, Outcome};
use keyroute_fleet::pool::{InFlightBatch, Pool, Snapshot, WorkerState};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

use crate::servers::{Framing, Greeting, Read, Servers, Slot, flush, read_all};
use crate::{Context, PoolState};

/// The most commands served in one batch.
pub(crate) const BATCH: usize = 1024;

/// A protocol over the driver: how a client's commands are planned and their answers merged.
pub(crate) trait Protocol: Send + Sized + 'static {
    /// A command of the batch once planned: where its answer comes from.
    type Pending: Pending;

    /// The protocol's name, in metrics and the slow log.
    const NAME: &'static str;

    /// The classes its commands are counted by (command names, a fixed table).
    fn classes() -> &'static [&'static str];

    /// The class of the command planned last (an index into [`Protocol::classes`]).
    fn class(&self) -> u16;

    /// Whether a command's answer to the client is an error.
    fn is_error(answer: &[u8]) -> bool;

    /// The key that routes the first whole command of `input` (its first key; an empty key for a
    /// command of every server, which goes to the listener's own pool), and whether the command
    /// only reads; `None` for a command without keys, or one not whole yet.
    fn route_key<'a>(&self, input: &'a [u8]) -> Option<(std::borrow::Cow<'a, [u8]>, bool)>;

    /// Whether `input` begins with a whole command (the next batch starts without a read).
    fn whole(&self, input: &[u8]) -> bool;

    /// What a new connection to a server of `pool` is sent first, for this client now.
    fn greeting(&self, _pool: &PoolConfig) -> Option<Arc<[u8]>> {
        None
    }

    /// The answer to `greeting`: `None` while it has not all come, else whether the server
    /// accepted it.
    fn greeted(_greeting: &[u8], _answer: &[u8]) -> Option<bool> {
        Some(true)
    }

    /// Plans the first command of `input` (what the client sent, not yet served): parses it, and
    /// queues its requests and its pending answer in `b` (or answers it itself).
    fn plan<'a>(&'a mut self, input: &'a [u8], b: &'a mut Batch<'_, Self>)
    -> impl Future<Output = Planned> + Send + 'a;

    /// Writes a planned command's answer to the client's output, from the answers it read
    /// (`slots`, in the order of its reads, into `arena`).
    fn answer<'a>(
        &'a mut self,
        b: &'a mut Batch<'_, Self>,
        p: Self::Pending,
        slots: &'a [Slot],
        arena: &'a [u8],
    ) -> impl Future<Output = ()> + Send + 'a;

    /// After the batch's answers were written (Redis: a client that switched protocols gets new
    /// server connections).
    fn after(&mut self, _servers: &mut Servers, _side: &mut Servers) {}

    /// The thread's spare lists for this protocol's batches (see [`Lists`]).
    fn spare() -> &'static LocalKey<RefCell<Vec<Lists<Self>>>>;
}

/// A planned command: the answers it reads.
pub(crate) trait Pending: Send + 'static {
    /// How its protocol frames an answer.
    type Framing: Framing + Send + Sync;

    /// Appends the answers it reads, in order.
    fn reads(&self, out: &mut Vec<Read<Self::Framing>>);
}

/// What planning one command did, and how many bytes of the input it took.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Planned {
    /// Planned (or answered), taking `n` bytes; the next command may follow in this batch.
    Next(usize),
    /// No whole command is buffered: the batch is sent as it is.
    Wait,
    /// The connection closes once what is planned is answered (`quit`, or a request that cannot
    /// be framed, which nothing after can be either).
    Close,
    /// A command of `n` bytes was refused, and its `skip` bytes of data after it are dropped,
    /// never read as commands (as they arrive, once what is planned is answered).
    Skip { n: usize, skip: usize },
    /// Planned, taking `n` bytes; the batch ends here (what follows needs what this command
    /// changes).
    End(usize),
}

/// A pool's settings that a batch uses.
pub(crate) struct Settings {
    /// The time a server has to answer.
    pub(crate) answer: Duration,
    /// The time to connect to a server.
    pub(crate) connect: Duration,
    /// Servers a command may try: the key's, and past those that cannot be reached, the next of
    /// its ranking.
    pub(crate) attempts: usize,
    /// Whether passive ejection may take out one more server (see
    /// [`Snapshot::may_eject`]).
    pub(crate) may_eject: bool,
    /// What a new server connection is sent first.
    pub(crate) greeting: Greeting,
    /// What the cache listeners keep for the pool across its snapshots (found once a batch):
    /// where its hot keys have copies, its shadow's queue, its cluster's map.
    pub(crate) state: Arc<PoolState>,
}

/// What planning and answering a batch share: the pool and the one snapshot the batch is placed
/// on, its settings, the time it started, the client's connections to the servers and its output,
/// and the load its requests put on their servers.
pub(crate) struct Batch<'a, P: Protocol> {
    /// The listener's fleet and pool name.
    pub(crate) ctx: &'a Context,
    pub(crate) pool: &'a Arc<Pool>,
    pub(crate) snap: &'a Snapshot,
    pub(crate) s: &'a Settings,
    pub(crate) now: Instant,
    /// The batch's connections (the thread's shared ones).
    pub(crate) servers: &'a mut Servers,
    /// Connections used one exchange at a time, outside the batch (the warm-up and fill routes).
    pub(crate) side: &'a mut Servers,
    /// The answers for the client, in its order.
    pub(crate) out: &'a mut Vec<u8>,
    pub(crate) pending: Vec<P::Pending>,
    /// The requests of the batch in flight on each server, until its answers are read.
    pub(crate) loads: InFlightBatch,
    /// The lists the batch fills and empties again (the thread's).
    pub(crate) lists: Lists<P>,
    /// The first key of the command being planned (its hash, and its text when the pool's slow
    /// log shows keys).
    key: Option<KeyNote>,
    /// The command counters of the pool, for this protocol.
    commands: &'a CommandMetrics,
}

/// A command's first key, for the slow log: its placement hash (when its strategy hashes keys),
/// and its text when the pool shows key text.
type KeyNote = (Option<u64>, Option<Box<[u8]>>);

/// A command of the batch, for its metrics: its class, its first pending answer, and its key.
struct Mark {
    class: u16,
    pending: usize,
    key: Option<KeyNote>,
}

/// The lists a batch fills and empties again, lent by the thread as its byte buffers are
/// ([`crate::stash`]): a batch takes a set and gives it back when it ends, so that a command
/// allocates no list and an idle client holds none. A set a long pipeline grew is freed.
pub(crate) struct Lists<P: Protocol> {
    /// The argument ranges of the command being planned (Redis).
    pub(crate) ranges: Vec<std::ops::Range<usize>>,
    pending: Vec<P::Pending>,
    reads: Vec<Read<<P::Pending as Pending>::Framing>>,
    counts: Vec<usize>,
    slots: Vec<Slot>,
    order: Vec<usize>,
    loads: InFlightBatch,
    marks: Vec<Mark>,
    /// The client's output's length before each pending answer was written.
    outs: Vec<usize>,
}

impl<P: Protocol> Default for Lists<P> {
    fn default() -> Self {
        Lists {
            ranges: Vec::new(),
            pending: Vec::new(),
            reads: Vec::new(),
            counts: Vec::new(),
            slots: Vec::new(),
            order: Vec::new(),
            loads: InFlightBatch::default(),
            marks: Vec::new(),
            outs: Vec::new(),
        }
    }
}

impl<P: Protocol> Lists<P> {
    /// A set of the thread's, or a new one.
    fn take() -> Lists<P> {
        crate::stash::lend(P::spare())
    }

    /// Gives the set back to the thread, unless a long pipeline grew it or the thread keeps
    /// enough.
    fn give(self) {
        if self.pending.capacity() > 64 || self.ranges.capacity() > 64 {
            return;
        }
        crate::stash::keep(P::spare(), self);
    }
}

impl<P: Protocol> Batch<'_, P> {
    /// The worker of node `i` of the batch's snapshot.
    pub(crate) fn worker(&self, i: usize) -> &Arc<WorkerState> {
        &self.snap.workers()[i]
    }

    /// The batch connection to node `node` (its index among the client's), made if needed; a
    /// connect that fails is counted against the server.
    pub(crate) async fn connect(&mut self, node: usize) -> Option<usize> {
        connect(self.servers, &self.snap.workers()[node], self.s).await
    }

    /// A side connection to node `node`, for an exchange made now, outside the batch.
    pub(crate) async fn side(&mut self, node: usize) -> Option<usize> {
        connect(self.side, &self.snap.workers()[node], self.s).await
    }

    /// Where a key goes, as [`Placed::of`] places `part` (the part of `key` that places it); the
    /// command's first key is noted for its metrics and the slow log.
    pub(crate) fn placed(&mut self, key: &[u8], part: &[u8]) -> Placed {
        let placed = Placed::of(self.pool, self.snap, part);
        if self.key.is_none() {
            let text = self.snap.config().slow_log.show_keys.then(|| Box::from(key));
            self.key = Some((placed.0, text));
        }
        placed
    }

    /// Whether some of a command's `keys` (`read`: the command only reads) route to another pool
    /// than the batch's: such a command is refused (its parts would go to different pools).
    pub(crate) fn off_route<'k>(&self, mut keys: impl Iterator<Item = &'k [u8]>, read: bool) -> bool {
        let l = &self.ctx.listener;
        l.routed() && keys.any(|k| l.route(k, read) != self.pool.name)
    }

    /// Counts a request sent to `node` as in flight until the batch's answers are read.
    pub(crate) fn sent(&mut self, node: usize) {
        if let Some(w) = self.snap.workers().get(node) {
            self.loads.add(w);
        }
    }

    /// Where a key goes (its placement on the batch's table by the pool's one steering rule,
    /// skipping `tried`), counted by how it was placed. `replicas`: the key may be read from a
    /// hot key's replica; otherwise it goes to its owner (or, past it, the handoff, slow start
    /// and failover).
    pub(crate) fn pick(&self, hash: Placed, tried: &[usize], replicas: bool) -> Option<keyroute::Decision> {
        pick(self.pool, self.snap, hash, tried, self.now, replicas)
    }

    /// The server for a key: node `to` when one is given and it can be reached (a key's new owner
    /// within a handoff, a replicated key's first copy, a cluster slot's master), else its
    /// placement, walking its ranking past servers that cannot be reached (nothing was sent to
    /// them), up to the pool's attempts; the request counted in flight there. Returns the
    /// connection's index and the node; `None` (counted as no worker) when none could be reached.
    pub(crate) async fn place(&mut self, to: Option<usize>, hash: Placed, replicas: bool) -> Option<(usize, usize)> {
        if let Some(node) = to
            && let Some(server) = self.connect(node).await
        {
            self.sent(node);
            return Some((server, node));
        }
        let mut tried = Vec::new();
        while tried.len() < self.s.attempts {
            let Some(d) = self.pick(hash, &tried, replicas) else { break };
            match self.connect(d.node).await {
                Some(server) => {
                    self.sent(d.node);
                    return Some((server, d.node));
                }
                None => {
                    self.worker(d.node).metrics.retries.fetch_add(1, Relaxed);
                    tried.push(d.node);
                }
            }
        }
        self.pool.metrics.no_worker.fetch_add(1, Relaxed);
        None
    }

    /// Counts a server's failure (passive ejection).
    pub(crate) fn failed(&self, node: usize) {
        failed(self.worker(node), self.s);
    }

    /// The servers other than `except` that may hold a copy of the hot key hashed `h`: the first
    /// `replicas` of its ranking (where copies are made while it is hot) and, in a pool with hot
    /// keys, every server the pool remembers filling with one (hot or not now). A write deletes
    /// the key there.
    pub(crate) fn copy_holders(&self, h: u64, replicas: usize, except: usize) -> Vec<usize> {
        let mut nodes: Vec<usize> = self.snap.policy().ranked(h).take(replicas).filter(|&i| i != except).collect();
        if self.snap.hot().is_some() {
            for a in self.s.state.copies.holders(h, self.now) {
                if let Some(i) = self.snap.workers().iter().position(|w| w.address == a)
                    && i != except
                    && !nodes.contains(&i)
                {
                    nodes.push(i);
                }
            }
        }
        nodes
    }

    /// Counts a server's answer.
    pub(crate) fn succeeded(&self, node: usize) {
        let w = self.worker(node);
        w.metrics.record_latency(self.now.elapsed());
        w.metrics.record_class(Some(200));
        w.observe_success();
    }
}

/// Serves one client connection of a cache listener to its end: batch after batch, as long as
/// the client sends and the server runs (see [`Client::read`] for the stop).
pub(crate) async fn serve<P: Protocol, H: Send>(mut c: Client, ctx: Arc<Context>, mut proto: P, _held: H) {
    // The command counters of each pool the connection sent to, found once (again if a reload
    // made a new pool of its name).
    let mut counters: Vec<(Arc<Pool>, Arc<CommandMetrics>)> = Vec::new();
    loop {
        // A batch's work is a future of its own, on the heap while it runs: an idle connection's
        // task holds only its client and its read.
        if !Box::pin(batch(&mut c, &ctx, &mut proto, &mut counters)).await {
            return;
        }
        // More whole commands than one batch are served before reading.
        if !proto.whole(&c.input) && !c.read().await {
            return;
        }
    }
}

/// One batch: the whole commands buffered (up to [`BATCH`]) planned, sent, answered and written
/// back; `false` when the connection is to close.
async fn batch<P: Protocol>(
    c: &mut Client,
    ctx: &Context,
    proto: &mut P,
    counters: &mut Vec<(Arc<Pool>, Arc<CommandMetrics>)>,
) -> bool {
    // The batch's pool: the listener's, or with routes its first command's. A batch is placed in
    // one pool; a command routed to another ends it, and starts the next.
    let listener = &ctx.listener;
    let routed = listener.routed();
    let first = if routed { proto.route_key(&c.input) } else { None };
    let name = match &first {
        Some((key, read)) => listener.route(key, *read),
        None => listener.pool.as_str(),
    };
    let Some(pool) = ctx.fleet.pool(name) else { return false };
    let commands = match counters.iter().find(|(p, _)| Arc::ptr_eq(p, &pool)) {
        Some((_, m)) => Arc::clone(m),
        None => {
            let m = pool.metrics.commands(P::NAME, P::classes());
            counters.retain(|(p, _)| p.name != pool.name);
            counters.push((Arc::clone(&pool), Arc::clone(&m)));
            m
        }
    };
    // One snapshot for the batch: its commands are placed on one table.
    let snap = pool.snapshot();
    let config = snap.config();
    let s = Settings {
        answer: config.retry.per_try_timeout,
        connect: config.connect_timeout,
        attempts: config.retry.attempts.max(1) as usize,
        may_eject: snap.may_eject(),
        greeting: Greeting {
            bytes: proto.greeting(config),
            greeted: P::greeted,
            write_timeout: config.retry.per_try_timeout,
        },
        state: crate::state(&pool),
    };
    let Client { io, input, out, servers, side } = c;
    if out.capacity() == 0 {
        *out = crate::stash::take();
    }
    let mut lists = Lists::take();
    let mut b = Batch {
        ctx,
        pool: &pool,
        snap: &snap,
        s: &s,
        now: Instant::now(),
        servers,
        side,
        out,
        pending: std::mem::take(&mut lists.pending),
        loads: std::mem::take(&mut lists.loads),
        lists,
        key: None,
        commands: &commands,
    };
    let mut close = false;
    loop {
        // (Checked for every command, the first of a batch too: a refused block skipped in the
        // middle of the batch, or a command that planned nothing, leaves it without pendings.)
        if routed
            && let Some((key, read)) = proto.route_key(input)
            && listener.route(&key, read) != pool.name
        {
            break;
        }
        let before = b.pending.len();
        let planned = proto.plan(input, &mut b).await;
        let key = b.key.take();
        if planned != Planned::Wait && b.pending.len() > before {
            b.lists.marks.push(Mark { class: proto.class(), pending: before, key });
        }
        match planned {
            Planned::Next(n) => {
                input.advance(n);
                if b.pending.len() >= BATCH {
                    break;
                }
            }
            Planned::Wait => break,
            Planned::End(n) => {
                input.advance(n);
                break;
            }
            Planned::Close => {
                close = true;
                break;
            }
            Planned::Skip { n, skip } => {
                input.advance(n);
                if skip <= input.len() {
                    input.advance(skip);
                    continue;
                }
                // The block is skipped as it arrives: the answers so far go out first.
                finish(proto, &mut b).await;
                if !io.reply(b.out).await || !io.discard(input, skip).await {
                    return false;
                }
                // The client's upload of the skipped block is not the next commands' time.
                b.now = Instant::now();
            }
        }
    }
    finish(proto, &mut b).await;
    let open = io.reply(b.out).await && !close;
    proto.after(b.servers, b.side);
    let Batch { pending, loads, mut lists, .. } = b;
    lists.pending = pending;
    lists.loads = loads;
    lists.give();
    open
}

/// Sends the batch's requests (one write per server), reads every answer, server by server, and
/// writes each command's answer, in the client's order.
async fn finish<P: Protocol>(proto: &mut P, b: &mut Batch<'_, P>) {
    flush(b.servers, b.s.answer).await;
    let mut pending = std::mem::take(&mut b.pending);
    let Lists { reads, counts, slots, order, .. } = &mut b.lists;
    for p in &pending {
        let before = reads.len();
        p.reads(reads);
        counts.push(reads.len() - before);
    }
    let mut arena = crate::stash::take();
    read_all(b.snap, b.servers, b.s.answer, reads, &mut arena, slots, order).await;
    reads.clear();
    let (mut counts, slots) = (std::mem::take(counts), std::mem::take(slots));
    let mut outs = std::mem::take(&mut b.lists.outs);
    let mut at = 0;
    for (p, n) in pending.drain(..).zip(counts.drain(..)) {
        outs.push(b.out.len());
        proto.answer(b, p, &slots[at..at + n], &arena).await;
        at += n;
    }
    outs.push(b.out.len());
    record(b, &outs);
    outs.clear();
    b.lists.outs = outs;
    crate::stash::give(&mut arena);
    b.pending = pending;
    b.lists.counts = counts;
    b.lists.slots = slots;
    b.lists.slots.clear();
    b.servers.sweep();
    b.loads.release();
}

/// Counts the commands answered (their marks), by class: how many, which were errors, and their
/// time from the batch's start (when the proxy had them) to now (their answers are written next);
/// those over the pool's slow-log threshold are kept in its slow log.
fn record<P: Protocol>(b: &mut Batch<'_, P>, outs: &[usize]) {
    let mut marks = std::mem::take(&mut b.lists.marks);
    if marks.is_empty() {
        b.lists.marks = marks;
        return;
    }
    let latency = b.now.elapsed();
    let slow = b.snap.config().slow_log;
    let keep = if slow.entries > 0 && latency >= slow.threshold { slow.entries } else { 0 };
    let first_kept = marks.len().saturating_sub(keep);
    let mut slow_entries = Vec::new();
    let at_ms = if keep > 0 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
    } else {
        0
    };
    // Commands of one class in a row are counted at once.
    let mut run: Option<(u16, u64, u64)> = None;
    let last = outs.len() - 1;
    for i in 0..marks.len() {
        let end = marks.get(i + 1).map_or(last, |m| m.pending);
        let m = &mut marks[i];
        let answer = b.out.get(outs[m.pending]..outs[end]).unwrap_or_default();
        let error = P::is_error(answer);
        run = match run {
            Some((class, n, errors)) if class == m.class => Some((class, n + 1, errors + u64::from(error))),
            other => {
                if let Some((class, n, errors)) = other
                    && let Some(c) = b.commands.by_class.get(usize::from(class))
                {
                    c.record(n, errors, latency);
                }
                Some((m.class, 1, u64::from(error)))
            }
        };
        if i >= first_kept {
            let (hash, text) = m.key.take().unwrap_or((None, None));
            let command = P::classes().get(usize::from(m.class)).copied().unwrap_or("?");
            slow_entries.push(keyroute_fleet::metrics::SlowCommand {
                at_ms,
                protocol: P::NAME,
                command,
                key_hash: hash.map(|h| format!("{h:016x}")),
                key: text.map(|t| String::from_utf8_lossy(&t).into_owned()),
                micros: latency.as_micros() as u64,
                error,
            });
        }
    }
    if let Some((class, n, errors)) = run
        && let Some(c) = b.commands.by_class.get(usize::from(class))
    {
        c.record(n, errors, latency);
    }
    if !slow_entries.is_empty() {
        b.pool.metrics.slow.extend(slow_entries, keep);
    }
    marks.clear();
    b.lists.marks = marks;
}

/// A key's hash on the batch's table (recorded in the pool's recent keys, for the dashboard and
/// the remapped share, and offered to hot-key detection), or `None` when the strategy does not
/// place this key by hash.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Placed(pub(crate) Option<u64>);

impl Placed {
    pub(crate) fn of(pool: &Pool, snap: &Snapshot, key: &[u8]) -> Placed {
        let policy = snap.policy();
        if !policy.strategy().hashes_key(key) {
            return Placed(None);
        }
        let hash = policy.key_hash(key);
        pool.record_key(hash);
        if let Some(hot) = snap.hot() {
            hot.observe(hash, &String::from_utf8_lossy(key));
        }
        Placed(Some(hash))
    }
}

/// Where a key goes on `snap`, skipping `tried`, counted in the pool's placements by how it was
/// placed: the steering rule's own decision, as the HTTP gateway counts it (the owner, a
/// replica, a warming owner passed over, an overloaded one, or one unavailable).
pub(crate) fn pick(
    pool: &Pool,
    snap: &Snapshot,
    hash: Placed,
    tried: &[usize],
    now: Instant,
    replicas: bool,
) -> Option<keyroute::Decision> {
    let d = if replicas { snap.decide(hash.0, tried, now) } else { snap.decide_owner(hash.0, tried, now) }?;
    let attempt = u32::from(!tried.is_empty());
    pool.metrics.outcome(Outcome::of(attempt, hash.0.is_some() && d.owner.is_some(), d.spill));
    Some(d)
}

/// The connection of `servers` to `w` (its index), made now if needed; a connect that fails is
/// counted against the server.
async fn connect(servers: &mut Servers, w: &Arc<WorkerState>, s: &Settings) -> Option<usize> {
    let i = open(servers, w, s).await?;
    let out = &mut servers.0[i].out;
    if out.capacity() == 0 {
        *out = crate::stash::take();
    }
    Some(i)
}

async fn open(servers: &mut Servers, w: &Arc<WorkerState>, s: &Settings) -> Option<usize> {
    let got = servers.connect(w, &s.greeting, s.connect).await;
    if got.is_none() {
        w.metrics.connect_errors.fetch_add(1, Relaxed);
        failed(w, s);
    }
    got
}

/// Counts a failure of `w` (passive ejection). An ejection it causes is counted by the worker's
/// own machine ([`WorkerState::observe_failure`]), once: never again here.
pub(crate) fn failed(w: &WorkerState, s: &Settings) {
    w.metrics.record_class(None);
    if let Some(ejection) = w.observe_failure(s.may_eject, Instant::now()) {
        tracing::warn!(server = %w.address, ejection_ms = ejection.as_millis() as u64, "cache server ejected after consecutive failures");
    }
}

/// A write of `hash`'s key was acknowledged by the server of node `writer`: once no fill of a copy
/// of it is landing, the copies on the other servers that may hold one are deleted (`delete`: the
/// protocol's command for it), over the client's side connections, each deletion acknowledged
/// before the client is answered. See the [`crate::copies`] module: a fill that read the key
/// before this write either drops its copy or lands before these deletes.
pub(crate) async fn delete_copies<P: Protocol, F: Framing>(
    b: &mut Batch<'_, P>,
    hash: u64,
    writer: usize,
    delete: &[u8],
    how: &F,
) {
    if b.snap.hot().is_none() && b.snap.config().replication.is_none() {
        return;
    }
    let holders = b.s.state.copies.written(hash, Instant::now()).await;
    let writer = b.snap.workers().get(writer).map(|w| w.address);
    for addr in holders.into_iter().filter(|a| Some(*a) != writer) {
        let Some(node) = b.snap.workers().iter().position(|w| w.address == addr) else { continue };
        let Some(i) = b.side(node).await else { continue };
        let server = &mut b.side.0[i];
        server.out.extend_from_slice(delete);
        let mut dropped = Vec::new();
        if !server.send_now(b.s.answer).await || how.read(server, b.s.answer, &mut dropped).await.is_err() {
            server.broken = true;
        }
    }
    b.side.sweep();
}

/// A client connection of a cache listener: its socket, what it sent not yet served, the answers
/// not yet written, and its connections to the servers.
pub(crate) struct Client {
    io: ClientIo,
    input: BytesMut,
    out: Vec<u8>,
    servers: Servers,
    side: Servers,
}

/// A client connection's socket, and the server's stop (held by the thread for all its clients:
/// [`keyroute_fleet::idle`]).
struct ClientIo {
    stream: TcpStream,
    stop: IdleTimer,
}

impl Client {
    /// A client on `stream`, of the server whose stop channel is `stop`.
    pub(crate) fn new(stream: TcpStream, stop: &tokio::sync::watch::Receiver<bool>) -> Client {
        let _ = stream.set_nodelay(true);
        Client {
            io: ClientIo { stream, stop: IdleTimer::new(None, stop) },
            input: BytesMut::new(),
            out: Vec::new(),
            servers: Servers::shared(),
            side: Servers::default(),
        }
    }

    /// Reads more of the client's; `false` when it closed, or the server stops. A client with
    /// nothing unread holds no buffer while it waits (an idle client costs its socket and this
    /// task, not buffers).
    ///
    /// Once the server stops, what the client had already sent is still read and served (its
    /// commands are answered, then the connection closes when nothing more is there): a stop
    /// never drops a command that reached the socket, and never resets a connection that has
    /// unread bytes.
    async fn read(&mut self) -> bool {
        if self.io.stop.stopping() {
            return self.io.read_now(&mut self.input);
        }
        if self.input.is_empty() {
            crate::stash::give_read(&mut self.input);
            crate::stash::give(&mut self.out);
            self.servers.idle();
            match self.io.wait().await {
                Wake::Readable => {}
                Wake::Stopped => return self.io.read_now(&mut self.input),
                Wake::Failed => return false,
            }
        }
        if self.input.capacity() == 0 {
            self.input = crate::stash::take_read(4096);
        } else {
            self.input.reserve(4096);
        }
        loop {
            match crate::conn::read_draining(&self.io.stream, &mut self.input) {
                Ok(0) => return false,
                Ok(_) => return true,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                Err(_) => return false,
            }
            match self.io.wait().await {
                Wake::Readable => {}
                Wake::Stopped => return self.io.read_now(&mut self.input),
                Wake::Failed => return false,
            }
        }
    }
}

impl ClientIo {
    /// Writes the answers gathered in `out`; `false` when the client is gone.
    async fn reply(&mut self, out: &mut Vec<u8>) -> bool {
        if out.is_empty() {
            return true;
        }
        let ok = self.stream.write_all(out).await.is_ok();
        out.clear();
        ok
    }

    /// Waits until the socket is readable, the server stops, or the socket fails.
    async fn wait(&mut self) -> Wake {
        // One `poll_fn` over the socket's readiness and the thread-held stop, not a `select!` of
        // `readable()` (152 bytes of waiter in every idle client's task) and a channel wait.
        std::future::poll_fn(|cx| {
            match self.stream.poll_read_ready(cx) {
                Poll::Ready(Ok(())) => return Poll::Ready(Wake::Readable),
                Poll::Ready(Err(_)) => return Poll::Ready(Wake::Failed),
                Poll::Pending => {}
            }
            self.stop.poll_wait(cx, true).map(|_| Wake::Stopped)
        })
        .await
    }

    /// After the stop: what the kernel holds for the socket now, into `input`, without waiting;
    /// `false` when it holds nothing (the connection then closes). Read from the socket itself,
    /// not through the runtime's readiness, which can lag bytes that have already arrived: a
    /// command the client finished sending is never taken for one still on its way.
    fn read_now(&self, input: &mut BytesMut) -> bool {
        use std::io::Read as _;
        let mut chunk = [0u8; 4096];
        match (&*socket2::SockRef::from(&self.stream)).read(&mut chunk) {
            Ok(n) if n > 0 => {
                input.extend_from_slice(&chunk[..n]);
                true
            }
            _ => false,
        }
    }

    /// Reads and drops `n` bytes of the client's (a refused data block; what `input` holds first),
    /// without holding them.
    async fn discard(&mut self, input: &mut BytesMut, mut n: usize) -> bool {
        let here = n.min(input.len());
        input.advance(here);
        n -= here;
        // On the heap: an array here would make every connection's task this much larger.
        let mut scratch = vec![0u8; n.min(8192)];
        while n > 0 {
            let want = n.min(scratch.len());
            match self.stream.read(&mut scratch[..want]).await {
                Ok(0) | Err(_) => return false,
                Ok(got) => n -= got,
            }
        }
        true
    }
}

/// What ended a client's wait.
enum Wake {
    Readable,
    Stopped,
    Failed,
}
