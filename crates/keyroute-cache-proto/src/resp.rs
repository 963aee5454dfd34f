//! RESP2 and RESP3, sans IO: a client's command (an array of bulk strings, or an inline line) parsed in
//! place, the length of one server reply in a buffer, and the elements of an array reply.

use std::ops::Range;

/// The most arguments a command may have.
pub const MAX_ARGS: usize = 1 << 20;

/// The longest inline command line.
pub const MAX_INLINE: usize = 64 * 1024;

/// Why a request cannot be read: answered with this error, and the connection closes (nothing
/// after it can be framed).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unframed(pub &'static str);

/// A request's arguments.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Args {
    /// An array of bulk strings: ranges of the buffer. The request's bytes are framed exactly as
    /// Redis frames them (see [`request`]), so they may be sent on as they are.
    Bulk(Vec<Range<usize>>),
    /// An inline command, split as Redis splits it (quotes and escapes resolved): the request
    /// must be sent on re-encoded as an array ([`command`]), never as its line.
    Inline(Vec<Vec<u8>>),
}

/// A whole request: its length in the buffer, and its arguments.
pub type Request = (usize, Args);

/// A whole request framed by [`request_into`]: its length, and an inline command's words.
pub type Framed = (usize, Option<Vec<Vec<u8>>>);

/// One request at the start of `buf`: its length and its arguments, or `None` when it is not all
/// there. `max_bulk` bounds each argument.
///
/// A request is accepted only as Redis itself would read it, so that nothing a client sends can
/// make a server close a connection that other clients' commands share: the lengths are Redis's
/// integers (`string2ll`: digits, no `+`, no leading zero, at most one `-`), a bulk is followed
/// by CRLF, and an inline line is split by Redis's rules (`sdssplitargs`: double quotes with
/// `\n`, `\xHH`... escapes, single quotes, a closing quote followed by a space or the end).
///
/// # Errors
///
/// A request that Redis would refuse, or too large: [`Unframed`], with Redis's own message.
pub fn request(buf: &[u8], max_bulk: usize) -> Result<Option<Request>, Unframed> {
    let mut ranges = Vec::new();
    Ok(request_into(buf, max_bulk, &mut ranges)?.map(|(n, inline)| match inline {
        Some(words) => (n, Args::Inline(words)),
        None => (n, Args::Bulk(ranges)),
    }))
}

/// [`request`], with an array's argument ranges written to `ranges` (emptied first) so that a
/// caller who keeps the list allocates nothing per request: the request's length, and an inline
/// command's words (`Some`, `ranges` then empty).
///
/// # Errors
///
/// As [`request`].
pub fn request_into(buf: &[u8], max_bulk: usize, ranges: &mut Vec<Range<usize>>) -> Result<Option<Framed>, Unframed> {
    ranges.clear();
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
        let args =
            split_inline(&buf[..line_end]).ok_or(Unframed("ERR Protocol error: unbalanced quotes in request"))?;
        if args.iter().any(|a| a.len() > max_bulk) {
            return Err(Unframed("ERR Protocol error: invalid bulk length"));
        }
        return Ok(Some((end + 1, Some(args))));
    }
    let Some((n, mut at)) = header(buf, 0, "ERR Protocol error: invalid multibulk length")? else {
        return Ok(None);
    };
    // Redis reads a count of zero or less as a request of nothing.
    let count = usize::try_from(n.max(0)).map_err(|_| Unframed("ERR Protocol error: invalid multibulk length"))?;
    if count > MAX_ARGS {
        return Err(Unframed("ERR Protocol error: invalid multibulk length"));
    }
    ranges.reserve(count.min(64));
    for _ in 0..count {
        if at >= buf.len() {
            return Ok(None);
        }
        if buf[at] != b'$' {
            return Err(Unframed("ERR Protocol error: expected '$'"));
        }
        let Some((len, body)) = header(buf, at, "ERR Protocol error: invalid bulk length")? else { return Ok(None) };
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
        ranges.push(body..end);
        at = end + 2;
    }
    Ok(Some((at, None)))
}

/// An integer as Redis reads one (`string2ll`): `0`, or an optional `-` and digits that do not
/// start with `0`, within `i64`. Anything else (`+3`, `01`, `-0`, spaces) is not a number.
pub fn redis_integer(text: &[u8]) -> Option<i64> {
    if text == b"0" {
        return Some(0);
    }
    let (negative, digits) = match text.strip_prefix(b"-") {
        Some(d) => (true, d),
        None => (false, text),
    };
    if !matches!(digits.first(), Some(b'1'..=b'9')) || !digits.iter().all(u8::is_ascii_digit) || digits.len() > 19 {
        return None;
    }
    let magnitude: u64 = std::str::from_utf8(digits).ok()?.parse().ok()?;
    if negative { 0i64.checked_sub_unsigned(magnitude) } else { i64::try_from(magnitude).ok() }
}

/// An inline command line split into arguments as Redis splits it (`sdssplitargs`), or `None`
/// for unbalanced quotes (Redis then answers a protocol error and closes the connection).
///
/// Blanks separate arguments; `"..."` takes the escapes `\n`, `\r`, `\t`, `\b`, `\a`,
/// `\xHH` and `\` before any other byte (that byte); `'...'` takes `\'`; a closing quote must be
/// followed by a blank or the end. A NUL byte ends the line, as it ends Redis's C string.
pub fn split_inline(line: &[u8]) -> Option<Vec<Vec<u8>>> {
    let line = &line[..line.iter().position(|&b| b == 0).unwrap_or(line.len())];
    // C's isspace, which skips the blanks before an argument.
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | b'\r' | 0x0b | 0x0c);
    let at = |i: usize| line.get(i).copied();
    let mut args = Vec::new();
    let mut i = 0;
    loop {
        while at(i).is_some_and(space) {
            i += 1;
        }
        if i >= line.len() {
            return Some(args);
        }
        let mut arg = Vec::new();
        // The quote an argument is inside, if any.
        let mut quote: Option<u8> = None;
        loop {
            let Some(c) = at(i) else {
                if quote.is_some() {
                    return None;
                }
                break;
            };
            match quote {
                Some(q) => {
                    let hex = |b: Option<u8>| b.and_then(|b| char::from(b).to_digit(16));
                    if q == b'"'
                        && c == b'\\'
                        && at(i + 1) == Some(b'x')
                        && let (Some(h), Some(l)) = (hex(at(i + 2)), hex(at(i + 3)))
                    {
                        arg.push((h * 16 + l) as u8);
                        i += 3;
                    } else if q == b'"'
                        && c == b'\\'
                        && let Some(e) = at(i + 1)
                    {
                        i += 1;
                        arg.push(match e {
                            b'n' => b'\n',
                            b'r' => b'\r',
                            b't' => b'\t',
                            b'b' => 0x08,
                            b'a' => 0x07,
                            other => other,
                        });
                    } else if q == b'\'' && c == b'\\' && at(i + 1) == Some(b'\'') {
                        i += 1;
                        arg.push(b'\'');
                    } else if c == q {
                        // A closing quote is followed by a blank or the end.
                        if at(i + 1).is_some_and(|n| !space(n)) {
                            return None;
                        }
                        i += 1;
                        break;
                    } else {
                        arg.push(c);
                    }
                }
                None => match c {
                    b' ' | b'\n' | b'\r' | b'\t' => {
                        i += 1;
                        break;
                    }
                    b'"' | b'\'' => quote = Some(c),
                    _ => arg.push(c),
                },
            }
            i += 1;
        }
        args.push(arg);
    }
}

/// The number after a type byte at `at` (`*N\r\n`, `$N\r\n`...), and where its line ends;
/// `invalid` is the error for a number Redis would not read.
fn header(buf: &[u8], at: usize, invalid: &'static str) -> Result<Option<(i64, usize)>, Unframed> {
    let Some(nl) = buf[at..].iter().position(|&b| b == b'\n') else {
        return if buf.len() - at > 32 { Err(Unframed(invalid)) } else { Ok(None) };
    };
    if nl == 0 {
        return Err(Unframed("ERR Protocol error: expected a type byte"));
    }
    let line = &buf[at + 1..at + nl];
    let line = line.strip_suffix(b"\r").ok_or(Unframed(invalid))?;
    let n = redis_integer(line).ok_or(Unframed(invalid))?;
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
pub fn reply_len(buf: &[u8]) -> Result<Option<usize>, Unframed> {
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
                let Some((n, body)) = header(buf, at, NOT_RESP.0)? else { return Ok(None) };
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
                let Some((n, body)) = header(buf, at, NOT_RESP.0)? else { return Ok(None) };
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

/// The answer to a greeting of one or several commands (what a proxy sends first on a new
/// server connection: `AUTH`, `HELLO 3`, `READONLY`): `None` while it is not all there (a reply a
/// command), else whether every reply accepted its command (a status, or `HELLO`'s map). An
/// answer that is not RESP accepted nothing.
pub fn greeted(greeting: &[u8], answer: &[u8]) -> Option<bool> {
    let mut ok = true;
    let (mut asked, mut answered) = (0, 0);
    while asked < greeting.len() {
        let Ok(Some((n, _))) = request(&greeting[asked..], usize::MAX) else { return Some(false) };
        asked += n;
        match reply_len(&answer[answered..]) {
            Ok(Some(m)) => {
                ok &= matches!(answer[answered], b'+' | b'%');
                answered += m;
            }
            Ok(None) => return None,
            Err(_) => return Some(false),
        }
    }
    Some(ok)
}

/// The elements of an array reply (each a whole reply), or `None` when `reply` is not an array.
pub fn elements(reply: &[u8]) -> Option<Vec<&[u8]>> {
    if reply.first() != Some(&b'*') {
        return None;
    }
    let (n, mut at) = header(reply, 0, "").ok()??;
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
pub fn hash_tag(key: &[u8]) -> &[u8] {
    if let Some(open) = key.iter().position(|&b| b == b'{')
        && let Some(len) = key[open + 1..].iter().position(|&b| b == b'}')
        && len > 0
    {
        return &key[open + 1..open + 1 + len];
    }
    key
}

/// A bulk string.
pub fn bulk(out: &mut Vec<u8>, b: &[u8]) {
    out.push(b'$');
    decimal(out, b.len());
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(b);
    out.extend_from_slice(b"\r\n");
}

/// `n` in decimal digits, written without an allocation (a length is written for every argument
/// of every command a proxy sends).
fn decimal(out: &mut Vec<u8>, mut n: usize) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

/// A command of these arguments, as an array of bulk strings.
pub fn command<'a>(out: &mut Vec<u8>, args: impl ExactSizeIterator<Item = &'a [u8]>) {
    out.push(b'*');
    decimal(out, args.len());
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
        let owned: Vec<Vec<u8>> = match &args {
            Args::Bulk(ranges) => {
                for a in ranges {
                    assert!(a.start <= a.end && a.end <= n && a.len() <= max_bulk);
                }
                ranges.iter().map(|r| bytes[r.clone()].to_vec()).collect()
            }
            Args::Inline(words) => {
                assert!(words.iter().all(|w| w.len() <= max_bulk && w.len() <= n));
                words.clone()
            }
        };
        // What is sent on (an inline command re-encoded) reads back as the same arguments.
        let mut encoded = Vec::new();
        command(&mut encoded, owned.iter().map(Vec::as_slice));
        match request(&encoded, max_bulk) {
            Ok(Some((m, Args::Bulk(ranges)))) => {
                assert_eq!(m, encoded.len());
                let again: Vec<&[u8]> = ranges.iter().map(|r| &encoded[r.clone()]).collect();
                assert_eq!(again, owned.iter().map(Vec::as_slice).collect::<Vec<_>>());
            }
            other => panic!("a re-encoded request does not read back: {other:?}"),
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

    #[test]
    fn a_greeting_is_answered_by_a_reply_a_command() {
        let mut g = Vec::new();
        command(&mut g, [&b"AUTH"[..], b"pw"].into_iter());
        command(&mut g, [&b"READONLY"[..]].into_iter());
        assert_eq!(greeted(&g, b""), None);
        assert_eq!(greeted(&g, b"+OK\r\n"), None);
        assert_eq!(greeted(&g, b"+OK\r\n+O"), None);
        assert_eq!(greeted(&g, b"+OK\r\n+OK\r\n"), Some(true));
        assert_eq!(greeted(&g, b"-WRONGPASS x\r\n+OK\r\n"), Some(false));
        assert_eq!(greeted(&g, b"+OK\r\n-ERR cluster support disabled\r\n"), Some(false));
        assert_eq!(greeted(&g, b"?\r\n"), Some(false));
        // HELLO's map is an acceptance.
        let mut hello = Vec::new();
        command(&mut hello, [&b"HELLO"[..], b"3"].into_iter());
        assert_eq!(greeted(&hello, b"%1\r\n+server\r\n+redis\r\n"), Some(true));
        assert_eq!(greeted(&hello, b"%1\r\n+server\r\n"), None);
    }

    #[test]
    fn lengths_are_written_in_decimal() {
        for n in [0usize, 1, 9, 10, 99, 100, 12_345, usize::MAX] {
            let mut out = Vec::new();
            decimal(&mut out, n);
            assert_eq!(out, n.to_string().into_bytes());
        }
        let mut out = Vec::new();
        command(&mut out, [&b"SET"[..], b"k", &[b'v'; 12]].into_iter());
        assert_eq!(out, b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$12\r\nvvvvvvvvvvvv\r\n");
    }

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

    fn args(buf: &[u8]) -> Vec<Vec<u8>> {
        let (n, a) = request(buf, 1024).expect("valid").expect("whole");
        assert_eq!(n, buf.len());
        match a {
            Args::Bulk(ranges) => ranges.into_iter().map(|r| buf[r].to_vec()).collect(),
            Args::Inline(words) => words,
        }
    }

    /// Issue 31 (1): every length Redis refuses is refused here too, with Redis's message, so a
    /// client's line never reaches a server connection that other clients share.
    #[test]
    fn lengths_redis_refuses_are_refused() {
        for (bad, why) in [
            (&b"*02\r\n$3\r\nGET\r\n$1\r\nk\r\n"[..], "ERR Protocol error: invalid multibulk length"),
            (b"*+2\r\n$3\r\nGET\r\n$1\r\nk\r\n", "ERR Protocol error: invalid multibulk length"),
            (b"*-0\r\n", "ERR Protocol error: invalid multibulk length"),
            (b"* 1\r\n$3\r\nGET\r\n", "ERR Protocol error: invalid multibulk length"),
            (b"*1\r\n$+3\r\nGET\r\n", "ERR Protocol error: invalid bulk length"),
            (b"*1\r\n$03\r\nGET\r\n", "ERR Protocol error: invalid bulk length"),
            (b"*2\r\n$3\r\nGET\r\n$01\r\nk\r\n", "ERR Protocol error: invalid bulk length"),
            (b"*1\r\n$-1\r\n", "ERR Protocol error: invalid bulk length"),
            (b"*1\r\n$3 \r\nGET\r\n", "ERR Protocol error: invalid bulk length"),
        ] {
            assert_eq!(request(bad, 1024), Err(Unframed(why)), "{}", String::from_utf8_lossy(bad));
        }
        // What Redis takes: zero, and a count of nothing.
        assert_eq!(args(b"*1\r\n$0\r\n\r\n"), [b"".to_vec()]);
        assert_eq!(args(b"*0\r\n"), Vec::<Vec<u8>>::new());
        assert_eq!(args(b"*-1\r\n"), Vec::<Vec<u8>>::new());
        for (text, n) in
            [(&b"0"[..], Some(0)), (b"-1", Some(-1)), (b"10", Some(10)), (b"9223372036854775807", Some(i64::MAX))]
        {
            assert_eq!(redis_integer(text), n);
        }
        for text in [&b""[..], b"-", b"+1", b"01", b"-0", b"1 ", b" 1", b"9223372036854775808", b"1e3"] {
            assert_eq!(redis_integer(text), None, "{}", String::from_utf8_lossy(text));
        }
    }

    /// Issue 31 (1, 5): inline commands split as Redis splits them (`sdssplitargs`); unbalanced
    /// quotes are refused; a quoted key is the key Redis stores.
    #[test]
    fn inline_commands_split_as_redis_splits_them() {
        for (line, words) in [
            (&b"SET \"qk1\" v\r\n"[..], vec![&b"SET"[..], b"qk1", b"v"]),
            (b"SET 'a b' \"c\\x41\\n\\\"d\"\r\n", vec![b"SET", b"a b", b"cA\n\"d"]),
            (b"set ab\"cd\" 'it\\'s'\n", vec![b"set", b"abcd", b"it's"]),
            (b"  PING\t\thello  \r\n", vec![b"PING", b"hello"]),
            (b"GET \"\"\r\n", vec![b"GET", b""]),
            (b"GET k\0ignored\r\n", vec![b"GET", b"k"]),
            (b"\r\n", vec![]),
        ] {
            let got = args(line);
            let want: Vec<Vec<u8>> = words.into_iter().map(<[u8]>::to_vec).collect();
            assert_eq!(got, want, "{}", String::from_utf8_lossy(line));
        }
        for bad in
            [&b"SET k \"abc\r\n"[..], b"SET k 'abc\r\n", b"SET k \"abc\"x\r\n", b"SET k 'a'b\r\n", b"GET \"k\\\"\r\n"]
        {
            assert_eq!(
                request(bad, 1024),
                Err(Unframed("ERR Protocol error: unbalanced quotes in request")),
                "{}",
                String::from_utf8_lossy(bad)
            );
        }
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
