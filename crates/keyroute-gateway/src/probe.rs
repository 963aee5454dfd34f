//! The HTTP active check, which the fleet's prober runs on its schedule
//! ([`keyroute_fleet::prober`]), as Envoy keeps a health checker per protocol: `GET` of the pool's
//! health path on a fresh connection (as HAProxy checks: a worker that stops accepting connections
//! fails while pooled ones still work); a 2xx is healthy.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use http::Request;
use http_body_util::BodyExt;
use keyroute_fleet::pool::WorkerState;
use keyroute_fleet::prober::Check;

/// `GET` of a path on a fresh connection; a 2xx is healthy.
#[derive(Debug)]
pub struct HttpCheck {
    /// The path (`[pool.health] path`).
    pub path: String,
    /// How the pool's workers are reached (`[pool.upstream]`).
    pub upstream: Arc<crate::config::UpstreamConfig>,
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
            let Ok(resp) = upstream
                .send(&self.upstream, &crate::head::ReqHead::from_parts(parts), body, false, Duration::MAX)
                .await
            else {
                return false;
            };
            let ok = resp.head.status.is_success();
            resp.body.collect().await.is_ok() && ok
        })
    }
}
