//! The route stage: the head read once (loop check by `Via`, framing, one unambiguous Host, a
//! normalised path: a bad head is the client's error, 400, never a worker's), then listener, host
//! and path prefix to a pool and its route.

use bytes::Bytes;
use http::StatusCode;
use http_body::Body;

use super::headers;
use super::{Exchange, Route, forward};
use crate::body::{self, BoxError};
use crate::head::{Answer, ReqHead};

pub(super) async fn route_and_forward<B>(cx: &mut Exchange<'_>, head: &mut ReqHead, body: B) -> Answer
where
    B: Body<Data = Bytes> + Send + Unpin + 'static,
    B::Error: Into<BoxError>,
{
    let (front, peer, id) = (cx.front, cx.peer, cx.id);
    if front.via.looped(&head.fields) {
        tracing::warn!(request_id = %id, client = %peer.addr, "request looped back to this gateway");
        return body::error(StatusCode::LOOP_DETECTED, "the request looped back to this gateway", "loop", id).into();
    }
    // The listener's parser has checked the framing already; a caller of `ProxyService::call`
    // may not have.
    if !headers::framing_ok(&head.fields, body.size_hint().exact()) {
        return body::error(StatusCode::BAD_REQUEST, "the Content-Length is invalid", "invalid_content_length", id)
            .into();
    }
    if let Err(bad) = headers::canonicalize(head.version, &mut head.uri, &mut head.fields) {
        tracing::debug!(request_id = %id, client = %peer.addr, reason = bad.reason(), "bad request head");
        return body::error(StatusCode::BAD_REQUEST, bad.message(), bad.reason(), id).into();
    }
    let routing = front.routing.load_full();
    let Some((route, pool)) = routing.route(cx.listener, headers::host_of(&head.fields), head.uri.path()) else {
        return body::error(StatusCode::NOT_FOUND, "no route for this host and path", "no_route", id).into();
    };
    let route = Route { upgrades: &route.upgrades, tunnel: front.tunnels.get(cx.listener) };
    forward(cx, pool, route, head, body).await
}
