//! A memcached load generator for `bench/memcache.sh`: pipelined GET/SET of fixed-size values
//! through a proxy (or straight to a server), the same load whatever is in front.
//!
//! `mc_load ADDR CONNECTIONS DEPTH SECONDS [VALUE_BYTES] [KEYS]`: each connection writes DEPTH
//! commands at once (one SET in ten, the rest GETs of single keys, keys uniform over KEYS), reads
//! the DEPTH answers, and repeats for SECONDS. The keys are written once first. Prints
//! `ops=N seconds=S ops_per_sec=R misses=M errors=E` on one line.

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

/// Reads `answers` whole answers (a line, or `VALUE` lines each with a data block and then
/// `END`), counting GETs that found nothing (`END` alone) and error lines.
async fn read_answers(
    s: &mut TcpStream,
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
    let value = vec![b'v'; value_bytes];
    // Every key written once, so that every GET finds its value.
    {
        let mut s = TcpStream::connect(&addr).await.expect("connect");
        let mut buf = Vec::new();
        let (mut m, mut e) = (0, 0);
        for chunk in (0..keys).collect::<Vec<_>>().chunks(100) {
            let mut req = Vec::new();
            for k in chunk {
                req.extend_from_slice(format!("set key:{k} 0 0 {value_bytes}\r\n").as_bytes());
                req.extend_from_slice(&value);
                req.extend_from_slice(b"\r\n");
            }
            s.write_all(&req).await.expect("prefill");
            read_answers(&mut s, &mut buf, chunk.len(), &mut m, &mut e).await.expect("prefill answers");
        }
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
                    let r = next(&mut x);
                    let k = r % keys;
                    if r >> 60 == 0 {
                        req.extend_from_slice(format!("set key:{k} 0 0 {value_bytes}\r\n").as_bytes());
                        req.extend_from_slice(&value);
                        req.extend_from_slice(b"\r\n");
                    } else {
                        req.extend_from_slice(format!("get key:{k}\r\n").as_bytes());
                    }
                }
                if s.write_all(&req).await.is_err()
                    || read_answers(&mut s, &mut buf, depth, &mut misses, &mut errors).await.is_err()
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
