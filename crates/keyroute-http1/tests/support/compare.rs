//! One byte stream through keyroute's parser and through hyper's HTTP/1 server: the messages
//! each finds, and whether keyroute's decision is hyper's or a stricter refusal.
//!
//! Shared by `tests/differential.rs` (a bounded run in CI) and the fuzz target
//! `fuzz/src/targets/http1_differential.rs` (long runs).

use std::convert::Infallible;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::{Buf, Bytes};
use http_body_util::{BodyExt, Empty};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keyroute_http1::body::Next;
use keyroute_http1::{BodyDecoder, Limits, Parsed, parse_request};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// One request as a parser framed it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Message {
    pub method: String,
    /// The target, normalised as `http::Uri` prints it (hyper's form).
    pub target: String,
    /// The header fields, names lowercased, values as bytes, sorted (hyper's map keeps no order
    /// between names).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
}

fn sorted(mut headers: Vec<(String, Vec<u8>)>) -> Vec<(String, Vec<u8>)> {
    headers.sort();
    headers
}

/// How keyroute's parser ended the stream.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum End {
    /// Every byte was framed (or the last message closes the connection).
    Complete,
    /// A message was refused, with this status.
    Refused(u16),
    /// The stream ended inside a message.
    Incomplete,
}

fn normalise(target: &str) -> String {
    match http::Uri::try_from(target) {
        Ok(u) => u.to_string(),
        Err(_) => format!("<invalid {target}>"),
    }
}

/// Whether a request ends what a parser reads of its connection: a close, or a `CONNECT` (after
/// which the bytes are a tunnel's). An `Upgrade` offer does not: both sides refuse it (hyper's
/// service answers 200, not 101, as the gateway does for an upgrade its route does not tunnel),
/// so what follows it is HTTP/1 again, the region where a smuggled request would hide.
fn last_on_connection(keep_alive: bool, method: &str) -> bool {
    !keep_alive || method == "CONNECT"
}

/// The messages keyroute's parser frames in `input`.
pub fn engine(input: &[u8], limits: &Limits) -> (Vec<Message>, End) {
    let mut rest = Bytes::copy_from_slice(input);
    let mut out = Vec::new();
    loop {
        if rest.is_empty() {
            return (out, End::Complete);
        }
        let (head, n) = match parse_request(&rest, limits) {
            Err(e) => return (out, End::Refused(e.status())),
            Ok(Parsed::Partial) => return (out, End::Incomplete),
            Ok(Parsed::Complete(h, n)) => (h, n),
        };
        rest.advance(n);
        let mut decoder = BodyDecoder::new(head.framing());
        let mut body = Vec::new();
        loop {
            match decoder.next(&mut rest) {
                Ok(Next::Data(d)) => body.extend_from_slice(&d),
                Ok(Next::End) => break,
                Ok(Next::More) => return (out, End::Incomplete),
                Err(_) => return (out, End::Refused(400)),
            }
        }
        let last = last_on_connection(head.keep_alive(), head.method());
        let headers = head.fields().iter().map(|(n, v)| (n.to_ascii_lowercase(), v.to_vec())).collect();
        out.push(Message {
            method: head.method().to_owned(),
            target: normalise(head.target()),
            headers: sorted(headers),
            body,
        });
        if last {
            return (out, End::Complete);
        }
    }
}

/// The messages hyper's HTTP/1 server hands its service for `input` (written whole, then the
/// client's side closed), each with its whole body.
pub async fn hyper_server(input: &[u8]) -> Vec<Message> {
    let (mut client, server) = tokio::io::duplex(input.len() + 64 * 1024);
    let seen: Arc<Mutex<Vec<Message>>> = Arc::default();
    let record = Arc::clone(&seen);
    let svc = service_fn(move |req: http::Request<Incoming>| {
        let record = Arc::clone(&record);
        async move {
            let (parts, body) = req.into_parts();
            if let Ok(b) = body.collect().await {
                let target = parts.uri.to_string();
                let headers =
                    parts.headers.iter().map(|(n, v)| (n.as_str().to_owned(), v.as_bytes().to_vec())).collect();
                let mut r = record.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                r.push(Message {
                    method: parts.method.to_string(),
                    target,
                    headers: sorted(headers),
                    body: b.to_bytes().to_vec(),
                });
            }
            // 200, never 101: an upgrade offer is refused, and the connection goes on as HTTP/1.
            Ok::<_, Infallible>(http::Response::new(Empty::<Bytes>::new()))
        }
    });
    // The client writes everything, then closes its side: hyper must go on with what it read.
    let conn = http1::Builder::new().half_close(true).serve_connection(TokioIo::new(server), svc);
    let task = tokio::spawn(conn);
    let _ = client.write_all(input).await;
    let _ = client.shutdown().await;
    let mut sink = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut sink)).await;
    let _ = tokio::time::timeout(Duration::from_secs(5), task).await;
    let r = seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
    r.clone()
}

/// Where keyroute and hyper disagree in a way that is not a stricter refusal by keyroute: the
/// description, or `None`.
pub fn disagreement(ours: &(Vec<Message>, End), theirs: &[Message]) -> Option<String> {
    let (messages, end) = ours;
    for (i, m) in messages.iter().enumerate() {
        match theirs.get(i) {
            None => return Some(format!("keyroute accepted message {i} ({m:?}), hyper did not")),
            Some(t) if t != m => return Some(format!("message {i} differs: keyroute {m:?}, hyper {t:?}")),
            Some(_) => {}
        }
    }
    if theirs.len() > messages.len() && !matches!(end, End::Refused(_)) {
        return Some(format!(
            "hyper framed {} messages, keyroute {} and then {end:?}: a boundary differs",
            theirs.len(),
            messages.len()
        ));
    }
    None
}
