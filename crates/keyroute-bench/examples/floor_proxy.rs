//! The floor for a hyper-based HTTP/1.1 proxy: what forwarding costs with nothing else done.
//!
//! Each client connection gets one upstream keep-alive connection of its own (to a backend picked
//! by connection count, round robin), and every request is sent on as it came: no key, no
//! placement, no headers added, no health, no retries, no metrics. `bench/gateway.sh`'s
//! measurement against it says how far keyroute's CPU per request is above what tokio and hyper
//! cost by themselves.
//!
//! Usage: `cargo run --release -p keyroute-bench --example floor_proxy -- LISTEN BACKEND...`
//! (one runtime thread, like `keyroute serve --threads 1`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Mutex;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().ok_or("LISTEN")?.parse()?;
    let backends: Vec<SocketAddr> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if backends.is_empty() {
        return Err("at least one BACKEND".into());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let l = TcpListener::bind(listen).await?;
        let next = Arc::new(AtomicUsize::new(0));
        loop {
            let (client, _) = l.accept().await?;
            let _ = client.set_nodelay(true);
            let backend = backends[next.fetch_add(1, Relaxed) % backends.len()];
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(backend).await else { return };
                let _ = up.set_nodelay(true);
                let Ok((send, conn)) = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(up)).await
                else {
                    return;
                };
                tokio::spawn(conn);
                let send = Arc::new(Mutex::new(send));
                let svc = service_fn(move |req: hyper::Request<Incoming>| {
                    let send = Arc::clone(&send);
                    async move {
                        let mut s = send.lock().await;
                        s.ready().await?;
                        s.send_request(req).await
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(client), svc).await;
            });
        }
    })
}
