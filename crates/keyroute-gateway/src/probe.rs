//! The HTTP active check, which the fleet's prober runs on its schedule
//! ([`keyroute_fleet::prober`]), as Envoy keeps a health checker per protocol: `GET` of the pool's
//! health path on a fresh connection (as HAProxy checks: a worker that stops accepting connections
//! fails while pooled ones still work); a 2xx is healthy.
//!
//! A pool of gRPC workers (`[pool.health] grpc_service`) is checked by gRPC's own health
//! protocol instead: a `grpc.health.v1.Health/Check` call for the service (`""`: the whole
//! server), healthy when the call ends with `grpc-status` 0 and the answer says `SERVING`.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use http::header::{self, HeaderValue};
use http::{Method, Request};
use http_body_util::BodyExt;
use keyroute_fleet::pool::WorkerState;
use keyroute_fleet::prober::Check;

/// `GET` of a path on a fresh connection; a 2xx is healthy. Or, with `grpc_service`, gRPC's
/// health check.
#[derive(Debug)]
pub struct HttpCheck {
    /// The path (`[pool.health] path`).
    pub path: String,
    /// The service a gRPC health check asks about, if the pool's check is gRPC's.
    pub grpc_service: Option<String>,
    /// How the pool's workers are reached (`[pool.upstream]`).
    pub upstream: Arc<crate::config::UpstreamConfig>,
}

/// gRPC's health service method.
const GRPC_HEALTH_CHECK: &str = "/grpc.health.v1.Health/Check";

impl Check for HttpCheck {
    fn check<'a>(&'a self, worker: &'a Arc<WorkerState>) -> Pin<Box<dyn Future<Output = bool> + Send + 'a>> {
        Box::pin(async move {
            let path = if self.grpc_service.is_some() { GRPC_HEALTH_CHECK } else { self.path.as_str() };
            let Ok(uri) = http::Uri::try_from(path) else { return false };
            let Some(upstream) = crate::upstream::of(worker) else { return false };
            let body = match &self.grpc_service {
                Some(service) => crate::body::full(health_request(service)),
                None => crate::body::empty(),
            };
            let mut req = Request::new(());
            *req.uri_mut() = uri;
            if let Ok(host) = HeaderValue::try_from(worker.address.to_string()) {
                req.headers_mut().insert(header::HOST, host);
            }
            if self.grpc_service.is_some() {
                *req.method_mut() = Method::POST;
                req.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
            } else {
                req.headers_mut().insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            let (parts, ()) = req.into_parts();
            let mut head = crate::head::ReqHead::from_parts(parts);
            head.trailers = self.grpc_service.is_some();
            // The prober bounds the whole check, the connect included. A gRPC check may go on a
            // pooled HTTP/2 connection: that is how calls reach the worker.
            let fresh = self.grpc_service.is_none();
            let Ok(resp) = upstream.send(&self.upstream, &head, &mut Some(body), !fresh, Duration::MAX).await else {
                return false;
            };
            let ok = resp.head.status.is_success();
            let grpc_status = resp.head.fields.value(&GRPC_STATUS);
            let Ok(collected) = resp.body.collect().await else { return false };
            if self.grpc_service.is_none() {
                return ok;
            }
            // Trailers-Only answers put the status in the head.
            let status = collected.trailers().and_then(|t| t.get(&GRPC_STATUS).cloned()).or(grpc_status);
            ok && status.is_some_and(|s| s == "0") && serving(&collected.to_bytes())
        })
    }
}

static GRPC_STATUS: header::HeaderName = header::HeaderName::from_static("grpc-status");

/// A length-prefixed `HealthCheckRequest { service = 1 }` message.
fn health_request(service: &str) -> Bytes {
    let mut msg = Vec::with_capacity(service.len() + 8);
    if !service.is_empty() {
        msg.push(0x0a); // field 1, length-delimited
        let mut n = service.len();
        while n >= 0x80 {
            msg.push((n as u8) | 0x80);
            n >>= 7;
        }
        msg.push(n as u8);
        msg.extend_from_slice(service.as_bytes());
    }
    let mut framed = Vec::with_capacity(5 + msg.len());
    framed.push(0); // not compressed
    framed.extend_from_slice(&(msg.len() as u32).to_be_bytes());
    framed.extend_from_slice(&msg);
    Bytes::from(framed)
}

/// Whether a length-prefixed `HealthCheckResponse` says `SERVING` (field 1, varint, 1).
fn serving(body: &[u8]) -> bool {
    let Some(msg) = body.get(5..) else { return false };
    if body[0] != 0 || u32::from_be_bytes([body[1], body[2], body[3], body[4]]) as usize != msg.len() {
        return false;
    }
    // The status is the message's only field; its varint value 1 is one byte.
    let mut i = 0;
    while i < msg.len() {
        let tag = msg[i];
        i += 1;
        match tag {
            0x08 => return msg.get(i) == Some(&1),
            // Another varint field: skip it.
            t if t & 7 == 0 => {
                while msg.get(i).is_some_and(|b| b & 0x80 != 0) {
                    i += 1;
                }
                i += 1;
            }
            _ => return false,
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_messages_are_grpc_s() {
        assert_eq!(&health_request("")[..], &[0, 0, 0, 0, 0]);
        assert_eq!(&health_request("a.B")[..], &[0, 0, 0, 0, 5, 0x0a, 3, b'a', b'.', b'B']);
        let long = "x".repeat(200);
        let r = health_request(&long);
        assert_eq!(&r[5..8], &[0x0a, 0xc8, 0x01], "a two-byte length");
        assert!(serving(&[0, 0, 0, 0, 2, 0x08, 1]));
        assert!(!serving(&[0, 0, 0, 0, 2, 0x08, 2]), "NOT_SERVING");
        assert!(!serving(&[0, 0, 0, 0, 0]), "UNKNOWN (the default, left out)");
        assert!(!serving(&[0, 0, 0, 0, 3, 0x08, 1]), "a length that does not fit");
        assert!(!serving(&[1, 0, 0, 0, 2, 0x08, 1]), "compressed");
        assert!(!serving(&[]));
    }
}
