//! The floor of keyroute's own HTTP/1.1 design (`floor_own.rs`) on io_uring instead of epoll
//! readiness, to measure whether io_uring takes CPU off a request on this kernel (issue 33).
//!
//! The same work as `floor_own`: each client connection paired with an upstream connection of its
//! own (backends by connection count, round robin), every request and response head parsed in
//! place with `httparse` (bodies by `Content-Length`), the bytes sent on unchanged. What differs is
//! how the bytes move, in the way io_uring is meant to be used by a server:
//!
//! - **Multishot accept**: one submission accepts every connection.
//! - **Multishot receive from a provided buffer ring**: one submission per socket receives for
//!   its life; the kernel picks a buffer from a ring of them registered once, and a buffer goes
//!   back to the ring when what was received in it has been sent on. Nothing is read into a
//!   buffer of the connection's, and an idle connection holds none.
//! - **The send from the received buffer itself**, no copy (a partial head is the exception: it
//!   is kept until the rest comes).
//! - **Batched submission**: the loop takes every completion there is, queues what they lead to,
//!   and submits it all with the wait for the next, in one system call.
//!
//! A spike, not an engine: one thread (like `keyroute serve --threads 1`), requests and responses
//! framed by `Content-Length` or nothing, no pipelining across a send in flight beyond a queue
//! per direction, blocking connects to the backends (made once per client connection; `wrk`
//! keeps its connections).
//!
//! Usage: `cargo run --release -p keyroute-bench --example floor_uring -- LISTEN BACKEND...`

use std::collections::VecDeque;
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::atomic::{AtomicU16, Ordering};

use io_uring::types::BufRingEntry;
use io_uring::{IoUring, cqueue, opcode, squeue, types};

/// Buffers in the provided ring (a power of two), and the size of each.
const BUFFERS: u16 = 2048;
const BUF_SIZE: usize = 16 * 1024;
const GROUP: u16 = 0;
const MAX_HEADERS: usize = 100;
/// A send that is not from a ring buffer (a partial head that was kept).
const OWNED: u16 = u16::MAX;

/// Linux's `ENOBUFS`: the ring had no buffer for a receive, which is then armed again.
const ENOBUFS: i32 = 105;

const OP_ACCEPT: u64 = 0;
const OP_RECV: u64 = 1;
const OP_SEND: u64 = 2;

/// What a completion is for: the operation, the direction (0: client to upstream, 1: back), the
/// connection's slot and generation, and for a send the ring buffer it sends from.
fn user_data(op: u64, half: usize, slot: usize, generation: u16, bid: u16) -> u64 {
    (op << 62)
        | ((half as u64) << 61)
        | ((u64::from(generation) & 0x1fff) << 48)
        | ((slot as u64) << 16)
        | u64::from(bid)
}

fn decode(ud: u64) -> (u64, usize, usize, u16, u16) {
    (ud >> 62, ((ud >> 61) & 1) as usize, ((ud >> 16) & 0xffff_ffff) as usize, ((ud >> 48) & 0x1fff) as u16, ud as u16)
}

/// The provided buffer ring: the ring of entries shared with the kernel and the buffers it names.
struct BufRing {
    ring: *mut BufRingEntry,
    layout: std::alloc::Layout,
    slab: Vec<u8>,
    tail: u16,
    /// Sends still to complete from each buffer; it goes back to the ring at 0.
    refs: Vec<u16>,
}

impl BufRing {
    fn new(uring: &IoUring) -> io::Result<BufRing> {
        let layout = std::alloc::Layout::from_size_align(usize::from(BUFFERS) * size_of::<BufRingEntry>(), 4096)
            .map_err(io::Error::other)?;
        // SAFETY: a non-zero size; zeroed, as the kernel expects a fresh ring.
        let ring = unsafe { std::alloc::alloc_zeroed(layout) }.cast::<BufRingEntry>();
        if ring.is_null() {
            return Err(io::ErrorKind::OutOfMemory.into());
        }
        let mut r = BufRing {
            ring,
            layout,
            slab: vec![0; usize::from(BUFFERS) * BUF_SIZE],
            tail: 0,
            refs: vec![0; usize::from(BUFFERS)],
        };
        // SAFETY: the ring is page aligned, of BUFFERS entries, and lives as long as the uring
        // (both live until the process ends).
        unsafe { uring.submitter().register_buf_ring_with_flags(ring as u64, BUFFERS, GROUP, 0)? };
        for bid in 0..BUFFERS {
            r.give(bid);
        }
        r.publish();
        Ok(r)
    }

    /// Puts buffer `bid` back in the ring (seen by the kernel at the next [`BufRing::publish`]).
    fn give(&mut self, bid: u16) {
        let at = usize::from(self.tail & (BUFFERS - 1));
        // SAFETY: `at` is within the ring's BUFFERS entries.
        let e = unsafe { &mut *self.ring.add(at) };
        e.set_addr(self.slab.as_ptr() as u64 + (usize::from(bid) * BUF_SIZE) as u64);
        e.set_len(BUF_SIZE as u32);
        e.set_bid(bid);
        self.tail = self.tail.wrapping_add(1);
    }

    fn publish(&self) {
        // SAFETY: the ring's first entry holds the tail the kernel reads; it is written atomically.
        unsafe {
            let tail = BufRingEntry::tail(self.ring).cast::<AtomicU16>();
            (*tail).store(self.tail, Ordering::Release);
        }
    }

    fn bytes(&self, bid: u16, range: std::ops::Range<usize>) -> &[u8] {
        &self.slab[usize::from(bid) * BUF_SIZE..][range]
    }

    /// One send from `bid` completed (or will never be made).
    fn release(&mut self, bid: u16) {
        if bid == OWNED {
            return;
        }
        let r = &mut self.refs[usize::from(bid)];
        *r = r.saturating_sub(1);
        if *r == 0 {
            self.give(bid);
        }
    }
}

impl Drop for BufRing {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with this layout.
        unsafe { std::alloc::dealloc(self.ring.cast(), self.layout) };
    }
}

/// Bytes to send: a range of a ring buffer, or bytes of the connection's own.
enum Chunk {
    Ring { bid: u16, start: usize, end: usize },
    Owned { bytes: Vec<u8>, start: usize },
}

/// One direction of a pair: where its message stands, and what is queued to send.
#[derive(Default)]
struct Half {
    /// Bytes of the current message's body still to come.
    body_left: u64,
    /// A partial head, kept until the rest of it comes.
    tail: Vec<u8>,
    queue: VecDeque<Chunk>,
    sending: bool,
}

struct Conn {
    socks: [TcpStream; 2],
    halves: [Half; 2],
    generation: u16,
}

struct Floor {
    uring: IoUring,
    bufs: BufRing,
    conns: Vec<Option<Conn>>,
    free: Vec<usize>,
    generation: u16,
    backends: Vec<SocketAddr>,
    next: usize,
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().ok_or("LISTEN")?.parse()?;
    let backends: Vec<SocketAddr> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if backends.is_empty() {
        return Err("at least one BACKEND".into());
    }
    let listener = TcpListener::bind(listen)?;
    let uring = IoUring::builder().setup_single_issuer().setup_coop_taskrun().build(4096)?;
    let bufs = BufRing::new(&uring)?;
    let mut f = Floor { uring, bufs, conns: Vec::new(), free: Vec::new(), generation: 0, backends, next: 0 };
    f.push(
        opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd())).build().user_data(user_data(OP_ACCEPT, 0, 0, 0, 0)),
    );
    let mut done = Vec::with_capacity(1024);
    loop {
        f.bufs.publish();
        f.uring.submit_and_wait(1)?;
        done.clear();
        done.extend(f.uring.completion().map(|c| (c.user_data(), c.result(), c.flags())));
        for &(ud, result, flags) in &done {
            f.complete(&listener, ud, result, flags);
        }
    }
}

impl Floor {
    fn push(&mut self, entry: squeue::Entry) {
        // SAFETY: every buffer a queued entry names (a ring buffer, or a chunk of a connection's
        // queue) stays where it is until its completion is taken.
        while unsafe { self.uring.submission().push(&entry) }.is_err() {
            let _ = self.uring.submit();
        }
    }

    fn complete(&mut self, listener: &TcpListener, ud: u64, result: i32, flags: u32) {
        let (op, half, slot, generation, bid) = decode(ud);
        match op {
            OP_ACCEPT => {
                if result >= 0 {
                    // SAFETY: the kernel handed us this new descriptor.
                    let client = unsafe { <TcpStream as std::os::fd::FromRawFd>::from_raw_fd(result) };
                    self.open(client);
                }
                if !cqueue::more(flags) {
                    self.push(
                        opcode::AcceptMulti::new(types::Fd(listener.as_raw_fd()))
                            .build()
                            .user_data(user_data(OP_ACCEPT, 0, 0, 0, 0)),
                    );
                }
            }
            OP_RECV => {
                let got = cqueue::buffer_select(flags);
                let live = self.live(slot, generation);
                match (got, live) {
                    (Some(bid), true) if result > 0 => {
                        self.bufs.refs[usize::from(bid)] = 1;
                        self.received(slot, half, bid, result as usize);
                        // The receive's own reference: what was queued holds the buffer now.
                        self.bufs.release(bid);
                    }
                    (Some(bid), _) => self.bufs.give(bid),
                    (None, _) => {}
                }
                if !live {
                    return;
                }
                if result == 0 || (result < 0 && result != -ENOBUFS) {
                    self.close(slot);
                } else if !cqueue::more(flags) {
                    self.arm(slot, half);
                }
            }
            _ => {
                self.bufs.release(bid);
                if !self.live(slot, generation) {
                    return;
                }
                self.sent(slot, half, result);
            }
        }
    }

    fn live(&self, slot: usize, generation: u16) -> bool {
        self.conns.get(slot).and_then(Option::as_ref).is_some_and(|c| c.generation == generation)
    }

    fn open(&mut self, client: TcpStream) {
        let backend = self.backends[self.next % self.backends.len()];
        self.next += 1;
        let Ok(up) = TcpStream::connect(backend) else { return };
        let _ = client.set_nodelay(true);
        let _ = up.set_nodelay(true);
        self.generation = (self.generation + 1) & 0x1fff;
        let conn =
            Conn { socks: [client, up], halves: [Half::default(), Half::default()], generation: self.generation };
        let slot = match self.free.pop() {
            Some(s) => {
                self.conns[s] = Some(conn);
                s
            }
            None => {
                self.conns.push(Some(conn));
                self.conns.len() - 1
            }
        };
        self.arm(slot, 0);
        self.arm(slot, 1);
    }

    /// The multishot receive of direction `half` (from the client for 0, the upstream for 1).
    fn arm(&mut self, slot: usize, half: usize) {
        let Some(c) = self.conns[slot].as_ref() else { return };
        let entry = opcode::RecvMulti::new(types::Fd(c.socks[half].as_raw_fd()), GROUP).build().user_data(user_data(
            OP_RECV,
            half,
            slot,
            c.generation,
            0,
        ));
        self.push(entry);
    }

    fn close(&mut self, slot: usize) {
        if let Some(c) = self.conns[slot].take() {
            for s in &c.socks {
                let _ = s.shutdown(std::net::Shutdown::Both);
            }
            for h in c.halves {
                // A chunk being sent is released by its completion; those queued behind it now.
                for (i, chunk) in h.queue.into_iter().enumerate() {
                    if let Chunk::Ring { bid, .. } = chunk
                        && !(i == 0 && h.sending)
                    {
                        self.bufs.release(bid);
                    }
                }
            }
            self.free.push(slot);
        }
    }

    /// `n` bytes came into ring buffer `bid` on direction `half`: the messages' bytes queued to
    /// the other side, heads parsed as they start.
    fn received(&mut self, slot: usize, half: usize, bid: u16, n: usize) {
        let Some(c) = self.conns[slot].as_mut() else { return };
        let h = &mut c.halves[half];
        if !h.tail.is_empty() {
            // The rest of a partial head: joined to it, sent from the connection's bytes.
            h.tail.extend_from_slice(self.bufs.bytes(bid, 0..n));
            let bytes = std::mem::take(&mut h.tail);
            if self.split(slot, half, Source::Owned(bytes)).is_err() {
                self.close(slot);
            }
        } else if self.split(slot, half, Source::Ring(bid, n)).is_err() {
            self.close(slot);
        }
        self.flush(slot, 1 - half);
    }

    /// Queues the bytes of `src` as messages: a body's rest, then heads and their bodies.
    fn split(&mut self, slot: usize, half: usize, src: Source) -> Result<(), ()> {
        let len = match &src {
            Source::Ring(_, n) => *n,
            Source::Owned(b) => b.len(),
        };
        let mut at = 0;
        while at < len {
            let Some(c) = self.conns[slot].as_mut() else { return Err(()) };
            let h = &mut c.halves[half];
            let data = match &src {
                Source::Ring(bid, n) => self.bufs.bytes(*bid, at..*n),
                Source::Owned(b) => &b[at..],
            };
            let take = if h.body_left > 0 {
                let t = (h.body_left).min(data.len() as u64) as usize;
                h.body_left -= t as u64;
                t
            } else {
                match head(data, half)? {
                    Some((head_len, body)) => {
                        let message = (head_len as u64).saturating_add(body);
                        let t = (message).min(data.len() as u64) as usize;
                        h.body_left = message - t as u64;
                        t
                    }
                    None => {
                        // A partial head: kept until the rest comes.
                        h.tail.extend_from_slice(data);
                        return Ok(());
                    }
                }
            };
            let chunk = match &src {
                Source::Ring(bid, _) => {
                    self.bufs.refs[usize::from(*bid)] += 1;
                    Chunk::Ring { bid: *bid, start: at, end: at + take }
                }
                Source::Owned(b) => Chunk::Owned { bytes: b[at..at + take].to_vec(), start: 0 },
            };
            if let Some(c) = self.conns[slot].as_mut() {
                c.halves[half].queue.push_back(chunk);
            }
            at += take;
        }
        Ok(())
    }

    /// Sends the first queued chunk of the bytes going out on socket `to` (direction `1 - to`).
    fn flush(&mut self, slot: usize, to: usize) {
        let half = 1 - to;
        let Some(c) = self.conns[slot].as_mut() else { return };
        let generation = c.generation;
        let fd = c.socks[to].as_raw_fd();
        let h = &mut c.halves[half];
        if h.sending {
            return;
        }
        let Some(chunk) = h.queue.front() else { return };
        let (ptr, len, bid) = match chunk {
            Chunk::Ring { bid, start, end } => (self.bufs.bytes(*bid, *start..*end).as_ptr(), end - start, *bid),
            Chunk::Owned { bytes, start } => (bytes[*start..].as_ptr(), bytes.len() - start, OWNED),
        };
        h.sending = true;
        let entry = opcode::Send::new(types::Fd(fd), ptr, len as u32)
            .build()
            .user_data(user_data(OP_SEND, half, slot, generation, bid));
        // The chunk's reference is given back by the send's completion: the queue's for it is
        // that one.
        self.push(entry);
    }

    /// A send of direction `half` completed with `result`.
    fn sent(&mut self, slot: usize, half: usize, result: i32) {
        let Some(c) = self.conns[slot].as_mut() else { return };
        let h = &mut c.halves[half];
        h.sending = false;
        if result < 0 {
            h.queue.pop_front();
            self.close(slot);
            return;
        }
        let n = result as usize;
        let rest = match h.queue.front_mut() {
            Some(Chunk::Ring { bid, start, end }) if *start + n < *end => {
                // A short send: the rest from the same buffer, which keeps a reference for it.
                *start += n;
                self.bufs.refs[usize::from(*bid)] += 1;
                true
            }
            Some(Chunk::Owned { bytes, start }) if *start + n < bytes.len() => {
                *start += n;
                true
            }
            _ => false,
        };
        if !rest {
            h.queue.pop_front();
        }
        self.flush(slot, 1 - half);
    }
}

/// Where received bytes are.
enum Source {
    Ring(u16, usize),
    Owned(Vec<u8>),
}

/// The head at the start of `data` (a request on direction 0, a response on 1): its length and
/// its body's, or `None` when it is not all here.
fn head(data: &[u8], half: usize) -> Result<Option<(usize, u64)>, ()> {
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let parsed = if half == 0 {
        httparse::Request::new(&mut headers).parse(data)
    } else {
        httparse::Response::new(&mut headers).parse(data)
    };
    match parsed {
        Ok(httparse::Status::Complete(n)) => {
            let mut length = 0;
            for h in headers.iter().take_while(|h| !h.name.is_empty()) {
                if h.name.eq_ignore_ascii_case("content-length") {
                    let text = std::str::from_utf8(h.value).map_err(|_| ())?;
                    length = text.trim().parse().map_err(|_| ())?;
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    return Err(());
                }
            }
            Ok(Some((n, length)))
        }
        Ok(httparse::Status::Partial) => Ok(None),
        Err(_) => Err(()),
    }
}
