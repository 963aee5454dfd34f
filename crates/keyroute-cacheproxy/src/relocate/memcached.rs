//! The memcached side of a move: `lru_crawler metadump all` lists a server's keys (with their
//! sizes); each key is read with `mg` (value, client flags, remaining TTL), added on its new
//! owner with `ms ... ME`, and deleted from the old one with `md` once the new one has it.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Found, MoveError, Options, Outcome, server_error};
use crate::conn::ServerConn;
use keyroute_cache_proto::memcache::valid_key;

/// memcached reads a TTL above this many seconds as a Unix time.
const RELATIVE_TTL_MAX: i64 = 60 * 60 * 24 * 30;

/// One connection to a memcached server, used one pipeline at a time: the cache proxy's
/// [`ServerConn`], each exchange bounded by the move's timeout.
struct Conn {
    conn: ServerConn,
    timeout: Duration,
}

impl Conn {
    async fn open(addr: SocketAddr, timeout: Duration) -> Result<Conn, MoveError> {
        let conn = ServerConn::open(addr, timeout).await.map_err(|e| match e.kind() {
            std::io::ErrorKind::TimedOut => server_error(addr, "connect timed out"),
            _ => server_error(addr, format!("cannot connect: {e}")),
        })?;
        Ok(Conn { conn, timeout })
    }

    async fn write(&mut self, out: &[u8]) -> Result<(), MoveError> {
        let addr = self.conn.addr();
        match tokio::time::timeout(self.timeout, self.conn.write(out)).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(server_error(addr, format!("write: {e}"))),
            Err(_) => Err(server_error(addr, "timed out")),
        }
    }

    /// Reads until `n` bytes are buffered.
    async fn fill(&mut self, n: usize) -> Result<(), MoveError> {
        let addr = self.conn.addr();
        while self.conn.buffered().len() < n {
            match tokio::time::timeout(self.timeout, self.conn.fill()).await {
                Ok(Ok(0)) => return Err(server_error(addr, "closed the connection")),
                Ok(Ok(_)) => {}
                Ok(Err(e)) => return Err(server_error(addr, format!("read: {e}"))),
                Err(_) => return Err(server_error(addr, "timed out")),
            }
        }
        Ok(())
    }

    /// One line, without its CRLF.
    async fn line(&mut self) -> Result<Vec<u8>, MoveError> {
        loop {
            if let Some(nl) = self.conn.buffered().iter().position(|&b| b == b'\n') {
                let mut line = self.conn.take(nl + 1).to_vec();
                line.truncate(line.len().saturating_sub(if line.ends_with(b"\r\n") { 2 } else { 1 }));
                return Ok(line);
            }
            if self.conn.buffered().len() > 1 << 20 {
                return Err(server_error(self.conn.addr(), "sent a line longer than 1 MiB"));
            }
            let want = self.conn.buffered().len() + 1;
            self.fill(want).await?;
        }
    }
}

/// A server's keys, from `lru_crawler metadump all`, handed out a batch at a time.
///
/// The crawler walks each LRU while memcached's LRU maintainer moves items between its hot, warm
/// and cold parts, and an item moved behind the crawler during its walk is not listed (seen in
/// this project's tests: 1,199 of 1,200 fresh keys). So the dump runs twice and the keys of both
/// are taken: a key is missed only if both walks miss it.
pub(super) struct Dump {
    keys: std::vec::IntoIter<Found>,
    batch: usize,
}

/// How many times a server's keys are listed (see [`Dump`]).
const DUMPS: usize = 2;

impl Dump {
    pub(super) async fn open(server: SocketAddr, options: &Options) -> Result<Dump, MoveError> {
        let mut conn = Conn::open(server, options.timeout).await?;
        let mut keys = Vec::new();
        let mut seen = std::collections::HashSet::new();
        for _ in 0..DUMPS {
            // The crawler does one thing at a time: a busy one is asked again, for up to a minute.
            let mut busy = 0;
            'dump: loop {
                conn.write(b"lru_crawler metadump all\r\n").await?;
                loop {
                    let line = conn.line().await?;
                    if line == b"END" {
                        break 'dump;
                    }
                    if line.starts_with(b"BUSY") && busy < 600 {
                        busy += 1;
                        tokio::time::sleep(Duration::from_millis(100)).await;
                        continue 'dump;
                    }
                    if line.starts_with(b"ERROR")
                        || line.starts_with(b"CLIENT_ERROR")
                        || line.starts_with(b"SERVER_ERROR")
                        || line.starts_with(b"BUSY")
                    {
                        return Err(server_error(
                            server,
                            format!("refused lru_crawler metadump: {}", String::from_utf8_lossy(&line)),
                        ));
                    }
                    if let Some(found) = metadump_line(&line)
                        && seen.insert(found.key.clone())
                    {
                        keys.push(found);
                    }
                }
            }
        }
        Ok(Dump { keys: keys.into_iter(), batch: options.batch.max(1) })
    }

    pub(super) fn next(&mut self) -> Option<Vec<Found>> {
        let batch: Vec<Found> = self.keys.by_ref().take(self.batch).collect();
        (!batch.is_empty()).then_some(batch)
    }

    pub(super) fn finished(&self) -> bool {
        self.keys.len() == 0
    }
}

/// A metadump line's key (percent-decoded) and size: `key=K exp=.. la=.. cas=.. fetch=.. cls=..
/// size=N`. Keys that are not text keys (binary keys are shown in base64) are skipped.
fn metadump_line(line: &[u8]) -> Option<Found> {
    let mut key = None;
    let mut bytes = 0;
    let mut binary = false;
    for field in line.split(|&b| b == b' ') {
        if let Some(k) = field.strip_prefix(b"key=") {
            key = Some(percent_decode(k)?);
        } else if let Some(n) = field.strip_prefix(b"size=") {
            bytes = std::str::from_utf8(n).ok()?.parse().ok()?;
        } else if field == b"b" {
            binary = true;
        }
    }
    let key = key.filter(|k| !binary && valid_key(k))?;
    Some(Found { key, bytes })
}

/// A metadump key, percent-decoded (memcached writes keys URI-encoded): `None` when a `%` is not
/// followed by two hex digits (`%+1` is not an escape, though `u8::from_str_radix` takes `+1`), so
/// that a malformed line moves no key rather than a wrong one.
fn percent_decode(s: &[u8]) -> Option<Vec<u8>> {
    let escapes_valid = s
        .iter()
        .enumerate()
        .filter(|(_, b)| **b == b'%')
        .all(|(i, _)| s.get(i + 1..i + 3).is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)));
    escapes_valid.then(|| percent_encoding::percent_decode(s).collect())
}

/// A value read from the old server.
struct Item {
    flags: u32,
    /// Remaining seconds; `None`: never expires.
    ttl: Option<i64>,
    data: Vec<u8>,
}

/// Copies keys off one server and deletes them there.
pub(super) struct Copy {
    source: Conn,
    timeout: Duration,
    owners: Vec<Conn>,
}

impl Copy {
    pub(super) async fn open(source: SocketAddr, options: &Options) -> Result<Copy, MoveError> {
        Ok(Copy { source: Conn::open(source, options.timeout).await?, timeout: options.timeout, owners: Vec::new() })
    }

    /// Reads `keys` on the old server, adds them on `to`, and deletes on the old server those
    /// the new one stored or already had.
    pub(super) async fn send(&mut self, to: SocketAddr, keys: &[Vec<u8>]) -> Result<Outcome, MoveError> {
        let mut outcome = Outcome::default();
        let mut out = Vec::new();
        for k in keys {
            out.extend_from_slice(b"mg ");
            out.extend_from_slice(k);
            out.extend_from_slice(b" v f t\r\n");
        }
        self.source.write(&out).await?;
        let mut items = Vec::with_capacity(keys.len());
        for _ in keys {
            items.push(self.read_item().await?);
        }
        let at = match self.owners.iter().position(|c| c.conn.addr() == to) {
            Some(i) => i,
            None => {
                self.owners.push(Conn::open(to, self.timeout).await?);
                self.owners.len() - 1
            }
        };
        let now = unix_now();
        out.clear();
        let mut sent = Vec::new();
        for (k, item) in keys.iter().zip(&items) {
            let Some(item) = item else {
                outcome.vanished += 1;
                continue;
            };
            let ttl = match item.ttl {
                None => 0,
                Some(t) if t <= 0 => {
                    // Expiring now: not worth a copy.
                    outcome.vanished += 1;
                    continue;
                }
                Some(t) if t > RELATIVE_TTL_MAX => now.saturating_add(t),
                Some(t) => t,
            };
            out.extend_from_slice(
                format!("ms {} {} F{} T{ttl} ME\r\n", String::from_utf8_lossy(k), item.data.len(), item.flags)
                    .as_bytes(),
            );
            out.extend_from_slice(&item.data);
            out.extend_from_slice(b"\r\n");
            sent.push(k);
        }
        let owner = &mut self.owners[at];
        owner.write(&out).await?;
        let mut gone = Vec::new();
        for k in sent {
            let answer = owner.line().await?;
            match answer.as_slice() {
                b"HD" => {
                    outcome.moved += 1;
                    gone.push(k);
                }
                b"NS" => {
                    outcome.superseded += 1;
                    gone.push(k);
                }
                other => {
                    tracing::warn!(from = %self.source.conn.addr(), %to, key = %String::from_utf8_lossy(k), answer = %String::from_utf8_lossy(other), "a key could not be added on its new owner");
                    outcome.failed += 1;
                }
            }
        }
        out.clear();
        for k in &gone {
            out.extend_from_slice(b"md ");
            out.extend_from_slice(k);
            out.extend_from_slice(b"\r\n");
        }
        self.source.write(&out).await?;
        for _ in &gone {
            self.source.line().await?;
        }
        Ok(outcome)
    }

    /// An `mg KEY v f t` answer: `VA <len> f<flags> t<ttl>` and the data, or `EN`.
    async fn read_item(&mut self) -> Result<Option<Item>, MoveError> {
        let addr = self.source.conn.addr();
        let line = self.source.line().await?;
        if line == b"EN" {
            return Ok(None);
        }
        let garbled = || server_error(addr, format!("answered mg with '{}'", String::from_utf8_lossy(&line)));
        let text = std::str::from_utf8(&line).map_err(|_| garbled())?;
        let mut parts = text.split(' ');
        if parts.next() != Some("VA") {
            return Err(garbled());
        }
        let len: usize = parts.next().and_then(|n| n.parse().ok()).ok_or_else(garbled)?;
        let (mut flags, mut ttl) = (0, None);
        for p in parts {
            if let Some(f) = p.strip_prefix('f') {
                flags = f.parse().map_err(|_| garbled())?;
            } else if let Some(t) = p.strip_prefix('t') {
                let t: i64 = t.parse().map_err(|_| garbled())?;
                ttl = (t >= 0).then_some(t);
            }
        }
        let total = len.checked_add(2).ok_or_else(garbled)?;
        self.source.fill(total).await?;
        let data = self.source.conn.buffered()[..len].to_vec();
        self.source.conn.consume(total);
        Ok(Some(Item { flags, ttl, data }))
    }
}

fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    #[test]
    fn metadump_keys_are_decoded_strictly() {
        assert_eq!(super::percent_decode(b"a%2Bb%20c").as_deref(), Some(&b"a+b c"[..]));
        assert_eq!(super::percent_decode(b"plain").as_deref(), Some(&b"plain"[..]));
        for bad in [&b"%+1"[..], b"a%zz", b"a%2", b"%", b"%-1x"] {
            assert_eq!(super::percent_decode(bad), None, "{bad:?}");
        }
    }

    use super::*;

    #[test]
    fn metadump_lines() {
        let f = metadump_line(b"key=user%3A42%25 exp=-1 la=1700000000 cas=7 fetch=no cls=1 size=70").expect("a key");
        assert_eq!((f.key.as_slice(), f.bytes), (&b"user:42%"[..], 70));
        assert!(metadump_line(b"key=YWJj exp=-1 la=1 cas=1 fetch=no cls=1 size=60 b").is_none());
        assert!(metadump_line(b"key=bad%2 exp=-1").is_none());
        assert!(metadump_line(b"key=sp%20ace size=1").is_none(), "a key memcached's text protocol cannot carry");
        assert!(metadump_line(b"ERROR").is_none());
    }
}
