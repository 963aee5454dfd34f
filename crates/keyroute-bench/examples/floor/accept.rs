//! What both floor proxies share: the command line (`LISTEN BACKEND...`), one runtime thread, and
//! each client connection paired with an upstream connection of its own, to a backend picked by
//! connection count, round robin. Each floor supplies only what it does with the pair.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use tokio::net::{TcpListener, TcpStream};

/// Runs the floor: accepts on LISTEN, connects each client to a backend, and spawns
/// `proxy(client, upstream)` for the pair.
pub fn run<F, Fut>(proxy: F) -> Result<(), Box<dyn std::error::Error>>
where
    F: Fn(TcpStream, TcpStream) -> Fut + Copy + Send + 'static,
    Fut: Future<Output = ()> + Send + 'static,
{
    let mut args = std::env::args().skip(1);
    let listen: SocketAddr = args.next().ok_or("LISTEN")?.parse()?;
    let backends: Vec<SocketAddr> = args.map(|a| a.parse()).collect::<Result<_, _>>()?;
    if backends.is_empty() {
        return Err("at least one BACKEND".into());
    }
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let l = TcpListener::bind(listen).await?;
        let next = AtomicUsize::new(0);
        loop {
            let (client, _) = l.accept().await?;
            let _ = client.set_nodelay(true);
            let backend = backends[next.fetch_add(1, Relaxed) % backends.len()];
            tokio::spawn(async move {
                let Ok(up) = TcpStream::connect(backend).await else { return };
                let _ = up.set_nodelay(true);
                proxy(client, up).await;
            });
        }
    })
}
