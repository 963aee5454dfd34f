//! Each protocol's active check, which the fleet's prober runs on its schedule
//! ([`keyroute_fleet::prober`]), as Envoy keeps a health checker per protocol:
//!
//! - **HTTP** ([`HttpCheck`]): `GET` of the pool's health path on a fresh connection (as HAProxy
//!   checks: a worker that stops accepting connections fails while pooled ones still work); a
//!   2xx is healthy.
//! - **memcached** ([`MemcachedCheck`]): `version` on a fresh connection; `VERSION ...` is healthy.
//! - **Redis** ([`RedisCheck`]): `PING` on a fresh connection, after `AUTH` when the proxy has the
//!   servers' password; `+PONG` is healthy.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;
use keyroute_fleet::pool::{Pool, WorkerState};
use keyroute_fleet::prober::Check;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::config::{CacheProtocol, Config};

/// The check for each pool of `config`, by the protocol that serves it: a pool a memcached or
/// Redis listener serves is checked in that protocol, any other over HTTP.
pub(crate) fn set_checks(config: &Config, pools: &[Arc<Pool>]) {
    for pool in pools {
        let cache = config.listeners.iter().filter_map(|l| l.cache.as_ref()).find(|c| c.pool_name == pool.name);
        let check: Arc<dyn Check> = match cache {
            Some(c) if c.protocol == CacheProtocol::Memcached => Arc::new(MemcachedCheck),
            Some(c) => Arc::new(RedisCheck { password: c.server_password.clone() }),
            None => {
                let Some(http) = config.pools.iter().position(|p| p.name == pool.name).and_then(|j| config.http.get(j))
                else {
                    continue;
                };
                Arc::new(HttpCheck { path: http.health_path.clone() })
            }
        };
        pool.set_check(Some(check));
    }
}

/// `GET` of a path on a fresh connection; a 2xx is healthy.
#[derive(Debug)]
pub(crate) struct HttpCheck {
    path: String,
}

impl Check for HttpCheck {
    fn check<'a>(&'a self, worker: &'a Arc<WorkerState>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Ok(uri) = http::Uri::try_from(self.path.as_str()) else { return false };
            let Some(upstream) = crate::upstream::of(worker) else { return false };
            let mut req = Request::new(crate::body::empty());
            *req.uri_mut() = uri;
            if let Ok(host) = http::HeaderValue::try_from(worker.address.to_string()) {
                req.headers_mut().insert(http::header::HOST, host);
            }
            req.headers_mut().insert(http::header::CONNECTION, http::HeaderValue::from_static("close"));
            let (parts, body) = req.into_parts();
            // The prober bounds the whole check, the connect included.
            let Ok(resp) = upstream.send(&parts, body, false, Duration::MAX).await else { return false };
            let ok = resp.status().is_success();
            resp.into_body().collect().await.is_ok() && ok
        })
    }
}

/// memcached's `version` on a fresh connection.
#[derive(Debug)]
pub(crate) struct MemcachedCheck;

impl Check for MemcachedCheck {
    fn check<'a>(&'a self, worker: &'a Arc<WorkerState>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Ok(mut s) = TcpStream::connect(worker.address).await else { return false };
            exchange(&mut s, b"version\r\n", 1).await.is_some_and(|a| a.starts_with(b"VERSION "))
        })
    }
}

/// Redis's `PING` on a fresh connection, after `AUTH` with the servers' password if there is one.
#[derive(Debug)]
pub(crate) struct RedisCheck {
    password: Option<String>,
}

impl Check for RedisCheck {
    fn check<'a>(&'a self, worker: &'a Arc<WorkerState>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let Ok(mut s) = TcpStream::connect(worker.address).await else { return false };
            let mut request = Vec::new();
            if let Some(p) = &self.password {
                keyroute_cache_proto::resp::command(&mut request, [&b"AUTH"[..], p.as_bytes()].into_iter());
            }
            request.extend_from_slice(b"*1\r\n$4\r\nPING\r\n");
            let lines = 1 + usize::from(self.password.is_some());
            match exchange(&mut s, &request, lines).await {
                Some(answer) if self.password.is_some() => answer.starts_with(b"+OK\r\n+PONG\r\n"),
                Some(answer) => answer.starts_with(b"+PONG\r\n"),
                None => false,
            }
        })
    }
}

/// Writes `request`, then reads until `lines` lines have come (at most 4 KiB); `None` when the
/// server closed or failed first.
async fn exchange(s: &mut TcpStream, request: &[u8], lines: usize) -> Option<Vec<u8>> {
    let _ = s.set_nodelay(true);
    s.write_all(request).await.ok()?;
    let mut answer = Vec::new();
    let mut chunk = [0u8; 512];
    while answer.iter().filter(|&&b| b == b'\n').count() < lines && answer.len() < 4096 {
        let n = s.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        answer.extend_from_slice(&chunk[..n]);
    }
    Some(answer)
}
