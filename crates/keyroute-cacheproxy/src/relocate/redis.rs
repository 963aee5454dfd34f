//! The Redis side of a move: `SCAN` (with `MEMORY USAGE` for the plan), `MIGRATE` without
//! `REPLACE`, and the check of each key on both servers after each batch.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;

use super::{Found, MoveError, Options, Outcome, server_error};
use crate::conn::ServerConn;
use keyroute_cache_proto::resp::{command, elements, reply_len};

/// One connection to a Redis server, used one pipeline at a time: the cache proxy's
/// [`ServerConn`], each exchange bounded by the move's timeout.
pub(super) struct Conn {
    addr: SocketAddr,
    conn: ServerConn,
    timeout: Duration,
}

/// A reply: a whole RESP2 value.
struct Reply(Bytes);

impl Reply {
    fn is_error(&self) -> bool {
        self.0.first() == Some(&b'-')
    }

    /// The first line without its type byte (a status, an error or an integer).
    fn line(&self) -> &str {
        let end = self.0.iter().position(|&b| b == b'\r').unwrap_or(self.0.len());
        std::str::from_utf8(self.0.get(1..end).unwrap_or_default()).unwrap_or("")
    }

    fn integer(&self) -> Option<i64> {
        (self.0.first() == Some(&b':')).then(|| self.line().parse().ok()).flatten()
    }
}

/// The payload of a bulk string reply.
fn bulk(reply: &[u8]) -> Option<&[u8]> {
    let rest = reply.strip_prefix(b"$")?;
    let nl = rest.iter().position(|&b| b == b'\n')?;
    let n: usize = std::str::from_utf8(&rest[..nl]).ok()?.trim_end().parse().ok()?;
    rest.get(nl + 1..nl + 1 + n)
}

impl Conn {
    pub(super) async fn open(addr: SocketAddr, password: Option<&str>, timeout: Duration) -> Result<Conn, MoveError> {
        let conn = ServerConn::open(addr, timeout).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => server_error(addr, "connect timed out"),
            _ => server_error(addr, format!("cannot connect: {e}")),
        })?;
        let mut conn = Conn { addr, conn, timeout };
        if let Some(password) = password {
            let mut out = Vec::new();
            command(&mut out, [&b"AUTH"[..], password.as_bytes()].into_iter());
            let reply = conn.call(&out, 1).await?;
            if reply[0].is_error() {
                return Err(server_error(addr, format!("refused AUTH: {}", reply[0].line())));
            }
        }
        Ok(conn)
    }

    /// Writes `out` (`n` commands) and reads their `n` replies.
    async fn call(&mut self, out: &[u8], n: usize) -> Result<Vec<Reply>, MoveError> {
        let addr = self.addr;
        let exchange = async {
            self.conn.write(out).await.map_err(|e| server_error(addr, format!("write: {e}")))?;
            let mut replies = Vec::with_capacity(n);
            while replies.len() < n {
                match reply_len(self.conn.buffered()) {
                    Ok(Some(len)) => replies.push(Reply(self.conn.take(len))),
                    Ok(None) => match self.conn.fill().await {
                        Ok(0) => return Err(server_error(addr, "closed the connection")),
                        Ok(_) => {}
                        Err(e) => return Err(server_error(addr, format!("read: {e}"))),
                    },
                    Err(_) => return Err(server_error(addr, "answered something that is not RESP2")),
                }
            }
            Ok(replies)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(r) => r,
            Err(_) => {
                // The connection is out of step now: nothing more is read from it.
                let n = self.conn.buffered().len();
                self.conn.consume(n);
                Err(server_error(addr, "timed out"))
            }
        }
    }

    /// Whether each key exists (one pipelined `EXISTS` per key).
    async fn exists(&mut self, keys: &[Vec<u8>]) -> Result<Vec<bool>, MoveError> {
        let mut out = Vec::new();
        for k in keys {
            command(&mut out, [&b"EXISTS"[..], k].into_iter());
        }
        let replies = self.call(&out, keys.len()).await?;
        Ok(replies.iter().map(|r| r.integer().unwrap_or(0) > 0).collect())
    }
}

/// A server's keys, by `SCAN`.
pub(super) struct Scan {
    conn: Conn,
    cursor: u64,
    finished: bool,
    batch: usize,
    sizes: bool,
}

impl Scan {
    pub(super) async fn open(
        server: SocketAddr,
        password: Option<&str>,
        options: &Options,
        cursor: u64,
        sizes: bool,
    ) -> Result<Scan, MoveError> {
        let conn = Conn::open(server, password, options.timeout).await?;
        Ok(Scan { conn, cursor, finished: false, batch: options.batch.max(1), sizes })
    }

    pub(super) fn cursor(&self) -> u64 {
        self.cursor
    }

    pub(super) fn finished(&self) -> bool {
        self.finished
    }

    /// The next batch of keys (with `MEMORY USAGE` when sizes are wanted); `None` after the last.
    pub(super) async fn next(&mut self) -> Result<Option<Vec<Found>>, MoveError> {
        if self.finished {
            return Ok(None);
        }
        let addr = self.conn.addr;
        let mut out = Vec::new();
        let (cursor, count) = (self.cursor.to_string(), self.batch.to_string());
        command(&mut out, [&b"SCAN"[..], cursor.as_bytes(), b"COUNT", count.as_bytes()].into_iter());
        let reply = self.conn.call(&out, 1).await?.remove(0);
        let garbled = || server_error(addr, "answered SCAN with something else than a cursor and keys");
        if reply.is_error() {
            return Err(server_error(addr, format!("refused SCAN: {}", reply.line())));
        }
        let parts = elements(&reply.0).ok_or_else(garbled)?;
        let [cursor, keys] = parts.as_slice() else { return Err(garbled()) };
        let next: u64 =
            bulk(cursor).and_then(|c| std::str::from_utf8(c).ok()).and_then(|c| c.parse().ok()).ok_or_else(garbled)?;
        let keys: Vec<Vec<u8>> = elements(keys)
            .ok_or_else(garbled)?
            .into_iter()
            .map(|k| bulk(k).map(<[u8]>::to_vec).ok_or_else(garbled))
            .collect::<Result<_, _>>()?;
        self.cursor = next;
        self.finished = next == 0;
        let mut bytes = vec![0u64; keys.len()];
        if self.sizes && !keys.is_empty() {
            out.clear();
            for k in &keys {
                command(&mut out, [&b"MEMORY"[..], b"USAGE", k].into_iter());
            }
            for (b, r) in bytes.iter_mut().zip(self.conn.call(&out, keys.len()).await?) {
                *b = r.integer().and_then(|n| u64::try_from(n).ok()).unwrap_or(0);
            }
        }
        Ok(Some(keys.into_iter().zip(bytes).map(|(key, bytes)| Found { key, bytes }).collect()))
    }
}

/// Moves keys off one server with `MIGRATE`.
pub(super) struct Migrate {
    source: Conn,
    password: Option<String>,
    timeout: Duration,
    /// Connections to the new owners, for the check.
    owners: Vec<Conn>,
}

impl Migrate {
    pub(super) async fn open(
        source: SocketAddr,
        password: Option<String>,
        options: &Options,
    ) -> Result<Migrate, MoveError> {
        let conn = Conn::open(source, password.as_deref(), options.timeout).await?;
        Ok(Migrate { source: conn, password, timeout: options.timeout, owners: Vec::new() })
    }

    /// `MIGRATE`s `keys` to `to`, then checks each on both servers: on the new owner and not the
    /// old, moved; on both (the new owner refused it: `BUSYKEY`), superseded and deleted from the
    /// old; on neither, vanished (expired or deleted meanwhile); only on the old, failed.
    pub(super) async fn send(&mut self, to: SocketAddr, keys: &[Vec<u8>]) -> Result<Outcome, MoveError> {
        let mut outcome = Outcome::default();
        if keys.is_empty() {
            return Ok(outcome);
        }
        let (host, port) = (to.ip().to_string(), to.port().to_string());
        let timeout_ms = self.timeout.as_millis().to_string();
        let mut args: Vec<&[u8]> = vec![b"MIGRATE", host.as_bytes(), port.as_bytes(), b"", b"0", timeout_ms.as_bytes()];
        if let Some(p) = &self.password {
            args.extend([&b"AUTH"[..], p.as_bytes()]);
        }
        args.push(b"KEYS");
        args.extend(keys.iter().map(Vec::as_slice));
        let mut out = Vec::new();
        command(&mut out, args.into_iter());
        let reply = self.source.call(&out, 1).await?.remove(0);
        if reply.is_error() && !reply.line().contains("BUSYKEY") {
            tracing::warn!(from = %self.source.addr, %to, error = reply.line(), "MIGRATE failed for some keys");
        }
        let at = match self.owners.iter().position(|c| c.addr == to) {
            Some(i) => i,
            None => {
                self.owners.push(Conn::open(to, self.password.as_deref(), self.timeout).await?);
                self.owners.len() - 1
            }
        };
        let on_old = self.source.exists(keys).await?;
        let on_new = self.owners[at].exists(keys).await?;
        let mut stale = Vec::new();
        for ((k, old), new) in keys.iter().zip(on_old).zip(on_new) {
            match (old, new) {
                (false, true) => outcome.moved += 1,
                (true, true) => stale.push(k.clone()),
                (false, false) => outcome.vanished += 1,
                (true, false) => {
                    tracing::warn!(from = %self.source.addr, %to, key = %String::from_utf8_lossy(k), "a key could not be moved");
                    outcome.failed += 1;
                }
            }
        }
        if !stale.is_empty() {
            out.clear();
            for k in &stale {
                command(&mut out, [&b"DEL"[..], k].into_iter());
            }
            self.source.call(&out, stale.len()).await?;
            outcome.superseded += stale.len() as u64;
        }
        Ok(outcome)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bulk_payloads_and_lines() {
        assert_eq!(bulk(b"$3\r\nabc\r\n"), Some(&b"abc"[..]));
        assert_eq!(bulk(b"$0\r\n\r\n"), Some(&b""[..]));
        assert_eq!(bulk(b"$5\r\nab\r\n"), None);
        assert_eq!(bulk(b"$-1\r\n"), None);
        assert_eq!(bulk(b":3\r\n"), None);
        let r = Reply(Bytes::from_static(b":42\r\n"));
        assert_eq!(r.integer(), Some(42));
        let e = Reply(Bytes::from_static(b"-BUSYKEY Target key name already exists.\r\n"));
        assert!(e.is_error() && e.line().starts_with("BUSYKEY"));
        assert_eq!(e.integer(), None);
    }
}
