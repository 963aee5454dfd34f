//! A gRPC unary load generator for `bench/grpc.sh`: `CONNECTIONS` HTTP/2 connections (prior
//! knowledge) to one address, `STREAMS` calls in flight on each, for `SECONDS`; each call is a
//! `POST /bench.Echo/M<k>` (k uniform in 0..`METHODS`, a fixed seed: the same calls against every
//! proxy) with a 5-byte-framed 100-byte message, `te: trailers` and `x-user-id: <k>`. A call
//! counts as done when its trailers say `grpc-status: 0`. Prints calls/s, failures, and the
//! latency's p50, p99 and p99.9 in microseconds, as one line of `key=value`.
//!
//! Usage: grpc_load ADDR CONNECTIONS STREAMS SECONDS [METHODS]

use std::time::{Duration, Instant};

use bytes::Bytes;
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::{TokioExecutor, TokioIo};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 5 {
        eprintln!("usage: grpc_load ADDR CONNECTIONS STREAMS SECONDS [METHODS]");
        std::process::exit(2);
    }
    let addr = args[1].clone();
    let (connections, streams): (usize, usize) = (args[2].parse()?, args[3].parse()?);
    let seconds: f64 = args[4].parse()?;
    let methods: u64 = args.get(5).map_or(Ok(10_000), |m| m.parse())?;
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let (mut lat, failed, took) = rt.block_on(async move {
        let until = Instant::now() + Duration::from_secs_f64(seconds);
        let mut message = vec![0u8, 0, 0, 0, 100];
        message.extend_from_slice(&[b'm'; 100]);
        let message = Bytes::from(message);
        let mut tasks = Vec::new();
        let started = Instant::now();
        for c in 0..connections {
            let tcp = tokio::net::TcpStream::connect(&addr).await?;
            tcp.set_nodelay(true)?;
            let (send, conn) = hyper::client::conn::http2::Builder::new(TokioExecutor::new())
                .initial_stream_window_size(1 << 20)
                .handshake::<_, Full<Bytes>>(TokioIo::new(tcp))
                .await?;
            tokio::spawn(conn);
            for s in 0..streams {
                let (mut send, addr, message) = (send.clone(), addr.clone(), message.clone());
                // A per-stream xorshift: the same sequence of methods every run.
                let mut x: u64 =
                    0x9e37_79b9_7f4a_7c15 ^ ((c * streams + s) as u64 + 1).wrapping_mul(0x2545_f491_4f6c_dd1d);
                tasks.push(tokio::spawn(async move {
                    let mut lat = Vec::with_capacity(1 << 16);
                    let mut failed = 0u64;
                    while Instant::now() < until {
                        x ^= x << 13;
                        x ^= x >> 7;
                        x ^= x << 17;
                        let k = x % methods;
                        let req = Request::post(format!("http://{addr}/bench.Echo/M{k}"))
                            .header("content-type", "application/grpc")
                            .header("te", "trailers")
                            .header("x-user-id", k.to_string())
                            .body(Full::new(message.clone()))
                            .expect("request");
                        let t = Instant::now();
                        let ok = match send.send_request(req).await {
                            Ok(resp) => match resp.into_body().collect().await {
                                Ok(c) => c.trailers().and_then(|t| t.get("grpc-status")).is_some_and(|s| s == "0"),
                                Err(_) => false,
                            },
                            Err(_) => false,
                        };
                        if ok {
                            lat.push(t.elapsed().as_micros() as u32);
                        } else {
                            failed += 1;
                        }
                    }
                    (lat, failed)
                }));
            }
        }
        let mut all = Vec::new();
        let mut failed = 0;
        for t in tasks {
            let (l, f) = t.await?;
            all.extend(l);
            failed += f;
        }
        Ok::<_, Box<dyn std::error::Error>>((all, failed, started.elapsed()))
    })?;
    lat.sort_unstable();
    let q = |p: f64| lat.get(((lat.len() as f64 * p) as usize).min(lat.len().saturating_sub(1))).copied().unwrap_or(0);
    println!(
        "calls={} failed={} seconds={:.2} calls_per_s={:.0} p50_us={} p99_us={} p999_us={}",
        lat.len(),
        failed,
        took.as_secs_f64(),
        lat.len() as f64 / took.as_secs_f64(),
        q(0.50),
        q(0.99),
        q(0.999)
    );
    Ok(())
}
