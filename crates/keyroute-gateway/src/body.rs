//! The body type the gateway sends and returns, and the responses it makes itself.
//!
//! Public error responses carry a reason *class* (a stable, lowercase token such as
//! `upstream_timeout`) and the request id, never worker names, addresses or OS errors: those go
//! to the log, under the same request id, and to the admin API.

use std::convert::Infallible;

use bytes::Bytes;
use http::header::{self, HeaderName, HeaderValue};
use http::{Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// The request id header: kept from the client or made by the gateway, passed to the worker,
/// and put in every error the gateway makes.
pub static REQUEST_ID: HeaderName = HeaderName::from_static("x-request-id");

/// Any error a body can end with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body type the gateway sends upstream and returns to clients.
pub type ProxyBody = UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> ProxyBody {
    Empty::<Bytes>::new().map_err(|never: Infallible| match never {}).boxed_unsync()
}

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> ProxyBody {
    Full::new(bytes.into()).map_err(|never: Infallible| match never {}).boxed_unsync()
}

/// A response with a body and a content type.
pub fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<ProxyBody> {
    let mut resp = Response::new(full(body));
    *resp.status_mut() = status;
    resp.headers_mut().insert(header::CONTENT_TYPE, HeaderValue::from_static(content_type));
    resp
}

/// A JSON response (the admin API's, and errors).
pub fn json(status: StatusCode, value: &serde_json::Value) -> Response<ProxyBody> {
    let mut resp = text(status, "application/json", value.to_string() + "\n");
    resp.headers_mut().insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    resp
}

/// Marks a response the gateway made itself (an error), with its fixed message and reason: a
/// gRPC call gets it as a gRPC status instead (`proxy::grpc`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct GatewayError {
    /// The message (fixed text).
    pub message: &'static str,
    /// The reason class.
    pub reason: &'static str,
}

/// A public error response: `{"error": message, "reason": class, "status", "request_id"}`.
///
/// `message` and `reason` are fixed text chosen by the gateway, never input-derived.
pub fn error(status: StatusCode, message: &'static str, reason: &'static str, request_id: &str) -> Response<ProxyBody> {
    let mut resp = json(
        status,
        &serde_json::json!({ "error": message, "reason": reason, "status": status.as_u16(), "request_id": request_id }),
    );
    resp.extensions_mut().insert(GatewayError { message, reason });
    if let Ok(v) = HeaderValue::try_from(request_id) {
        resp.headers_mut().insert(REQUEST_ID.clone(), v);
    }
    resp
}
