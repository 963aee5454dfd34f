//! The commands of every server (`broadcast = true` on a memcached listener): `flush_all`,
//! `verbosity` and `stats` sent to each server of the pool, and their answers joined into one.

use std::sync::atomic::Ordering::Relaxed;

use keyroute_cache_proto::memcache::{self as codec, Broadcast};

use super::{Memcached, Pending};
use crate::driver::Batch;
use crate::servers::Slot;

/// How a broadcast's answers become the client's.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Every {
    /// `flush_all`, `verbosity`, `stats reset`: this line (`OK`, `RESET`) when every server
    /// answered it, else `SERVER_ERROR`, naming the command and how many failed.
    Same { name: &'static str, line: &'static [u8] },
    /// `stats [GROUP]`: every server's lines under its name (`STAT NAME:FIELD VALUE`), after the
    /// proxy's own when `own` (the bare `stats`), to one `END`.
    Stats { own: bool },
}

/// A command of every server (`broadcast = true`), sent to each server of the batch's table
/// (healthy or not: a server left out would keep what the others flushed); each answer is read,
/// so that the client hears whether every server did it.
pub(super) async fn plan(b: &mut Batch<'_, Memcached>, cmd: Broadcast<'_>, noreply: bool) -> Pending {
    let every = match cmd {
        Broadcast::Stats { group: Some(b"reset") } => Every::Same { name: "stats reset", line: b"RESET\r\n" },
        Broadcast::Stats { group } => Every::Stats { own: group.is_none() },
        _ => Every::Same { name: cmd.name(), line: b"OK\r\n" },
    };
    let request = cmd.request();
    let (mut parts, mut unreachable) = (Vec::new(), 0);
    for node in 0..b.snap.workers().len() {
        let Some(server) = b.connect(node).await else {
            unreachable += 1;
            continue;
        };
        b.sent(node);
        b.servers.0[server].out.extend_from_slice(&request);
        parts.push((server, node));
    }
    Pending::Broadcast { every, parts, unreachable, noreply }
}

/// A broadcast's answer to the client, from each server's (see [`Every`]).
pub(super) fn answer(
    b: &mut Batch<'_, Memcached>,
    every: Every,
    parts: &[(usize, usize)],
    unreachable: usize,
    noreply: bool,
    slots: &[Slot],
    arena: &[u8],
) {
    let total = parts.len() + unreachable;
    let mut failed = unreachable;
    let mut lines = Vec::new();
    for (&(_, node), result) in parts.iter().zip(slots) {
        let answer = match result {
            Ok(range) => &arena[range.clone()],
            Err(_) => {
                b.failed(node);
                failed += 1;
                continue;
            }
        };
        b.succeeded(node);
        match every {
            Every::Same { line, .. } => failed += usize::from(answer != line),
            Every::Stats { .. } => {
                let name = b.worker(node).name.as_bytes();
                let mut ended = false;
                let mut at = 0;
                while let Some((n, l)) = codec::line(&answer[at..]) {
                    at += n;
                    let (kind, rest) = l.split_at(l.len().min(5));
                    if kind == b"STAT " || kind == b"ITEM " {
                        lines.extend_from_slice(kind);
                        lines.extend_from_slice(name);
                        lines.push(b':');
                        lines.extend_from_slice(rest);
                        lines.extend_from_slice(b"\r\n");
                    } else {
                        ended = l == b"END";
                    }
                }
                failed += usize::from(!ended);
            }
        }
    }
    if noreply {
        return;
    }
    match every {
        Every::Same { name, line } => {
            if failed == 0 {
                b.out.extend_from_slice(line);
            } else {
                let why = format!("SERVER_ERROR {name} failed on {failed} of {total} servers\r\n");
                b.out.extend_from_slice(why.as_bytes());
            }
        }
        Every::Stats { own } => {
            if own {
                own_stats(b, total, failed);
            }
            b.out.extend_from_slice(&lines);
            b.out.extend_from_slice(b"END\r\n");
        }
    }
}

/// The proxy's own `stats` lines (mcrouter answers `stats` with its own figures too): what
/// memcached's clients read first (`pid`, `uptime`, `time`, `version`, `pointer_size`), and the
/// pool's servers, how many did not answer this `stats`, and the commands no server could take.
fn own_stats(b: &mut Batch<'_, Memcached>, servers: usize, failed: usize) {
    use std::fmt::Write as _;
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let mut s = String::new();
    let _ = write!(
        s,
        "STAT pid {}\r\nSTAT uptime {}\r\nSTAT time {now}\r\nSTAT version keyroute-{}\r\nSTAT pointer_size {}\r\n\
         STAT servers {servers}\r\nSTAT servers_failed {failed}\r\nSTAT no_server {}\r\n",
        std::process::id(),
        crate::started().elapsed().as_secs(),
        env!("CARGO_PKG_VERSION"),
        usize::BITS,
        b.pool.metrics.no_worker.load(Relaxed),
    );
    b.out.extend_from_slice(s.as_bytes());
}
