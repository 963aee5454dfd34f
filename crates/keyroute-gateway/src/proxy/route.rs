//! The route stage: the head read once (loop check by `Via`, framing, one unambiguous Host, a
//! normalised path: a bad head is the client's error, 400, never a worker's), then listener, host
//! and path prefix to a pool and its route.

use bytes::Bytes;
use http::request::Parts;
use http::{Response, StatusCode};
use http_body::Body;

use super::headers;
use super::{Exchange, Route, forward};
use crate::body::{self, BoxError, ProxyBody};

pub(super) async fn route_and_forward<B>(cx: &mut Exchange<'_>, parts: &mut Parts, body: B) -> Response<ProxyBody>
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let (front, peer, id) = (cx.front, cx.peer, cx.id);
    if front.via.looped(&parts.headers) {
        tracing::warn!(request_id = %id, client = %peer.addr, "request looped back to this gateway");
        return body::error(StatusCode::LOOP_DETECTED, "the request looped back to this gateway", "loop", id);
    }
    // The listener's parser has checked the framing already; a caller of `ProxyService::call`
    // may not have.
    if !headers::framing_ok(&parts.headers, body.size_hint().exact()) {
        return body::error(StatusCode::BAD_REQUEST, "the Content-Length is invalid", "invalid_content_length", id);
    }
    if let Err(bad) = headers::canonicalize(parts.version, &mut parts.uri, &mut parts.headers) {
        tracing::debug!(request_id = %id, client = %peer.addr, reason = bad.reason(), "bad request head");
        return body::error(StatusCode::BAD_REQUEST, bad.message(), bad.reason(), id);
    }
    let routing = front.routing.load_full();
    let Some((route, pool)) = routing.route(cx.listener, headers::host_of(&parts.headers), parts.uri.path()) else {
        return body::error(StatusCode::NOT_FOUND, "no route for this host and path", "no_route", id);
    };
    let route = Route { upgrades: &route.upgrades, tunnel: front.tunnels.get(cx.listener) };
    forward(cx, pool, route, parts, body).await
}
