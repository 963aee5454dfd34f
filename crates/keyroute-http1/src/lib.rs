//! # keyroute-http1: keyroute's HTTP/1.1 engine
//!
//! An HTTP/1.1 engine for a proxy, on [`httparse`] and tokio's readiness, that holds nothing for
//! a connection between its messages and copies no head:
//!
//! - **Heads parsed in place** ([`head`]): a request or response head is parsed where it was read
//!   and kept as those bytes plus an index of spans, so a proxy reads it without building a map
//!   and writes it on as slices of the original. The rules are RFC 9112's, read strictly (the
//!   table in [`head`]): a head two parsers could frame differently is refused.
//! - **Bodies decoded as they arrive** ([`body`]): `Content-Length`, chunked (a state machine
//!   over bytes, never buffering a chunk), or until the close for responses.
//! - **One read buffer per runtime thread** ([`buf`]): every connection of the thread reads
//!   into it and keeps only what its message needs, as slices of it; an idle connection owns no
//!   buffer at all.
//! - **The client side without a connection task** ([`client`]): the task that sends a request
//!   writes it, uploads its body while watching for the response, and reads the response itself;
//!   the connection is a socket, pooled by the caller.
//!
//! It knows nothing of routing, placement or the gateway: `keyroute-gateway` builds on it.
//!
//! Why not hyper's HTTP/1: hyper's connection keeps two buffers of its own for as long as it
//! lives, and hyper's client hands every request to a connection task through a channel; both
//! put a floor under a proxy's memory per connection and CPU per request that a proxy of its own
//! design does not have (measured in BENCHMARKS.md, "Issue 20's spike"). Why not Pingora's: it
//! cannot be built here without cmake (see BENCHMARKS.md).

pub mod body;
pub mod buf;
pub mod client;
mod date;
pub mod head;
pub mod server;
pub mod tunnel;

pub use body::{BodyDecoder, BodyError, ChunkedDecoder};
pub use client::{BoxError, ClientConn, ExchangeError, Outgoing, RequestBody, ResponseBody, SendError, send};
pub use head::{
    ConnectionOptions, Fields, Framing, HeadError, Limits, Parsed, RequestHead, ResponseHead, Version, parse_request,
    parse_response,
};
pub use server::{
    OutgoingHead, Prefixed, ReadBodyError, ReadError, Respond, RespondError, ServerBody, ServerConn, Transport,
};
