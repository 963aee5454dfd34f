//! The floor for an HTTP/1.1 proxy of keyroute's own design (issue 20's spike), beside
//! `floor_proxy.rs` (the same do-nothing proxy on hyper): what forwarding costs on `httparse` and
//! readiness alone.
//!
//! The design the issue asks for, reduced to forwarding:
//! - **Nothing held while idle**: a connection waits for readiness owning no buffer; it reads
//!   into one 64 KiB buffer owned by its runtime thread, and keeps only the unparsed tail of a
//!   partial head (empty in the common case).
//! - **No copy of the head**: the head is parsed in place in the thread's buffer and written to
//!   the other side from there, in the same synchronous step (only what the socket does not take
//!   at once is copied, to be written when it is writable).
//! - **The upstream connection owned by the client's task**, driven directly: no channel, no
//!   connection task.
//!
//! Each client connection gets one upstream keep-alive connection of its own (to a backend picked
//! by connection count, round robin), as `floor_proxy` does; every request is sent on as it came.
//! A spike, not the engine: it takes requests and responses whose bodies have a Content-Length
//! (or none), and closes the connection on anything else (chunked bodies, upgrades, bad heads).
//!
//! Usage: `cargo run --release -p keyroute-bench --example floor_own -- LISTEN BACKEND...`
//! (one runtime thread, like `keyroute serve --threads 1`).

use std::cell::RefCell;
use std::io;

use tokio::io::AsyncWriteExt;
use tokio::net::TcpStream;

const BUF: usize = 64 * 1024;
const MAX_HEADERS: usize = 100;

thread_local! {
    /// The runtime thread's read buffer: every connection of the thread reads into it.
    static SCRATCH: RefCell<Vec<u8>> = RefCell::new(vec![0; BUF]);
}

#[path = "floor/accept.rs"]
mod accept;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    accept::run(|client, up| async move {
        let _ = proxy(client, up).await;
    })
}

/// Which head a side sends.
#[derive(Clone, Copy)]
enum Kind {
    Request,
    Response,
}

/// What one synchronous step over a readable socket did.
enum Step {
    /// Nothing to read after all (a spurious wake-up), or a partial head kept in `tail`.
    Again,
    /// A message went on: bytes still to copy from `from` (the rest of its body), and bytes the
    /// other side did not take at once (to write when it is writable).
    Sent { body_left: u64, pending: Vec<u8> },
}

/// One client connection and its upstream: request, response, and again, until either closes.
async fn proxy(client: TcpStream, up: TcpStream) -> io::Result<()> {
    let (mut client, mut up) = (client, up);
    let (mut req_tail, mut resp_tail) = (Vec::new(), Vec::new());
    loop {
        relay(&mut client, &mut up, &mut req_tail, Kind::Request).await?;
        relay(&mut up, &mut client, &mut resp_tail, Kind::Response).await?;
    }
}

/// Moves one message (head and body) from `from` to `to`.
async fn relay(from: &mut TcpStream, to: &mut TcpStream, tail: &mut Vec<u8>, kind: Kind) -> io::Result<()> {
    // Bytes of the next head may already be here (pipelined): try them before waiting.
    let mut wait = tail.is_empty();
    loop {
        if wait {
            from.readable().await?;
        }
        match SCRATCH.with(|s| step(from, to, tail, kind, &mut s.borrow_mut()))? {
            Step::Again => wait = true,
            Step::Sent { body_left, pending } => {
                if !pending.is_empty() {
                    to.write_all(&pending).await?;
                }
                if body_left > 0 {
                    copy_body(from, to, body_left).await?;
                }
                return Ok(());
            }
        }
    }
}

/// Reads what `from` has (after the kept tail) into the thread's buffer, parses the head in
/// place, and writes the message's bytes that are here to `to`, all without awaiting.
fn step(from: &TcpStream, to: &TcpStream, tail: &mut Vec<u8>, kind: Kind, buf: &mut [u8]) -> io::Result<Step> {
    let kept = tail.len().min(buf.len());
    buf[..kept].copy_from_slice(&tail[..kept]);
    tail.clear();
    let (read, eof) = match from.try_read(&mut buf[kept..]) {
        Ok(0) => (0, true),
        Ok(n) => (n, false),
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => (0, false),
        Err(e) => return Err(e),
    };
    let filled = kept + read;
    if filled == 0 {
        return if eof { Err(io::ErrorKind::UnexpectedEof.into()) } else { Ok(Step::Again) };
    }
    let data = &buf[..filled];
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let parsed = match kind {
        Kind::Request => httparse::Request::new(&mut headers).parse(data),
        Kind::Response => httparse::Response::new(&mut headers).parse(data),
    };
    let head = match parsed {
        Ok(httparse::Status::Complete(n)) => n,
        // Not a whole head yet: keep it and wait for more (unless the peer closed).
        Ok(httparse::Status::Partial) if filled < buf.len() && !eof => {
            tail.extend_from_slice(data);
            return Ok(Step::Again);
        }
        Ok(httparse::Status::Partial) if eof => return Err(io::ErrorKind::UnexpectedEof.into()),
        _ => return Err(io::ErrorKind::InvalidData.into()),
    };
    let body = body_length(&headers)?;
    let message = (head as u64).saturating_add(body);
    let here = (filled as u64).min(message) as usize;
    // Bytes past this message are the next one's (pipelining): keep them.
    tail.extend_from_slice(&data[here..]);
    let written = match to.try_write(&data[..here]) {
        Ok(n) => n,
        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
        Err(e) => return Err(e),
    };
    Ok(Step::Sent { body_left: message - here as u64, pending: data[written..here].to_vec() })
}

/// The body's length from the head: its Content-Length, or none. Chunked and other codings are
/// beyond this spike.
fn body_length(headers: &[httparse::Header<'_>]) -> io::Result<u64> {
    let mut length = 0;
    for h in headers.iter().take_while(|h| !h.name.is_empty()) {
        if h.name.eq_ignore_ascii_case("content-length") {
            let text = std::str::from_utf8(h.value).map_err(|_| io::ErrorKind::InvalidData)?;
            length = text.trim().parse().map_err(|_| io::ErrorKind::InvalidData)?;
        } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
            return Err(io::ErrorKind::Unsupported.into());
        }
    }
    Ok(length)
}

/// Copies the rest of a body through the thread's buffer, `left` bytes.
async fn copy_body(from: &TcpStream, to: &mut TcpStream, mut left: u64) -> io::Result<()> {
    while left > 0 {
        from.readable().await?;
        let chunk = SCRATCH.with(|s| -> io::Result<Vec<u8>> {
            let mut buf = s.borrow_mut();
            let want = (buf.len() as u64).min(left) as usize;
            match from.try_read(&mut buf[..want]) {
                Ok(0) => Err(io::ErrorKind::UnexpectedEof.into()),
                Ok(n) => {
                    left -= n as u64;
                    let written = match to.try_write(&buf[..n]) {
                        Ok(w) => w,
                        Err(e) if e.kind() == io::ErrorKind::WouldBlock => 0,
                        Err(e) => return Err(e),
                    };
                    Ok(buf[written..n].to_vec())
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => Ok(Vec::new()),
                Err(e) => Err(e),
            }
        })?;
        if !chunk.is_empty() {
            to.write_all(&chunk).await?;
        }
    }
    Ok(())
}
