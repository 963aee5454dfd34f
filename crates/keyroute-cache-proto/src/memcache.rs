//! The memcached text protocol as memcached 1.6 speaks it, sans IO: a client's command line
//! parsed in place, and the length of one server response in a buffer.
//!
//! | command | routed by | the server's answer |
//! |---|---|---|
//! | `get`/`gets` `KEY...`, `gat`/`gats` `EXPTIME KEY...` | each key (split by owner, merged in the client's order) | `VALUE` blocks, `END` |
//! | `set`/`add`/`replace`/`append`/`prepend` `KEY FLAGS EXPTIME BYTES [noreply]`, `cas ... CAS [noreply]` + data | the key | one line |
//! | `delete KEY [noreply]`, `incr`/`decr KEY N [noreply]`, `touch KEY EXPTIME [noreply]` | the key | one line |
//! | `mg`/`md`/`ma KEY FLAGS...`, `ms KEY SIZE FLAGS...` + data | the key (`b`: base64, decoded to place) | one line, or `VA` + data |
//! | `mn` | - | `MN`, answered by the proxy in order |
//! | `version` | - | the proxy's `VERSION` |
//! | `quit` | - | the connection closes |
//! | `flush_all [DELAY] [noreply]`, `verbosity LEVEL [noreply]`, `stats [GROUP]` | every server ([`Broadcast`]) | `OK`; `STAT` lines to `END` (`RESET` for `stats reset`) |
//!
//! The commands of every server ([`Command::Broadcast`]) are parsed here; a listener that does not
//! broadcast refuses them ([`Refused::NotProxied`]). Anything else (`lru_crawler`, `watch`,
//! `slabs`...) concerns one server, not a key: it is refused with `CLIENT_ERROR`, saying so
//! (twemproxy refuses them too).
//! Keys are 1 to 250 bytes without control bytes or spaces, as memcached takes them; anything else
//! is `CLIENT_ERROR bad command line format`, the line memcached gives.

/// A meta command's base64 key (`b` flag), decoded: standard, padded base64 (RFC 4648 section
/// 4), as memcached reads it; non-zero trailing bits are refused, so one key has one spelling.
fn base64_decode(text: &[u8]) -> Option<Vec<u8>> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.decode(text).ok()
}

/// A key as a meta command names it: as it is when memcached takes it so, else in base64 with
/// the `b` flag (a key that came decoded from one).
pub fn meta_key(key: &[u8]) -> Vec<u8> {
    use base64::Engine as _;
    if valid_key(key) {
        return key.to_vec();
    }
    let mut k = base64::engine::general_purpose::STANDARD.encode(key).into_bytes();
    k.extend_from_slice(b" b");
    k
}

/// The longest key memcached takes.
pub const MAX_KEY: usize = 250;

/// The longest command line read (a `get` of many keys): past it, `CLIENT_ERROR line too long`
/// and the connection closes (memcached closes too: it cannot find the next command).
pub const MAX_LINE: usize = 64 * 1024;

/// What a retrieval command is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Retrieval {
    Get,
    Gets,
    Gat,
    Gats,
}

/// The kind of one-key command, for framing its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Answer {
    /// One line.
    Line,
    /// A meta answer: one line, and a data block after a `VA SIZE` line.
    Meta,
    /// `stats`: `STAT` (or `ITEM`) lines, to the first other line (`END`, `RESET`, an error).
    Stats,
}

/// A command of every server, not of a key: sent to each server of the pool by a listener that
/// broadcasts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broadcast<'a> {
    /// `flush_all [DELAY]`: every item invalid now, or in `DELAY` seconds.
    FlushAll { delay: Option<&'a [u8]> },
    /// `verbosity LEVEL`.
    Verbosity { level: &'a [u8] },
    /// `stats [GROUP]`: the bare `stats`, or one of [`STATS_GROUPS`]; `reset` zeroes counters.
    Stats { group: Option<&'a [u8]> },
}

impl Broadcast<'_> {
    /// The command's name, as a client types it.
    pub fn name(&self) -> &'static str {
        match self {
            Broadcast::FlushAll { .. } => "flush_all",
            Broadcast::Verbosity { .. } => "verbosity",
            Broadcast::Stats { .. } => "stats",
        }
    }

    /// The line sent to each server (with its CRLF; never `noreply`: the proxy reads every
    /// server's answer to say whether all did it).
    pub fn request(&self) -> Vec<u8> {
        let mut line = self.name().as_bytes().to_vec();
        let arg = match self {
            Broadcast::FlushAll { delay } => *delay,
            Broadcast::Verbosity { level } => Some(*level),
            Broadcast::Stats { group } => *group,
        };
        if let Some(a) = arg {
            line.push(b' ');
            line.extend_from_slice(a);
        }
        line.extend_from_slice(b"\r\n");
        line
    }

    /// How each server's answer is framed.
    pub fn answer(&self) -> Answer {
        match self {
            Broadcast::Stats { .. } => Answer::Stats,
            _ => Answer::Line,
        }
    }
}

/// The `stats` groups a broadcasting listener passes to its servers (each answers `STAT` lines
/// to `END`, or `RESET`). `stats detail` and `stats cachedump` are left out: they concern one
/// server's internals, not the pool.
pub const STATS_GROUPS: [&str; 7] = ["settings", "items", "slabs", "sizes", "conns", "extstore", "reset"];

/// A parsed command line (slices of the line as read).
#[derive(Debug, PartialEq, Eq)]
pub enum Command<'a> {
    /// `get`, `gets`, `gat`, `gats`: `exptime` for the last two; `keys`, the keys as the line
    /// lists them (valid, separated by spaces: see [`Keys`]).
    Retrieve { kind: Retrieval, exptime: Option<&'a [u8]>, keys: Keys<'a> },
    /// A command about one key, forwarded as its line (plus `data` bytes and CRLF after it).
    Keyed {
        /// The bytes placed: the key, decoded when a meta command says base64.
        key: std::borrow::Cow<'a, [u8]>,
        /// Bytes of data that follow the line (without their CRLF), for storage commands.
        data: Option<usize>,
        /// The client asked for no answer (`noreply`), or a meta command's quiet mode (`q`).
        quiet: bool,
        /// Whether the answer is a meta answer.
        answer: Answer,
    },
    /// `mn`.
    MetaNoop,
    /// `version`.
    Version,
    /// A command of every server; `noreply`: the client wants no answer.
    Broadcast { cmd: Broadcast<'a>, noreply: bool },
    /// `quit`.
    Quit,
}

/// A retrieval's keys: the part of its line that lists them, each checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Keys<'a>(&'a [u8]);

impl<'a> Keys<'a> {
    /// Each key, in the line's order.
    pub fn iter(self) -> impl Iterator<Item = &'a [u8]> {
        self.0.split(|&b| b == b' ').filter(|w| !w.is_empty())
    }

    /// The only key, when there is one.
    pub fn single(self) -> Option<&'a [u8]> {
        let mut it = self.iter();
        let first = it.next()?;
        it.next().is_none().then_some(first)
    }
}

/// The most words a command other than a retrieval may have (meta commands take many flags).
const MAX_WORDS: usize = 40;

/// Why a command line was refused; each is one line to the client.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Refused {
    /// Not a command memcached knows: `ERROR`.
    Unknown,
    /// A command of one server, not of a key.
    NotProxied(&'static str),
    /// A bad key or field: `CLIENT_ERROR bad command line format`.
    Format,
    /// A storage command refused for a bad key or field, whose data length could be read: the
    /// same line, and its block (`skip` bytes, with its CRLF) is skipped as memcached swallows
    /// it, so that the data never runs as a command.
    FormatSkip { skip: usize },
    /// A storage command whose data length cannot be read (not a number, negative, past
    /// memcached's `INT_MAX - 2`): `CLIENT_ERROR bad command line format`, and the connection
    /// closes: where its data ends cannot be known, and the data must not run as commands.
    Unframed,
    /// A data block longer than the item size limit: the block is skipped.
    TooLarge { skip: usize },
    /// Refused without a word, as memcached refuses `verbosity noreply` (the `noreply` it read
    /// silences the refusal).
    Quiet,
}

impl Refused {
    /// The line sent to the client.
    pub fn line(&self) -> Vec<u8> {
        match self {
            Refused::Unknown => b"ERROR\r\n".to_vec(),
            Refused::NotProxied(cmd) => {
                format!("CLIENT_ERROR '{cmd}' concerns one server, not a key: keyroute does not proxy it\r\n")
                    .into_bytes()
            }
            Refused::Format | Refused::FormatSkip { .. } | Refused::Unframed => {
                b"CLIENT_ERROR bad command line format\r\n".to_vec()
            }
            Refused::TooLarge { .. } => b"SERVER_ERROR object too large for cache\r\n".to_vec(),
            Refused::Quiet => Vec::new(),
        }
    }
}

/// Commands of one server that are refused by name.
const SERVER_COMMANDS: [&str; 9] =
    ["lru_crawler", "watch", "slabs", "lru", "cache_memlimit", "shutdown", "misbehave", "me", "extstore"];

pub fn valid_key(k: &[u8]) -> bool {
    !k.is_empty() && k.len() <= MAX_KEY && k.iter().all(|&b| b > b' ' && b != 0x7f)
}

fn number(b: &[u8]) -> Option<u64> {
    if b.is_empty() || b.len() > 20 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// A data block's length as memcached reads it (`safe_strtol` into 32 bits, then at most
/// `INT_MAX - 2`), or `None` when it cannot be trusted.
fn data_length(b: &[u8]) -> Option<usize> {
    number(b).filter(|&n| n <= u64::from(i32::MAX.unsigned_abs() - 2)).and_then(|n| usize::try_from(n).ok())
}

/// A signed number (exptime may be negative).
fn signed(b: &[u8]) -> bool {
    let digits = b.strip_prefix(b"-").unwrap_or(b);
    number(digits).is_some()
}

/// Parses one command line (without its CRLF). `max_item` bounds a storage command's data.
///
/// # Errors
///
/// [`Refused`]: what to answer instead.
pub fn parse(line: &[u8], max_item: usize) -> Result<Command<'_>, Refused> {
    let start = line.iter().position(|&b| b != b' ').unwrap_or(line.len());
    let line = &line[start..];
    let cmd_len = line.iter().position(|&b| b == b' ').unwrap_or(line.len());
    let (cmd, rest) = line.split_at(cmd_len);
    if cmd.is_empty() {
        return Err(Refused::Unknown);
    }
    if let Some(kind) = match cmd {
        b"get" => Some(Retrieval::Get),
        b"gets" => Some(Retrieval::Gets),
        b"gat" => Some(Retrieval::Gat),
        b"gats" => Some(Retrieval::Gats),
        _ => None,
    } {
        let mut rest = rest;
        let exptime = if matches!(kind, Retrieval::Gat | Retrieval::Gats) {
            let trimmed = &rest[rest.iter().position(|&b| b != b' ').unwrap_or(rest.len())..];
            let end = trimmed.iter().position(|&b| b == b' ').unwrap_or(trimmed.len());
            let (e, r) = trimmed.split_at(end);
            if !signed(e) {
                return Err(Refused::Format);
            }
            rest = r;
            Some(e)
        } else {
            None
        };
        let keys = Keys(rest);
        if keys.iter().next().is_none() || !keys.iter().all(valid_key) {
            return Err(Refused::Format);
        }
        return Ok(Command::Retrieve { kind, exptime, keys });
    }
    let mut argv: [&[u8]; MAX_WORDS] = [&[]; MAX_WORDS];
    let mut argc = 0;
    for w in rest.split(|&b| b == b' ').filter(|w| !w.is_empty()) {
        if argc == MAX_WORDS {
            return Err(Refused::Format);
        }
        argv[argc] = w;
        argc += 1;
    }
    let args = &argv[..argc];
    let noreply = |n: usize| match args.get(n) {
        None => Ok(false),
        Some(&b"noreply") if args.len() == n + 1 => Ok(true),
        _ => Err(Refused::Format),
    };
    let key = |k: &'_ [u8]| if valid_key(k) { Ok(()) } else { Err(Refused::Format) };
    match cmd {
        b"set" | b"add" | b"replace" | b"append" | b"prepend" | b"cas" => {
            // The data's length first: whatever else is refused, its block is skipped, as
            // memcached swallows it; without a length to trust, nothing after it can be framed.
            let bytes = args.get(3).and_then(|b| data_length(b)).ok_or(Refused::Unframed)?;
            let skip = bytes + 2;
            if bytes > max_item {
                return Err(Refused::TooLarge { skip });
            }
            let fixed = if cmd == b"cas" { 5 } else { 4 };
            let ok = args.len() >= fixed
                && number(args[1]).is_some_and(|f| f <= u64::from(u32::MAX))
                && signed(args[2])
                && (cmd != b"cas" || number(args[4]).is_some())
                && valid_key(args[0]);
            let quiet = noreply(fixed).ok().filter(|_| ok).ok_or(Refused::FormatSkip { skip })?;
            Ok(Command::Keyed {
                key: std::borrow::Cow::Borrowed(args[0]),
                data: Some(bytes),
                quiet,
                answer: Answer::Line,
            })
        }
        b"delete" => {
            let k = *args.first().ok_or(Refused::Format)?;
            key(k)?;
            let k = std::borrow::Cow::Borrowed(k);
            // memcached still takes a legacy `0` time before noreply.
            let rest = if args.get(1) == Some(&&b"0"[..]) { 2 } else { 1 };
            Ok(Command::Keyed { key: k, data: None, quiet: noreply(rest)?, answer: Answer::Line })
        }
        b"incr" | b"decr" => {
            if args.len() < 2 || number(args[1]).is_none() {
                return Err(Refused::Format);
            }
            key(args[0])?;
            Ok(Command::Keyed { key: args[0].into(), data: None, quiet: noreply(2)?, answer: Answer::Line })
        }
        b"touch" => {
            if args.len() < 2 || !signed(args[1]) {
                return Err(Refused::Format);
            }
            key(args[0])?;
            Ok(Command::Keyed { key: args[0].into(), data: None, quiet: noreply(2)?, answer: Answer::Line })
        }
        b"mg" | b"ms" | b"md" | b"ma" => meta(cmd, args, max_item),
        b"mn" => Ok(Command::MetaNoop),
        b"version" => Ok(Command::Version),
        b"quit" => Ok(Command::Quit),
        b"flush_all" => {
            // `flush_all noreply`, `flush_all 10`, `flush_all 10 noreply`.
            let (delay, rest) = match args.first() {
                Some(d) if *d != b"noreply" => (Some(*d), 1),
                _ => (None, 0),
            };
            if delay.is_some_and(|d| !signed(d)) {
                return Err(Refused::Format);
            }
            Ok(Command::Broadcast { cmd: Broadcast::FlushAll { delay }, noreply: noreply(rest)? })
        }
        b"verbosity" => {
            // As memcached: a bare `verbosity`, or one of more than two words, is an unknown
            // command; `verbosity noreply` lacks its level, and says nothing of it.
            if !(1..=2).contains(&args.len()) {
                return Err(Refused::Unknown);
            }
            let level = args[0];
            if number(level).is_none() {
                return Err(if args.len() == 1 && level == b"noreply" { Refused::Quiet } else { Refused::Format });
            }
            Ok(Command::Broadcast { cmd: Broadcast::Verbosity { level }, noreply: noreply(1)? })
        }
        b"stats" => {
            let group = args.first().copied();
            if args.len() > 1 || group.is_some_and(|g| !STATS_GROUPS.iter().any(|s| s.as_bytes() == g)) {
                // memcached: `ERROR` for a group it does not know (`stats noreply` too).
                return Err(match group {
                    Some(g) if g == b"detail" || g == b"cachedump" => Refused::NotProxied("stats"),
                    _ => Refused::Unknown,
                });
            }
            Ok(Command::Broadcast { cmd: Broadcast::Stats { group }, noreply: false })
        }
        other => match SERVER_COMMANDS.iter().find(|c| c.as_bytes() == other) {
            Some(c) => Err(Refused::NotProxied(c)),
            None => Err(Refused::Unknown),
        },
    }
}

/// A meta command: `KEY [SIZE] FLAGS...`; flag `b` says the key is base64, `q` quiet mode.
fn meta<'a>(cmd: &[u8], args: &[&'a [u8]], max_item: usize) -> Result<Command<'a>, Refused> {
    // `ms KEY SIZE FLAGS...`: as for the storage commands, its block is skipped whatever else
    // is refused, and a size that cannot be read closes the connection.
    let size = match cmd {
        b"ms" => Some(args.get(1).and_then(|s| data_length(s)).ok_or(Refused::Unframed)?),
        _ => None,
    };
    let format = match size {
        Some(size) => Refused::FormatSkip { skip: size + 2 },
        None => Refused::Format,
    };
    if let Some(size) = size.filter(|&s| s > max_item) {
        return Err(Refused::TooLarge { skip: size + 2 });
    }
    let (raw, rest) = args.split_first().ok_or(Refused::Format)?;
    let (data, flags) = match size {
        Some(size) => (Some(size), &rest[1..]),
        None => (None, rest),
    };
    // Each flag is one letter and its token, if any.
    if !flags.iter().all(|f| f.first().is_some_and(u8::is_ascii_alphabetic)) {
        return Err(format);
    }
    let base64 = flags.iter().any(|f| *f == b"b");
    let quiet = flags.iter().any(|f| *f == b"q");
    let key = if base64 {
        let k = base64_decode(raw).ok_or_else(|| format.clone())?;
        if k.is_empty() || k.len() > MAX_KEY {
            return Err(format);
        }
        std::borrow::Cow::Owned(k)
    } else if valid_key(raw) {
        std::borrow::Cow::Borrowed(*raw)
    } else {
        return Err(format);
    };
    Ok(Command::Keyed { key, data, quiet, answer: Answer::Meta })
}

/// The first line in `buf` (its length with the CRLF, the line without it), if complete.
pub fn line(buf: &[u8]) -> Option<(usize, &[u8])> {
    let end = memchr(b'\n', buf)?;
    let l = &buf[..end];
    Some((end + 1, l.strip_suffix(b"\r").unwrap_or(l)))
}

fn memchr(b: u8, buf: &[u8]) -> Option<usize> {
    buf.iter().position(|&c| c == b)
}

/// Why a server's answer cannot be framed: the connection is out of step and must close.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Garbled;

/// The length of one complete answer at the start of `buf`, if it is all there.
///
/// - retrieval: `VALUE KEY FLAGS BYTES [CAS]` lines each with a data block, to `END`;
///   an `ERROR`/`CLIENT_ERROR`/`SERVER_ERROR` line ends it too;
/// - [`Answer::Line`]: one line;
/// - [`Answer::Meta`]: one line, and after `VA SIZE ...` a data block of SIZE bytes and CRLF;
/// - [`Answer::Stats`]: `STAT` and `ITEM` lines, to the first other line, which it includes.
///
/// # Errors
///
/// A `VALUE` or `VA` line whose size cannot be read.
pub fn answer_len(buf: &[u8], retrieval: bool, answer: Answer) -> Result<Option<usize>, Garbled> {
    let mut at = 0;
    loop {
        let Some((n, l)) = line(&buf[at..]) else { return Ok(None) };
        if retrieval {
            if let Some(rest) = l.strip_prefix(b"VALUE ") {
                let size = rest.split(|&b| b == b' ').nth(2).and_then(number).ok_or(Garbled)?;
                let end =
                    usize::try_from(size).ok().and_then(|z| (at + n).checked_add(z)?.checked_add(2)).ok_or(Garbled)?;
                if buf.len() < end {
                    return Ok(None);
                }
                at = end;
                continue;
            }
            return Ok(Some(at + n));
        }
        if answer == Answer::Stats {
            at += n;
            if l.starts_with(b"STAT ") || l.starts_with(b"ITEM ") {
                continue;
            }
            return Ok(Some(at));
        }
        if answer == Answer::Meta
            && let Some(rest) = l.strip_prefix(b"VA ")
        {
            let size = rest.split(|&b| b == b' ').next().and_then(number).ok_or(Garbled)?;
            let end = usize::try_from(size).ok().and_then(|z| n.checked_add(z)?.checked_add(2)).ok_or(Garbled)?;
            return Ok((buf.len() >= end).then_some(end));
        }
        return Ok(Some(n));
    }
}

/// The `VALUE` blocks of a retrieval answer, each as (key, the whole block with its CRLFs).
/// `END` and anything after it is not included; an error line yields no block.
pub fn value_blocks(answer: &[u8]) -> Vec<(&[u8], &[u8])> {
    let mut out = Vec::new();
    let mut at = 0;
    while let Some((n, l)) = line(&answer[at..]) {
        let Some(rest) = l.strip_prefix(b"VALUE ") else { break };
        let mut fields = rest.split(|&b| b == b' ');
        let key = fields.next().unwrap_or_default();
        let Some(size) = fields.nth(1).and_then(number).and_then(|s| usize::try_from(s).ok()) else { break };
        let end = (at + n).saturating_add(size).saturating_add(2).min(answer.len());
        out.push((key, &answer[at..end]));
        at = end;
    }
    out
}

/// The codec's invariants on arbitrary bytes (the fuzz target's and the seeded test's check):
/// never a panic; an accepted key is 1 to 250 bytes; an accepted data block is within
/// `max_item`; a framed answer is no longer than its buffer, and framing a prefix of it never
/// yields a longer answer.
///
/// # Panics
///
/// When an invariant does not hold.
pub fn check_invariants(bytes: &[u8]) {
    let max_item = 4096;
    let mut rest = bytes;
    while let Some((n, l)) = line(rest) {
        if let Ok(Command::Keyed { key, data, .. }) = parse(l, max_item) {
            assert!((1..=MAX_KEY).contains(&key.len()), "key of {} bytes accepted", key.len());
            assert!(data.is_none_or(|d| d <= max_item), "a block over the limit accepted");
        }
        if let Ok(Command::Retrieve { keys, .. }) = parse(l, max_item) {
            assert!(keys.iter().next().is_some() && keys.iter().all(valid_key));
        }
        rest = &rest[n..];
    }
    for retrieval in [false, true] {
        for answer in [Answer::Line, Answer::Meta, Answer::Stats] {
            if let Ok(Some(n)) = answer_len(bytes, retrieval, answer) {
                assert!(n <= bytes.len());
                for cut in [n / 2, n.saturating_sub(1)] {
                    if let Ok(Some(m)) = answer_len(&bytes[..cut], retrieval, answer) {
                        assert!(m <= cut);
                    }
                }
            }
        }
    }
    for (_, block) in value_blocks(bytes) {
        assert!(block.len() <= bytes.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The invariants over 20,000 seeded mutations of real commands and answers (libFuzzer runs
    /// the same check longer: `fuzz/run.sh memcache_codec`).
    #[test]
    fn invariants_hold_on_mutated_input() {
        let seeds: [&[u8]; 9] = [
            b"get a bb c\r\nset k 0 0 5\r\nhello\r\n",
            b"gats -1 k j\r\ncas k 1 2 3 99 noreply\r\nabc\r\n",
            b"ms Zm9v 3 b q T0\r\nabc\r\nmg k v f\r\nmn\r\n",
            b"VALUE k 0 3\r\nabc\r\nVALUE j 5 1 77\r\nx\r\nEND\r\n",
            b"VA 2 f5\r\nhi\r\nHD\r\nEN\r\n",
            b"incr k 18446744073709551615\r\ndelete k 0 noreply\r\ntouch k -1\r\n",
            b"VALUE k 0 99999999999999999999\r\n",
            b"VALUE k 0 18446744073709551615\r\nVA 18446744073709551614 f\r\n",
            b"SERVER_ERROR out of memory\r\nEND\r\n",
        ];
        crate::mutate::each_mutation(&seeds, b" \r\n0123456789-abcVAEND", 20_000, check_invariants);
    }

    fn keyed(line: &[u8]) -> (Vec<u8>, Option<usize>, bool, Answer) {
        match parse(line, 1024) {
            Ok(Command::Keyed { key, data, quiet, answer }) => (key.into_owned(), data, quiet, answer),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(line)),
        }
    }

    #[test]
    fn commands_as_memcached_reads_them() {
        let Ok(Command::Retrieve { kind: Retrieval::Get, exptime: None, keys }) = parse(b"get a  bb c", 1024) else {
            panic!("a get")
        };
        assert_eq!(keys.iter().collect::<Vec<_>>(), [&b"a"[..], b"bb", b"c"]);
        assert_eq!(keys.single(), None);
        let Ok(Command::Retrieve { kind: Retrieval::Gats, exptime: Some(b"-1"), keys }) = parse(b"gats -1 k", 1024)
        else {
            panic!("a gats")
        };
        assert_eq!(keys.single(), Some(&b"k"[..]));
        assert_eq!(keyed(b"set k 0 0 5"), (b"k".to_vec(), Some(5), false, Answer::Line));
        assert_eq!(keyed(b"cas k 1 2 3 99 noreply"), (b"k".to_vec(), Some(3), true, Answer::Line));
        assert_eq!(keyed(b"delete k noreply"), (b"k".to_vec(), None, true, Answer::Line));
        assert_eq!(keyed(b"delete k 0"), (b"k".to_vec(), None, false, Answer::Line));
        assert_eq!(keyed(b"incr k 7"), (b"k".to_vec(), None, false, Answer::Line));
        assert_eq!(keyed(b"touch k 10 noreply"), (b"k".to_vec(), None, true, Answer::Line));
        assert_eq!(keyed(b"mg k v f t"), (b"k".to_vec(), None, false, Answer::Meta));
        assert_eq!(keyed(b"ms k 3 T0 q"), (b"k".to_vec(), Some(3), true, Answer::Meta));
        // "foo" in base64 is placed as foo.
        assert_eq!(keyed(b"md Zm9v b q"), (b"foo".to_vec(), None, true, Answer::Meta));
        assert_eq!(parse(b"mn", 1024), Ok(Command::MetaNoop));
        assert_eq!(meta_key(b"plain"), b"plain");
        assert_eq!(meta_key(b"with space"), b"d2l0aCBzcGFjZQ== b");
        assert_eq!(parse(b"version", 1024), Ok(Command::Version));
    }

    #[test]
    fn refusals_are_memcached_lines() {
        let long = vec![b'k'; 251];
        let mut get = b"get ".to_vec();
        get.extend_from_slice(&long);
        for bad in [&get[..], b"get", b"incr k x", b"get a\x01b", b"mg", b"mg a\x01b v"] {
            assert_eq!(parse(bad, 1024), Err(Refused::Format), "{}", String::from_utf8_lossy(bad));
        }
        // Issue 31 (2): a storage command refused for its key or fields still has its data
        // block skipped, as memcached swallows it.
        for bad in [
            &b"set k x 0 5"[..],
            b"set k 0 0 5 nope",
            b"set k 0 0 5 noreplyx",
            b"set a\x01b 0 0 5",
            b"set k 4294967296 0 5",
            b"cas k 0 0 5",
            b"cas k 0 0 5 x",
            b"add k 0 x 5",
            b"ms a\x01b 5 T0",
            b"ms k 5 9",
        ] {
            assert_eq!(parse(bad, 1024), Err(Refused::FormatSkip { skip: 7 }), "{}", String::from_utf8_lossy(bad));
        }
        // Issue 31 (3): a length that cannot be trusted leaves nothing to resync on.
        for bad in [
            &b"set k 0 0"[..],
            b"set k 0 0 -5",
            b"set k 0 0 x",
            b"set k 0 0 4294967296",
            b"set k 0 0 2147483646",
            b"ms k",
            b"ms k -1 T0",
        ] {
            assert_eq!(parse(bad, 1024), Err(Refused::Unframed), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"set k 0 0 2147483645", 1024), Err(Refused::TooLarge { skip: 2147483647 }));
        assert_eq!(parse(b"set k 0 0 2000", 1024), Err(Refused::TooLarge { skip: 2002 }));
        assert_eq!(parse(b"ms k 2000 T0", 1024), Err(Refused::TooLarge { skip: 2002 }));
        assert_eq!(parse(b"bogus", 1024), Err(Refused::Unknown));
        assert_eq!(parse(b"", 1024), Err(Refused::Unknown));
        assert_eq!(parse(b"lru_crawler metadump all", 1024), Err(Refused::NotProxied("lru_crawler")));
        assert!(String::from_utf8_lossy(&Refused::NotProxied("stats").line()).starts_with("CLIENT_ERROR 'stats'"));
    }

    /// The commands of every server, with memcached's refusals (the ones `memccapable -a` sends).
    #[test]
    fn broadcasts_as_memcached_reads_them() {
        let b = |line: &[u8]| match parse(line, 1024) {
            Ok(Command::Broadcast { cmd, noreply }) => (cmd.request(), noreply),
            other => panic!("{}: {other:?}", String::from_utf8_lossy(line)),
        };
        assert_eq!(b(b"flush_all"), (b"flush_all\r\n".to_vec(), false));
        assert_eq!(b(b"flush_all noreply"), (b"flush_all\r\n".to_vec(), true));
        assert_eq!(b(b"flush_all 10 noreply"), (b"flush_all 10\r\n".to_vec(), true));
        assert_eq!(b(b"flush_all -1"), (b"flush_all -1\r\n".to_vec(), false));
        assert_eq!(b(b"verbosity 1"), (b"verbosity 1\r\n".to_vec(), false));
        assert_eq!(b(b"verbosity 0 noreply"), (b"verbosity 0\r\n".to_vec(), true));
        assert_eq!(b(b"stats"), (b"stats\r\n".to_vec(), false));
        assert_eq!(b(b"stats reset"), (b"stats reset\r\n".to_vec(), false));
        assert_eq!(b(b"stats slabs"), (b"stats slabs\r\n".to_vec(), false));
        for bad in [&b"flush_all x"[..], b"flush_all 1 2", b"verbosity foo", b"verbosity x noreply"] {
            assert_eq!(parse(bad, 1024), Err(Refused::Format), "{}", String::from_utf8_lossy(bad));
        }
        for bad in [&b"verbosity"[..], b"verbosity foo bar my", b"stats noreply", b"stats a b"] {
            assert_eq!(parse(bad, 1024), Err(Refused::Unknown), "{}", String::from_utf8_lossy(bad));
        }
        assert_eq!(parse(b"verbosity noreply", 1024), Err(Refused::Quiet));
        assert_eq!(parse(b"stats cachedump 1 1", 1024), Err(Refused::NotProxied("stats")));
        let stats = b"STAT pid 1\r\nSTAT uptime 5\r\nEND\r\n";
        for cut in 0..stats.len() {
            assert_eq!(answer_len(&stats[..cut], false, Answer::Stats), Ok(None), "cut at {cut}");
        }
        assert_eq!(answer_len(stats, false, Answer::Stats), Ok(Some(stats.len())));
        assert_eq!(answer_len(b"RESET\r\nmore", false, Answer::Stats), Ok(Some(7)));
    }

    #[test]
    fn answers_are_framed_whole() {
        let a = b"VALUE k 0 3\r\nabc\r\nVALUE j 5 1 77\r\nx\r\nEND\r\n";
        for cut in 0..a.len() {
            assert_eq!(answer_len(&a[..cut], true, Answer::Line), Ok(None), "cut at {cut}");
        }
        assert_eq!(answer_len(a, true, Answer::Line), Ok(Some(a.len())));
        let blocks = value_blocks(a);
        assert_eq!(blocks.len(), 2);
        assert_eq!(blocks[0], (&b"k"[..], &b"VALUE k 0 3\r\nabc\r\n"[..]));
        assert_eq!(blocks[1].0, b"j");
        // A value holding "END\r\n" is data, not the end.
        let tricky = b"VALUE k 0 5\r\nEND\r\n\r\nEND\r\n";
        assert_eq!(answer_len(tricky, true, Answer::Line), Ok(Some(tricky.len())));
        assert_eq!(answer_len(b"SERVER_ERROR out of memory\r\nmore", true, Answer::Line), Ok(Some(28)));
        assert_eq!(answer_len(b"STORED\r\n", false, Answer::Line), Ok(Some(8)));
        assert_eq!(answer_len(b"VA 2 f5\r\nhi\r\n", false, Answer::Meta), Ok(Some(13)));
        assert_eq!(answer_len(b"VA 2 f5\r\nhi", false, Answer::Meta), Ok(None));
        assert_eq!(answer_len(b"VALUE k 0 zz\r\n", true, Answer::Line), Err(Garbled));
        // A size that would overflow is garbled, not a wrapped length.
        assert_eq!(answer_len(b"VALUE k 0 18446744073709551615\r\n", true, Answer::Line), Err(Garbled));
        assert_eq!(answer_len(b"VA 18446744073709551614 f\r\n", false, Answer::Meta), Err(Garbled));
    }
}
