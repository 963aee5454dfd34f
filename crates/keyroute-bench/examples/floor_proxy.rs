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

use std::sync::Arc;

use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::sync::Mutex;

#[path = "floor/accept.rs"]
mod accept;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    accept::run(|client, up| async move {
        let Ok((send, conn)) = hyper::client::conn::http1::handshake::<_, Incoming>(TokioIo::new(up)).await else {
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
    })
}
