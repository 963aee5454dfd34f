//! RESP2 and RESP3, sans IO: a client's command (an array of bulk strings, or an inline line) parsed in
//! place, the length of one server reply in a buffer, and the elements of an array reply.

use std::ops::Range;

/// The most arguments a command may have.
pub(crate) const MAX_ARGS: usize = 1 << 20;

/// The longest inline command line.
pub(crate) const MAX_INLINE: usize = 64 * 1024;

/// Why a request cannot be read: answered with this error, and the connection closes (nothing
/// after it can be framed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Unframed(pub(crate) &'static str);

/// A whole request: its length, and its arguments (ranges of the buffer).
pub(crate) type Request = (usize, Vec<Range<usize>>);

/// One request at the start of `buf`: its length and its arguments (ranges of `buf`), or `None`
/// when it is not all there. `max_bulk` bounds each argument.
///
/// # Errors
///
/// A request that is not RESP, or too large: [`Unframed`].
pub(crate) fn request(buf: &[u8], max_bulk: usize) -> Result<Option<Request>, Unframed> {
    let Some(&first) = buf.first() else { return Ok(None) };
    if first != b'*' {
        // An inline command: words of one line.
        let Some(end) = buf.iter().position(|&b| b == b'\n') else {
            return if buf.len() > MAX_INLINE {
                Err(Unframed("ERR Protocol error: too big inline request"))
            } else {
                Ok(None)
            };
        };
        let line_end = if end > 0 && buf[end - 1] == b'\r' { end - 1 } else { end };
        let mut args = Vec::new();
        let mut at = 0;
        while at < line_end {
            let start = at + buf[at..line_end].iter().position(|&b| b != b' ').unwrap_or(line_end - at);
            let stop = start + buf[start..line_end].iter().position(|&b| b == b' ').unwrap_or(line_end - start);
            if stop > start {
                args.push(start..stop);
            }
            at = stop;
        }
        return Ok(Some((end + 1, args)));
    }
    let Some((n, mut at)) = header(buf, 0)? else { return Ok(None) };
    let count = usize::try_from(n).map_err(|_| Unframed("ERR Protocol error: invalid multibulk length"))?;
    if count > MAX_ARGS {
        return Err(Unframed("ERR Protocol error: invalid multibulk length"));
    }
    let mut args = Vec::with_capacity(count.min(64));
    for _ in 0..count {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(Unframed("ERR Protocol error: expected '$'"));
        }
        let Some((len, body)) = header(buf, at)? else { return Ok(None) };
        let len = usize::try_from(len).map_err(|_| Unframed("ERR Protocol error: invalid bulk length"))?;
        if len > max_bulk {
            return Err(Unframed("ERR Protocol error: invalid bulk length"));
        }
        let end = body + len;
        if buf.len() < end + 2 {
            return Ok(None);
        }
        if &buf[end..end + 2] != b"\r\n" {
            return Err(Unframed("ERR Protocol error: bulk not followed by CRLF"));
        }
        args.push(body..end);
        at = end + 2;
    }
    Ok(Some((at, args)))
}

/// The number after a type byte at `at` (`*N\r\n`, `$N\r\n`...), and where its line ends.
fn header(buf: &[u8], at: usize) -> Result<Option<(i64, usize)>, Unframed> {
    let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') else {
        return if buf.len() - at > 32 { Err(Unframed("ERR Protocol error: invalid length")) } else { Ok(None) };
    };
    if nl == 0 {
        return Err(Unframed("ERR Protocol error: expected a type byte"));
    }
    let line = &buf[at + 1..at + nl];
    let line = line.strip_suffix(b"\r").ok_or(Unframed("ERR Protocol error: expected CRLF"))?;
    let n = std::str::from_utf8(line)
        .ok()
        .filter(|t| !t.is_empty() && t.len() <= 20)
        .and_then(|t| t.parse::<i64>().ok())
        .ok_or(Unframed("ERR Protocol error: invalid length"))?;
    Ok(Some((n, at + nl + 1)))
}

/// The length of one whole reply at the start of `buf`, if it is all there: RESP2's simple
/// strings, errors, integers, bulk strings and arrays (nested; the null bulk and the null array),
/// and RESP3's null (`_`), double (`,`), boolean (`#`), big number (`(`), blob error (`!`),
/// verbatim string (`=`), map (`%`, two elements per entry), set (`~`), push (`>`) and attribute
/// (`|`: its entries, then the value it describes).
///
/// # Errors
///
/// A reply that is neither.
pub(crate) fn reply_len(buf: &[u8]) -> Result<Option<usize>, Unframed> {
    const NOT_RESP: Unframed = Unframed("ERR server reply is not RESP");
    // Elements still to read, per open aggregate.
    let mut at = 0;
    let mut open: Vec<i64> = Vec::new();
    loop {
        let Some(&t) = buf.get(at) else { return Ok(None) };
        match t {
            b'+' | b'-' | b':' | b'_' | b',' | b'#' | b'(' => {
                let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') else { return Ok(None) };
                at += nl + 1;
            }
            b'$' | b'!' | b'=' => {
                let Some((n, body)) = header(buf, at)? else { return Ok(None) };
                at = if n < 0 {
                    body
                } else {
                    usize::try_from(n).ok().and_then(|n| body.checked_add(n)?.checked_add(2)).ok_or(NOT_RESP)?
                };
                if buf.len() < at {
                    return Ok(None);
                }
            }
            b'*' | b'~' | b'>' | b'%' | b'|' => {
                let Some((n, body)) = header(buf, at)? else { return Ok(None) };
                at = body;
                let n = match t {
                    b'%' => n.checked_mul(2).ok_or(NOT_RESP)?,
                    b'|' => n.checked_mul(2).and_then(|n| n.checked_add(1)).ok_or(NOT_RESP)?,
                    _ => n,
                };
                if n > 0 {
                    open.push(n);
                    continue;
                }
            }
            _ => return Err(NOT_RESP),
        }
        // One element ended: close the aggregates it completes.
        loop {
            match open.last_mut() {
                None => return Ok(Some(at)),
                Some(left) => {
                    *left -= 1;
                    if *left > 0 {
                        break;
                    }
                    open.pop();
                }
            }
        }
    }
}

/// The elements of an array reply (each a whole reply), or `None` when `reply` is not an array.
pub(crate) fn elements(reply: &[u8]) -> Option<Vec<&[u8]>> {
    if reply.first() != Some(&b'*') {
        return None;
    }
    let (n, mut at) = header(reply, 0).ok()??;
    if n < 0 {
        return None;
    }
    let mut out = Vec::with_capacity(usize::try_from(n).ok()?.min(1024));
    for _ in 0..n {
        let len = reply_len(&reply[at..]).ok()??;
        out.push(&reply[at..at + len]);
        at += len;
    }
    Some(out)
}

/// The part of `key` that places it: the text between the first `{` and the next `}` when there
/// is one between them (Redis Cluster's and twemproxy's hash tag), else the whole key.
pub(crate) fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// A bulk string.
pub(crate) fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'$');
    out.extend_from_slice(b.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// A command of these arguments, as an array of bulk strings.
pub(crate) fn command<'a>(out: &mut Vec<u8>, args: impl ExactSizeIterator<Item = &'a [u8]>) {
    out.push(b'*');
    out.extend_from_slice(args.len().to_string().as_bytes());
    out.extend_from_slice(b"\r\n");
    for a in args {
        bulk(out, a);
    }
}

/// The codec's invariants on arbitrary bytes (the fuzz target's and the seeded test's check):
/// never a panic; a request's arguments lie within it, each within `max_bulk`, and a prefix of it
/// is never a longer request; a reply's length is within its buffer, a prefix of it is never a
/// longer reply, and an array's elements are whole replies that tile it.
///
/// # Panics
///
/// When an invariant does not hold.
pub fn check_invariants(bytes: &[u8]) {
    let max_bulk = 4096;
    if let Ok(Some((n, args))) = request(bytes, max_bulk) {
        assert!(n <= bytes.len());
        for a in &args {
            assert!(a.start <= a.end && a.end <= n);
            assert!(bytes.first() != Some(&b'*') || a.len() <= max_bulk);
        }
        for cut in [n / 2, n.saturating_sub(1)] {
            if let Ok(Some((m, _))) = request(&bytes[..cut], max_bulk) {
                assert!(m <= cut);
            }
        }
    }
    if let Ok(Some(n)) = reply_len(bytes) {
        assert!(n <= bytes.len());
        for cut in [n / 2, n.saturating_sub(1)] {
            if let Ok(Some(m)) = reply_len(&bytes[..cut]) {
                assert!(m <= cut);
            }
        }
        if let Some(elements) = elements(&bytes[..n]) {
            let total: usize = elements.iter().map(|e| e.len()).sum();
            assert!(total <= n);
        }
    }
    let tag = hash_tag(bytes);
    assert!(tag.len() <= bytes.len());
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The invariants over 20,000 seeded mutations of real requests and replies (libFuzzer runs
    /// the same check longer: `fuzz/run.sh resp_codec`).
    #[test]
    fn invariants_hold_on_mutated_input() {
        let seeds: [&[u8]; 7] = [
            b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhello\r\n",
            b"PING  hello\r\n",
            b"*3\r\n$1\r\na\r\n$-1\r\n*2\r\n:1\r\n+x\r\n",
            b"$5\r\nhe\r\nl\r\n-ERR no\r\n",
            b"*-1\r\n*0\r\n:42\r\n",
            b"*2\r\n$99999999999999999999\r\n",
            b"$9223372036854775807\r\nx\r\n",
        ];
        crate::mutate::each_mutation(&seeds, b"*$:+-\r\n0123456789{}", 20_000, check_invariants);
    }

    fn args(buf: &[u8]) -> Vec<&[u8]> {
        let (n, a) = request(buf, 1024).expect("valid").expect("whole");
        assert_eq!(n, buf.len());
        a.into_iter().map(|r| &buf[r]).collect()
    }

    #[test]
    fn requests_as_redis_reads_them() {
        assert_eq!(args(b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$5\r\nhe\r\nl\r\n"), [&b"SET"[..], b"k", b"he\r\nl"]);
        assert_eq!(args(b"PING  hello\r\n"), [&b"PING"[..], b"hello"]);
        let whole = b"*2\r\n$3\r\nGET\r\n$3\r\nkey\r\n";
        for cut in 0..whole.len() {
            assert_eq!(request(&whole[..cut], 1024), Ok(None), "cut at {cut}");
        }
        assert!(request(b"*1\r\n$9999\r\n", 1024).is_err(), "a bulk over the limit");
        assert!(request(b"*1\r\n:3\r\n", 1024).is_err());
        assert!(request(b"*x\r\n", 1024).is_err());
        assert!(request(b"*1\r\n$1\r\nab\r\n", 1024).is_err(), "a bulk longer than it said");
    }

    #[test]
    fn replies_are_framed_whole() {
        for r in [
            &b"+OK\r\n"[..],
            b"-ERR no\r\n",
            b":42\r\n",
            b"$-1\r\n",
            b"$5\r\nhe\r\nl\r\n",
            b"*-1\r\n",
            b"*0\r\n",
            b"*3\r\n$1\r\na\r\n$-1\r\n*2\r\n:1\r\n+x\r\n",
        ] {
            assert_eq!(reply_len(r), Ok(Some(r.len())), "{}", String::from_utf8_lossy(r));
            for cut in 0..r.len() {
                assert_eq!(reply_len(&r[..cut]), Ok(None), "{} cut at {cut}", String::from_utf8_lossy(r));
            }
        }
        assert!(reply_len(b"?\r\n").is_err());
        // The largest length: no buffer reaches it, so the reply is never whole (its server's
        // answer times out), and nothing wraps.
        assert_eq!(reply_len(b"$9223372036854775807\r\n"), Ok(None));
        let e = elements(b"*3\r\n$1\r\na\r\n$-1\r\n*2\r\n:1\r\n+x\r\n").expect("array");
        assert_eq!(e, [&b"$1\r\na\r\n"[..], b"$-1\r\n", b"*2\r\n:1\r\n+x\r\n"]);
        assert_eq!(elements(b"+OK\r\n"), None);
    }

    #[test]
    fn hash_tags_as_redis_cluster_reads_them() {
        for (key, tag) in [
            (&b"{user1}.following"[..], &b"user1"[..]),
            (b"foo{}{bar}", b"foo{}{bar}"),
            (b"a{b}c{d}", b"b"),
            (b"{{a}}", b"{a"),
            (b"}{a}", b"a"),
            (b"plain", b"plain"),
        ] {
            assert_eq!(hash_tag(key), tag, "{}", String::from_utf8_lossy(key));
        }
    }
}
