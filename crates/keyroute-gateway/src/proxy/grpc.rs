//! gRPC calls on the request path: their deadline and the errors the gateway makes itself.
//!
//! A call is a request whose `Content-Type` is `application/grpc` (or `application/grpc+proto`,
//! `+json`...). Its `grpc-timeout` bounds the whole request (every try) as the pool's retry
//! deadline does, whichever is shorter. An error the gateway answers itself (no worker, a timeout,
//! a worker that could not be reached) goes to a gRPC client as gRPC says a failed call ends: a
//! `200` whose head carries `grpc-status` and `grpc-message` and no body ("Trailers-Only"), so the
//! client reads `UNAVAILABLE` (14) or `DEADLINE_EXCEEDED` (4) rather than a protocol error. A
//! worker's own response, gRPC status and trailers included, passes as it came.

use std::time::Duration;

use http::StatusCode;
use http::header::{self, HeaderMap, HeaderValue};

use crate::body::{self, GatewayError};
use crate::head::{Answer, Fields, ReqHead};

/// Whether the request is a gRPC call.
pub(super) fn is_call(head: &ReqHead) -> bool {
    head.fields.get(&header::CONTENT_TYPE).is_some_and(|v| {
        let prefix = b"application/grpc";
        v.len() >= prefix.len()
            && v[..prefix.len()].eq_ignore_ascii_case(prefix)
            && matches!(v.get(prefix.len()), None | Some(b'+' | b';'))
    })
}

/// The call's `grpc-timeout` (`1-8 digits` and a unit: `H`, `M`, `S`, `m`, `u`, `n`), if it has a
/// valid one.
pub(super) fn timeout(head: &ReqHead) -> Option<Duration> {
    static GRPC_TIMEOUT: header::HeaderName = header::HeaderName::from_static("grpc-timeout");
    let v = head.fields.get(&GRPC_TIMEOUT)?;
    let (digits, unit) = v.split_at_checked(v.len().checked_sub(1)?)?;
    if digits.is_empty() || digits.len() > 8 || !digits.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let n = digits.iter().fold(0u64, |n, d| n * 10 + u64::from(d - b'0'));
    Some(match unit {
        b"H" => Duration::from_secs(n * 3600),
        b"M" => Duration::from_secs(n * 60),
        b"S" => Duration::from_secs(n),
        b"m" => Duration::from_millis(n),
        b"u" => Duration::from_micros(n),
        b"n" => Duration::from_nanos(n),
        _ => return None,
    })
}

/// The field a call's final status is in.
pub(super) static GRPC_STATUS: header::HeaderName = header::HeaderName::from_static("grpc-status");

/// Counts a call whose status is in its response's head: an error the gateway made (by the
/// status it gets), or a worker's Trailers-Only answer. A status in the trailers is counted as
/// the body passes them ([`super::guarded::Guarded`]).
pub(super) fn count_head(call: &keyroute_fleet::metrics::GrpcMethod, resp: &Answer) {
    if resp.head.extensions.get::<GatewayError>().is_some() {
        call.record(status_code(resp.head.status).to_string().as_bytes());
    } else if let Some(status) = resp.head.fields.get(&GRPC_STATUS) {
        call.record(status);
    }
}

/// The gRPC status code for an error the gateway made with this HTTP status.
fn status_code(status: StatusCode) -> u8 {
    match status.as_u16() {
        // Too slow: the worker's answer did not come within the call's deadline or the pool's.
        408 | 504 => 4,
        // No worker, none reachable, a failed response, the gateway out of resources.
        429 | 502 | 503 => 14,
        // The request itself: no key, a bad body or target.
        400 => 3,
        // No route for the method's path.
        404 => 12,
        413 | 431 => 8,
        _ => 13,
    }
}

/// An error the gateway made itself, as a gRPC client reads a failed call (see the [module
/// documentation](self)); any other response is left as it is.
pub(super) fn as_call_error(resp: &mut Answer) {
    let Some(made) = resp.head.extensions.get::<GatewayError>().copied() else { return };
    let mut fields = HeaderMap::new();
    fields.insert(header::CONTENT_TYPE, HeaderValue::from_static("application/grpc"));
    fields.insert("grpc-status", HeaderValue::from(u16::from(status_code(resp.head.status))));
    // The message is the gateway's fixed text (ASCII, no `%`): no percent-encoding needed.
    fields.insert("grpc-message", HeaderValue::from_static(made.message));
    if let Some(id) = resp.head.fields.value(&body::REQUEST_ID) {
        fields.insert(body::REQUEST_ID.clone(), id);
    }
    if let Some(c) = resp.head.fields.value(&header::CONNECTION) {
        fields.insert(header::CONNECTION, c);
    }
    resp.head.status = StatusCode::OK;
    resp.head.fields = Fields::Map(fields);
    resp.body = body::empty();
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(fields: &[(&'static str, &'static str)]) -> ReqHead {
        let mut req = http::Request::post("/s.S/M");
        for (n, v) in fields {
            req = req.header(*n, *v);
        }
        ReqHead::from_parts(req.body(()).expect("request").into_parts().0)
    }

    #[test]
    fn grpc_timeouts_are_read_as_the_spec_writes_them() {
        let t = |v| timeout(&call(&[("grpc-timeout", v)]));
        assert_eq!(t("100m"), Some(Duration::from_millis(100)));
        assert_eq!(t("2S"), Some(Duration::from_secs(2)));
        assert_eq!(t("1H"), Some(Duration::from_secs(3600)));
        assert_eq!(t("99999999n"), Some(Duration::from_nanos(99_999_999)));
        assert_eq!(t("5u"), Some(Duration::from_micros(5)));
        for bad in ["", "m", "100", "123456789m", "10x", "-1S", "1.5S", " 1S"] {
            assert_eq!(t(bad), None, "{bad:?}");
        }
        assert_eq!(timeout(&call(&[])), None);
    }

    #[test]
    fn only_grpc_content_types_are_calls() {
        for yes in ["application/grpc", "application/grpc+proto", "Application/GRPC+json", "application/grpc;x=1"] {
            assert!(is_call(&call(&[("content-type", yes)])), "{yes}");
        }
        for no in ["application/grpc-web", "application/json", "text/plain", "application/grp"] {
            assert!(!is_call(&call(&[("content-type", no)])), "{no}");
        }
    }

    #[test]
    fn the_gateway_s_own_errors_become_grpc_statuses() {
        for (status, code) in [(503, "14"), (502, "14"), (504, "4"), (400, "3"), (404, "12")] {
            let status = StatusCode::from_u16(status).expect("status");
            let mut resp: Answer = body::error(status, "no worker is available", "no_workers", "id-1").into();
            as_call_error(&mut resp);
            assert_eq!(resp.head.status, StatusCode::OK);
            assert_eq!(resp.head.fields.get_named("grpc-status"), Some(code.as_bytes()));
            assert_eq!(resp.head.fields.get_named("grpc-message"), Some(&b"no worker is available"[..]));
            assert_eq!(resp.head.fields.get_named("x-request-id"), Some(&b"id-1"[..]));
            assert!(http_body::Body::is_end_stream(&resp.body));
        }
        // A worker's response is not the gateway's: left alone.
        let mut worker: Answer = http::Response::builder().status(503).body(body::empty()).expect("response").into();
        as_call_error(&mut worker);
        assert_eq!(worker.head.status, StatusCode::SERVICE_UNAVAILABLE);
    }
}
