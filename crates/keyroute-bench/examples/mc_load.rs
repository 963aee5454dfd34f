//! A memcached (or Redis) load generator for `bench/memcache.sh`: pipelined GET/SET of fixed-size
//! values through a proxy (or straight to a server), the same load whatever is in front.
//!
//! `mc_load ADDR CONNECTIONS DEPTH SECONDS [VALUE_BYTES] [KEYS]`: each connection writes DEPTH
//! commands at once (one SET in ten, the rest GETs of single keys, keys uniform over KEYS), reads
//! the DEPTH answers, and repeats for SECONDS. The keys are written once first. Prints
//! `ops=N seconds=S ops_per_sec=R misses=M errors=E` on one line.
//!
//! Modes, by environment:
//! - `MC_MULTI=K`: every GET asks for K keys at once (a multi-get; one op is one multi-get).
//! - `MC_RATE=R`: open loop: R commands a second over all connections, each sent at its time
//!   whether or not earlier answers came (one thread writes, one reads, per connection), and each
//!   answer's latency taken from the time its command was due (no coordinated omission). Adds
//!   `p50_us= p99_us= p999_us= max_us=` to the line.
//! - `MC_PROTOCOL=redis`: the same commands in RESP (`GET`, `SET`; `MGET` for `MC_MULTI`).
//! - `MC_SETS=1`: every command a SET (a write load).

use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// xorshift64: the keys each connection asks for (fixed seeds, so every run asks the same).
fn next(x: &mut u64) -> u64 {
    *x ^= *x << 13;
    *x ^= *x >> 7;
    *x ^= *x << 17;
    *x
}

/// Reads `answers` whole memcached answers (a line, or `VALUE` lines each with a data block and
/// then `END`), counting GETs that found nothing (`END` alone) and error lines.
async fn read_answers(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    answers: usize,
    misses: &mut u64,
    errors: &mut u64,
) -> std::io::Result<()> {
    let (mut at, mut done, mut values) = (0, 0, 0);
    while done < answers {
        while done < answers {
            let Some(end) = buf[at..].iter().position(|&b| b == b'\n').map(|i| at + i + 1) else { break };
            let line = &buf[at..end];
            if let Some(rest) = line.strip_prefix(b"VALUE ") {
                let size: usize = std::str::from_utf8(rest)
                    .ok()
                    .and_then(|r| r.split(' ').nth(2))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                if buf.len() < end + size + 2 {
                    break;
                }
                at = end + size + 2;
                values += 1;
                continue;
            }
            if line.starts_with(b"END") && values == 0 {
                *misses += 1;
            } else if line.starts_with(b"SERVER_ERROR")
                || line.starts_with(b"CLIENT_ERROR")
                || line.starts_with(b"ERROR")
            {
                *errors += 1;
            }
            at = end;
            done += 1;
            values = 0;
        }
        if done == answers {
            break;
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..at);
    Ok(())
}

/// The length of one whole RESP reply at the start of `b` (status, error, integer, bulk, array of
/// bulks), and whether it is a miss (a null) or an error.
fn resp_len(b: &[u8]) -> Option<(usize, bool, bool)> {
    let nl = b.iter().position(|&c| c == b'\n')? + 1;
    let n: i64 = std::str::from_utf8(&b[1..nl.checked_sub(2)?]).ok()?.parse().unwrap_or(0);
    match b[0] {
        b'$' if n < 0 => Some((nl, true, false)),
        b'$' => (b.len() >= nl + n as usize + 2).then_some((nl + n as usize + 2, false, false)),
        b'*' => {
            let mut at = nl;
            let mut nulls = 0;
            for _ in 0..n.max(0) {
                let (len, miss, _) = resp_len(&b[at..])?;
                at += len;
                nulls += usize::from(miss);
            }
            Some((at, n > 0 && nulls == n as usize, false))
        }
        b'-' => Some((nl, false, true)),
        _ => Some((nl, false, false)),
    }
}

/// Reads `answers` whole RESP replies, counting misses (all nulls) and errors.
async fn read_resp(
    s: &mut (impl tokio::io::AsyncRead + Unpin),
    buf: &mut Vec<u8>,
    answers: usize,
    misses: &mut u64,
    errors: &mut u64,
) -> std::io::Result<()> {
    let (mut at, mut done) = (0, 0);
    while done < answers {
        while done < answers {
            let Some((len, miss, error)) = resp_len(&buf[at..]).filter(|_| at < buf.len()) else { break };
            at += len;
            done += 1;
            *misses += u64::from(miss);
            *errors += u64::from(error);
        }
        if done == answers {
            break;
        }
        let mut chunk = [0u8; 65536];
        let n = s.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    buf.drain(..at);
    Ok(())
}

#[derive(Clone, Copy, PartialEq)]
enum Proto {
    Memcached,
    Redis,
}

impl Proto {
    fn set(self, out: &mut Vec<u8>, k: u64, value: &[u8]) {
        let key = format!("key:{k}");
        match self {
            Proto::Memcached => {
                out.extend_from_slice(format!("set {key} 0 0 {}\r\n", value.len()).as_bytes());
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
            Proto::Redis => {
                out.extend_from_slice(
                    format!("*3\r\n$3\r\nSET\r\n${}\r\n{key}\r\n${}\r\n", key.len(), value.len()).as_bytes(),
                );
                out.extend_from_slice(value);
                out.extend_from_slice(b"\r\n");
            }
        }
    }

    fn get(self, out: &mut Vec<u8>, keys: &[u64]) {
        match self {
            Proto::Memcached => {
                out.extend_from_slice(b"get");
                for k in keys {
                    out.extend_from_slice(format!(" key:{k}").as_bytes());
                }
                out.extend_from_slice(b"\r\n");
            }
            Proto::Redis => {
                let verb = if keys.len() == 1 { "GET" } else { "MGET" };
                out.extend_from_slice(format!("*{}\r\n${}\r\n{verb}\r\n", keys.len() + 1, verb.len()).as_bytes());
                for k in keys {
                    let key = format!("key:{k}");
                    out.extend_from_slice(format!("${}\r\n{key}\r\n", key.len()).as_bytes());
                }
            }
        }
    }

    async fn read(
        self,
        s: &mut (impl tokio::io::AsyncRead + Unpin),
        buf: &mut Vec<u8>,
        answers: usize,
        misses: &mut u64,
        errors: &mut u64,
    ) -> std::io::Result<()> {
        match self {
            Proto::Memcached => read_answers(s, buf, answers, misses, errors).await,
            Proto::Redis => read_resp(s, buf, answers, misses, errors).await,
        }
    }
}

/// One command of the mix: one SET in sixteen (every one with `MC_SETS=1`), the rest GETs of
/// `multi` keys.
fn command(proto: Proto, x: &mut u64, keys: u64, multi: usize, value: &[u8], out: &mut Vec<u8>) {
    static SETS: std::sync::LazyLock<bool> =
        std::sync::LazyLock::new(|| std::env::var("MC_SETS").as_deref() == Ok("1"));
    let r = next(x);
    if r >> 60 == 0 || *SETS {
        proto.set(out, r % keys, value);
    } else {
        let ks: Vec<u64> = std::iter::once(r % keys).chain((1..multi).map(|_| next(x) % keys)).collect();
        proto.get(out, &ks);
    }
}

fn main() {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(run());
}

async fn run() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: mc_load ADDR CONNECTIONS DEPTH SECONDS [VALUE_BYTES] [KEYS]");
        std::process::exit(64);
    }
    let addr = args[1].clone();
    let parse = |i: usize, d: u64| args.get(i).and_then(|v| v.parse().ok()).unwrap_or(d);
    let (connections, depth, seconds) = (parse(2, 16), parse(3, 16) as usize, parse(4, 10));
    let (value_bytes, keys) = (parse(5, 100) as usize, parse(6, 10_000));
    let env = |name: &str| std::env::var(name).ok().and_then(|v| v.parse::<u64>().ok());
    let multi = env("MC_MULTI").unwrap_or(1).max(1) as usize;
    let rate = env("MC_RATE");
    let proto = if std::env::var("MC_PROTOCOL").as_deref() == Ok("redis") { Proto::Redis } else { Proto::Memcached };
    let value = vec![b'v'; value_bytes];
    // Every key written once, so that every GET finds its value.
    {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        let mut buf = Vec::new();
        let (mut m, mut e) = (0, 0);
        for chunk in (0..keys).collect::<Vec<_>>().chunks(100) {
            let mut req = Vec::new();
            for &k in chunk {
                proto.set(&mut req, k, &value);
            }
            s.write_all(&req).await.expect("prefill");
            proto.read(&mut s, &mut buf, chunk.len(), &mut m, &mut e).await.expect("prefill answers");
        }
    }
    if let Some(rate) = rate {
        return open_loop(&addr, proto, connections, rate, seconds, &value, keys, multi);
    }
    let deadline = Instant::now() + Duration::from_secs(seconds);
    let mut tasks = Vec::new();
    for c in 0..connections {
        let addr = addr.clone();
        let value = value.clone();
        tasks.push(tokio::spawn(async move {
            let mut s = TcpStream::connect(&addr).await.expect("connect");
            let _ = s.set_nodelay(true);
            let mut x = 0x9E37_79B9_7F4A_7C15 ^ (c + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            let (mut ops, mut misses, mut errors) = (0u64, 0u64, 0u64);
            let mut buf = Vec::with_capacity(65536);
            let mut req = Vec::with_capacity(depth * (value_bytes + 64));
            while Instant::now() < deadline {
                req.clear();
                for _ in 0..depth {
                    command(proto, &mut x, keys, multi, &value, &mut req);
                }
                if s.write_all(&req).await.is_err()
                    || proto.read(&mut s, &mut buf, depth, &mut misses, &mut errors).await.is_err()
                {
                    errors += 1;
                    break;
                }
                ops += depth as u64;
            }
            (ops, misses, errors)
        }));
    }
    let started = Instant::now();
    let (mut ops, mut misses, mut errors) = (0, 0, 0);
    for t in tasks {
        if let Ok((o, m, e)) = t.await {
            ops += o;
            misses += m;
            errors += e;
        }
    }
    let secs = started.elapsed().as_secs_f64();
    println!("ops={ops} seconds={secs:.2} ops_per_sec={:.0} misses={misses} errors={errors}", ops as f64 / secs);
}

/// The open loop: per connection, a thread that writes each command at its due time and a thread
/// that reads the answers and takes each one's latency from that time.
#[allow(clippy::too_many_arguments)]
fn open_loop(
    addr: &str,
    proto: Proto,
    connections: u64,
    rate: u64,
    seconds: u64,
    value: &[u8],
    keys: u64,
    multi: usize,
) {
    use std::io::Write as _;
    let interval = Duration::from_secs_f64(connections as f64 / rate.max(1) as f64);
    let start = Instant::now() + Duration::from_millis(50);
    let end = start + Duration::from_secs(seconds);
    let mut readers = Vec::new();
    for c in 0..connections {
        let stream = std::net::TcpStream::connect(addr).expect("connect");
        let _ = stream.set_nodelay(true);
        let mut w = stream.try_clone().expect("clone");
        let (tx, rx) = std::sync::mpsc::channel::<Instant>();
        let value = value.to_vec();
        std::thread::spawn(move || {
            let mut x = 0x9E37_79B9_7F4A_7C15 ^ (c + 1).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            // Connections start a fraction of the interval apart.
            let mut due = start + interval.mul_f64(c as f64 / connections as f64);
            let mut req = Vec::new();
            while due < end {
                let now = Instant::now();
                if due > now {
                    std::thread::sleep(due - now);
                }
                // Every command due by now, in one write.
                req.clear();
                let now = Instant::now();
                while due <= now && due < end {
                    command(proto, &mut x, keys, multi, &value, &mut req);
                    if tx.send(due).is_err() {
                        return;
                    }
                    due += interval;
                }
                if w.write_all(&req).is_err() {
                    return;
                }
            }
        });
        readers.push(std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            rt.block_on(async move {
                stream.set_nonblocking(true).expect("nonblocking");
                let mut s = TcpStream::from_std(stream).expect("tokio stream");
                let mut buf = Vec::with_capacity(65536);
                let (mut misses, mut errors) = (0u64, 0u64);
                let mut latencies = Vec::new();
                while let Ok(due) = rx.recv() {
                    if proto.read(&mut s, &mut buf, 1, &mut misses, &mut errors).await.is_err() {
                        errors += 1;
                        break;
                    }
                    latencies.push(due.elapsed().as_micros() as u64);
                }
                (latencies, misses, errors)
            })
        }));
    }
    let (mut all, mut misses, mut errors) = (Vec::new(), 0, 0);
    for r in readers {
        if let Ok((l, m, e)) = r.join() {
            all.extend(l);
            misses += m;
            errors += e;
        }
    }
    all.sort_unstable();
    let q = |p: f64| all.get(((all.len() as f64 * p) as usize).min(all.len().saturating_sub(1))).copied().unwrap_or(0);
    let secs = seconds as f64;
    println!(
        "ops={} seconds={secs:.2} ops_per_sec={:.0} misses={misses} errors={errors} p50_us={} p99_us={} p999_us={} max_us={}",
        all.len(),
        all.len() as f64 / secs,
        q(0.50),
        q(0.99),
        q(0.999),
        all.last().copied().unwrap_or(0)
    );
}
