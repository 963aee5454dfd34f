//! A small etcd v3 client over etcd's HTTP/JSON gateway (`/v3/...`, served by every etcd since 3.4
//! on its client port), on keyroute's own HTTP/1.1 engine ([`keyroute_http1`]): no gRPC, no
//! generated code, no `protoc`, and no HTTP client stack of its own.
//!
//! Only what membership needs: range over a prefix, put (with a lease, or only if unchanged),
//! delete, leases (grant, keep alive, revoke) and a streaming watch. The gateway's JSON encodes
//! keys and values in base64 and 64-bit integers as strings, and leaves out every field at its
//! zero value (an empty range has no `kvs`, a PUT event no `type`, a failed transaction no
//! `succeeded`); the parsing here reads all of that.
//!
//! A request goes to the endpoints in turn, starting from the last one that answered, on a fresh
//! connection each (membership traffic is a few requests a second at most), within
//! [`REQUEST_TIMEOUT`].

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};
use std::time::Duration;

use bytes::Bytes;
use http::StatusCode;
use http_body_util::{BodyExt, Full};
use keyroute_http1::{ClientConn, ExchangeError, Limits, Outgoing, ResponseBody};
use serde_json::{Value, json};
use tokio::net::TcpStream;

/// The longest a unary request (range, put, lease call) may take, connect included.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest a connection attempt to one endpoint may take.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(1000);

/// Keys asked for in one page of a prefix read (halved while a page is too large).
const RANGE_PAGE: u64 = 64;

/// The most a watch message or a response may hold: a prefix with 100k records of 200 bytes.
const MAX_RESPONSE: usize = 64 << 20;

/// What went wrong talking to etcd.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// No endpoint could be reached (or none answered in time).
    #[error("etcd unreachable: {0}")]
    Unreachable(Unreachable),
    /// etcd answered with an error.
    #[error("etcd refused the request ({status}): {message}")]
    Refused {
        /// The HTTP status.
        status: u16,
        /// etcd's message.
        message: String,
    },
    /// A revision that etcd has compacted away.
    #[error("revision {0} has been compacted")]
    Compacted(i64),
    /// An answer that is not what the etcd API returns.
    #[error("unexpected answer from etcd: {0}")]
    Protocol(Malformed),
    /// An endpoint that is not `http://host:port` or `host:port`.
    #[error("invalid etcd endpoint '{0}': expected http://HOST:PORT")]
    Endpoint(String),
    /// An answer above the 64 MiB a response may hold.
    #[error("an answer above 64 MiB")]
    TooLarge,
}

/// Why etcd could not be reached.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Unreachable {
    /// No endpoint answered; what the last one tried did.
    #[error("{endpoint}: {cause}")]
    Endpoints {
        /// The last endpoint tried.
        endpoint: String,
        /// What happened there.
        cause: Transport,
    },
    /// A request got no whole answer in time.
    #[error("no answer to {path} within {REQUEST_TIMEOUT:?}")]
    Timeout {
        /// The API path asked.
        path: &'static str,
    },
    /// A watch stream ended, or an answer broke off.
    #[error("{0}")]
    Broken(Transport),
    /// The watch stream carried etcd's own error.
    #[error("watch stream error: {message}")]
    WatchError {
        /// etcd's message.
        message: String,
    },
}

/// What went wrong on a connection to one endpoint.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Transport {
    /// The TCP connection was not made within a second.
    #[error("connect timed out")]
    ConnectTimeout,
    /// The TCP connection failed.
    #[error("connect: {0}")]
    Connect(std::io::ErrorKind),
    /// HTTP on the connection failed (the request, or reading the answer).
    #[error("{0}")]
    Http(std::sync::Arc<ExchangeError>),
    /// The request could not be written.
    #[error("write: {0}")]
    Write(std::io::ErrorKind),
    /// The stream ended before its message did.
    #[error("the stream ended")]
    Ended,
}

/// How an answer was not what the etcd API returns.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Malformed {
    /// Not JSON.
    #[error("{what}: not JSON ({error})")]
    NotJson {
        /// What was read: the API path, or `watch`.
        what: &'static str,
        /// The parser's error.
        error: std::sync::Arc<serde_json::Error>,
    },
    /// A field it always has is missing, or has the wrong type.
    #[error("{0} is missing or not of its type")]
    Field(&'static str),
    /// A 64-bit integer that is not one.
    #[error("'{0}' is not an integer")]
    NotInteger(String),
    /// Bytes that are not base64 (the first 40 characters).
    #[error("'{0}' is not base64")]
    NotBase64(String),
    /// A watch message above 64 MiB.
    #[error("a watch message above 64 MiB")]
    TooLong,
}

fn not_json(what: &'static str) -> impl FnOnce(serde_json::Error) -> EtcdError {
    move |error| EtcdError::Protocol(Malformed::NotJson { what, error: std::sync::Arc::new(error) })
}

/// A key and its value, as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Kv {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of its last change.
    pub mod_revision: i64,
    /// Its lease (0: none).
    pub lease: i64,
}

/// A range's answer: the store's revision and the keys.
#[derive(Debug, Clone, Default)]
pub struct Range {
    /// The store revision the range was read at.
    pub revision: i64,
    /// The keys, in key order.
    pub kvs: Vec<Kv>,
}

/// One change of a watched key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Event {
    /// Created or changed.
    Put(Kv),
    /// Deleted (or its lease expired).
    Delete {
        /// The key.
        key: Vec<u8>,
        /// The revision of the deletion.
        mod_revision: i64,
    },
}

impl Event {
    /// The revision of the change.
    pub fn revision(&self) -> i64 {
        match self {
            Event::Put(kv) => kv.mod_revision,
            Event::Delete { mod_revision, .. } => *mod_revision,
        }
    }
}

/// A message of a watch stream.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// The watch is set up; `revision` is the store's.
    Created {
        /// The store revision.
        revision: i64,
    },
    /// Changes, in revision order.
    Events(Vec<Event>),
    /// The start revision was compacted away: read the prefix again.
    Compacted {
        /// The oldest revision still kept.
        compact_revision: i64,
    },
    /// A message without events (progress).
    Progress {
        /// The store revision.
        revision: i64,
    },
}

/// An etcd client. See the [module documentation](self).
#[derive(Debug)]
pub struct Client {
    endpoints: Vec<String>,
    next: AtomicUsize,
}

impl Client {
    /// A client for these endpoints (`http://host:port` or `host:port`; no TLS).
    ///
    /// # Errors
    ///
    /// [`EtcdError::Endpoint`] for an endpoint that is not one, or none at all.
    pub fn new<S: AsRef<str>>(endpoints: &[S]) -> Result<Client, EtcdError> {
        let endpoints = endpoints.iter().map(|e| parse_endpoint(e.as_ref())).collect::<Result<Vec<_>, _>>()?;
        if endpoints.is_empty() {
            return Err(EtcdError::Endpoint(String::new()));
        }
        Ok(Client { endpoints, next: AtomicUsize::new(0) })
    }

    /// The endpoints, as `host:port`.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    /// Sends one request to the endpoints in turn; returns the status and the body of the first
    /// that answered.
    async fn send(&self, path: &'static str, body: &Value) -> Result<(StatusCode, ResponseBody), EtcdError> {
        let payload = Bytes::from(body.to_string());
        let start = self.next.load(Relaxed);
        let mut last = Unreachable::Timeout { path };
        for i in 0..self.endpoints.len() {
            let at = (start + i) % self.endpoints.len();
            let authority = &self.endpoints[at];
            match post(authority, path, payload.clone()).await {
                Ok(resp) => {
                    self.next.store(at, Relaxed);
                    return Ok(resp);
                }
                Err(cause) => last = Unreachable::Endpoints { endpoint: authority.clone(), cause },
            }
        }
        Err(EtcdError::Unreachable(last))
    }

    /// A unary call: the whole JSON answer, or etcd's error.
    async fn call(&self, path: &'static str, body: Value) -> Result<Value, EtcdError> {
        let call = async {
            let (status, incoming) = self.send(path, &body).await?;
            let bytes = read_limited(incoming).await?;
            let value: Value = serde_json::from_slice(&bytes).map_err(not_json(path))?;
            if !status.is_success() {
                let message = value.get("message").and_then(Value::as_str).unwrap_or("").to_owned();
                if message.contains("compacted") {
                    return Err(EtcdError::Compacted(0));
                }
                return Err(EtcdError::Refused { status: status.as_u16(), message });
            }
            Ok(value)
        };
        tokio::time::timeout(REQUEST_TIMEOUT, call)
            .await
            .unwrap_or_else(|_| Err(EtcdError::Unreachable(Unreachable::Timeout { path })))
    }

    /// Every key under `prefix`, and the revision they were read at.
    ///
    /// Read in pages (etcd's `limit`, continued after the last key, every page at the first
    /// page's revision), so that a prefix of any size is read whole, whatever sits beside the
    /// records: a page whose answer would pass the 64 MiB a response may hold is asked again at
    /// half the keys, down to one key a page.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses; the revision was compacted between two pages; a single
    /// value above 64 MiB.
    pub async fn range_prefix(&self, prefix: &[u8]) -> Result<Range, EtcdError> {
        let end = prefix_end(prefix);
        let mut from = prefix.to_vec();
        let mut revision = 0;
        let mut limit = RANGE_PAGE;
        let mut kvs = Vec::new();
        loop {
            let mut body = json!({ "key": b64(&from), "range_end": b64(&end), "limit": limit.to_string() });
            if revision != 0 {
                body["revision"] = json!(revision.to_string());
            }
            let v = match self.call("/v3/kv/range", body).await {
                Err(EtcdError::TooLarge) if limit > 1 => {
                    limit /= 2;
                    continue;
                }
                r => r?,
            };
            if revision == 0 {
                revision = header_revision(&v)?;
            }
            let page: Vec<Kv> = match v.get("kvs") {
                None => Vec::new(),
                Some(Value::Array(items)) => items.iter().map(parse_kv).collect::<Result<_, _>>()?,
                Some(_) => return Err(EtcdError::Protocol(Malformed::Field("kvs"))),
            };
            let more = v.get("more").and_then(Value::as_bool).unwrap_or(false);
            match page.last() {
                // The next page starts just after the last key read.
                Some(last) if more => {
                    from.clone_from(&last.key);
                    from.push(0);
                }
                _ => {
                    kvs.extend(page);
                    return Ok(Range { revision, kvs });
                }
            }
            kvs.extend(page);
        }
    }

    /// The store's revision, read cheaply (a count of the keys under `prefix`): a liveness check.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn revision(&self, prefix: &[u8]) -> Result<i64, EtcdError> {
        let body = json!({ "key": b64(prefix), "range_end": b64(&prefix_end(prefix)), "count_only": true });
        header_revision(&self.call("/v3/kv/range", body).await?)
    }

    /// One key, if present.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn get(&self, key: &[u8]) -> Result<Option<Kv>, EtcdError> {
        let v = self.call("/v3/kv/range", json!({ "key": b64(key) })).await?;
        match v.get("kvs").and_then(Value::as_array).and_then(|a| a.first()) {
            None => Ok(None),
            Some(kv) => parse_kv(kv).map(Some),
        }
    }

    /// Puts a value (with a lease, if not 0); returns the new revision.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses (for example an expired lease).
    pub async fn put(&self, key: &[u8], value: &[u8], lease: i64) -> Result<i64, EtcdError> {
        let mut body = json!({ "key": b64(key), "value": b64(value) });
        if lease != 0 {
            body["lease"] = json!(lease.to_string());
        }
        header_revision(&self.call("/v3/kv/put", body).await?)
    }

    /// Puts a value only if the key's last change is still `mod_revision` (0: only if absent).
    /// Returns the new revision, or `None` if the key changed meanwhile.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn put_if_unchanged(
        &self,
        key: &[u8],
        value: &[u8],
        mod_revision: i64,
        lease: i64,
    ) -> Result<Option<i64>, EtcdError> {
        let mut put = json!({ "key": b64(key), "value": b64(value) });
        if lease != 0 {
            put["lease"] = json!(lease.to_string());
        }
        let body = json!({
            "compare": [{ "key": b64(key), "target": "MOD", "result": "EQUAL", "mod_revision": mod_revision.to_string() }],
            "success": [{ "request_put": put }],
        });
        let v = self.call("/v3/kv/txn", body).await?;
        // A failed comparison leaves `succeeded` out (false is the default).
        if v.get("succeeded").and_then(Value::as_bool) == Some(true) {
            Ok(Some(header_revision(&v)?))
        } else {
            Ok(None)
        }
    }

    /// Deletes a key; returns the revision of the deletion, or `None` if there was no such key.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn delete(&self, key: &[u8]) -> Result<Option<i64>, EtcdError> {
        let v = self.call("/v3/kv/deleterange", json!({ "key": b64(key) })).await?;
        let deleted = v.get("deleted").map(num).transpose()?.unwrap_or(0) > 0;
        if deleted { Ok(Some(header_revision(&v)?)) } else { Ok(None) }
    }

    /// Grants a lease of `ttl` seconds; returns its id.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn grant(&self, ttl: u64) -> Result<i64, EtcdError> {
        let v = self.call("/v3/lease/grant", json!({ "TTL": ttl.to_string() })).await?;
        v.get("ID").map(num).transpose()?.ok_or_else(|| EtcdError::Protocol(Malformed::Field("ID")))
    }

    /// Renews a lease; returns its remaining TTL in seconds, or `None` if it has expired.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn keep_alive(&self, lease: i64) -> Result<Option<i64>, EtcdError> {
        // A streaming call: one request gets one `{"result": ...}` line, and the stream ends.
        let v = self.call("/v3/lease/keepalive", json!({ "ID": lease.to_string() })).await?;
        let result = v.get("result").unwrap_or(&v);
        let ttl = result.get("TTL").map(num).transpose()?.unwrap_or(0);
        Ok((ttl > 0).then_some(ttl))
    }

    /// Revokes a lease, deleting every key attached to it.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses (an unknown lease is not an error).
    pub async fn revoke(&self, lease: i64) -> Result<(), EtcdError> {
        match self.call("/v3/lease/revoke", json!({ "ID": lease.to_string() })).await {
            Ok(_) | Err(EtcdError::Refused { status: 404, .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Puts many values at once (transactions of 128 puts, etcd's default limit per
    /// transaction); returns the last revision written.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn put_all(&self, kvs: &[(Vec<u8>, Vec<u8>)]) -> Result<i64, EtcdError> {
        let mut revision = 0;
        for chunk in kvs.chunks(128) {
            let ops: Vec<Value> =
                chunk.iter().map(|(k, v)| json!({ "request_put": { "key": b64(k), "value": b64(v) } })).collect();
            revision = header_revision(&self.call("/v3/kv/txn", json!({ "success": ops })).await?)?;
        }
        Ok(revision)
    }

    /// Compacts the store's history up to `revision` (watches from before it are canceled).
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        self.call("/v3/kv/compaction", json!({ "revision": revision.to_string(), "physical": true })).await.map(|_| ())
    }

    /// Watches every key under `prefix` from `start_revision` on.
    ///
    /// # Errors
    ///
    /// etcd is unreachable or refuses.
    pub async fn watch(&self, prefix: &[u8], start_revision: i64) -> Result<Watch, EtcdError> {
        let body = json!({ "create_request": {
            "key": b64(prefix),
            "range_end": b64(&prefix_end(prefix)),
            "start_revision": start_revision.to_string(),
        }});
        let open = async {
            let (status, incoming) = self.send("/v3/watch", &body).await?;
            if !status.is_success() {
                let bytes = read_limited(incoming).await.unwrap_or_default();
                return Err(EtcdError::Refused {
                    status: status.as_u16(),
                    message: String::from_utf8_lossy(&bytes).into_owned(),
                });
            }
            Ok(Watch { body: incoming, buf: Vec::new() })
        };
        tokio::time::timeout(REQUEST_TIMEOUT, open)
            .await
            .unwrap_or_else(|_| Err(EtcdError::Unreachable(Unreachable::Timeout { path: "/v3/watch" })))
    }
}

/// An open watch stream: newline-delimited JSON messages, `{"result": WatchResponse}` each.
#[derive(Debug)]
pub struct Watch {
    body: ResponseBody,
    buf: Vec<u8>,
}

impl Watch {
    /// The next message. Waits as long as etcd sends nothing (no events, no progress).
    ///
    /// # Errors
    ///
    /// The stream ended or broke (etcd stopped), or carried an error or something unreadable.
    pub async fn next(&mut self) -> Result<WatchMessage, EtcdError> {
        loop {
            if let Some(end) = self.buf.iter().position(|&b| b == b'\n') {
                let line: Vec<u8> = self.buf.drain(..=end).collect();
                let line = line.trim_ascii();
                if line.is_empty() {
                    continue;
                }
                return parse_watch_line(line);
            }
            if self.buf.len() > MAX_RESPONSE {
                return Err(EtcdError::Protocol(Malformed::TooLong));
            }
            match self.body.frame().await {
                None => return Err(EtcdError::Unreachable(Unreachable::Broken(Transport::Ended))),
                Some(Err(e)) => return Err(broken(e)),
                Some(Ok(frame)) => {
                    if let Ok(data) = frame.into_data() {
                        self.buf.extend_from_slice(&data);
                    }
                }
            }
        }
    }
}

fn parse_watch_line(line: &[u8]) -> Result<WatchMessage, EtcdError> {
    let v: Value = serde_json::from_slice(line).map_err(not_json("watch"))?;
    if let Some(err) = v.get("error") {
        // The stream's own errors: `{"error": {"grpc_code", "http_code", "message", ...}}`.
        let message = err.get("message").and_then(Value::as_str).unwrap_or("").to_owned();
        return Err(EtcdError::Unreachable(Unreachable::WatchError { message }));
    }
    let r = v.get("result").ok_or_else(|| EtcdError::Protocol(Malformed::Field("result")))?;
    let revision = r.get("header").and_then(|h| h.get("revision")).map(num).transpose()?.unwrap_or(0);
    if let Some(c) = r.get("compact_revision") {
        let compact_revision = num(c)?;
        if compact_revision > 0 {
            return Ok(WatchMessage::Compacted { compact_revision });
        }
    }
    if r.get("canceled").and_then(Value::as_bool) == Some(true) {
        let reason = r.get("cancel_reason").and_then(Value::as_str).unwrap_or("no reason given");
        return Err(EtcdError::Refused { status: 200, message: format!("watch canceled: {reason}") });
    }
    if r.get("created").and_then(Value::as_bool) == Some(true) {
        return Ok(WatchMessage::Created { revision });
    }
    match r.get("events") {
        Some(Value::Array(events)) => {
            let events = events
                .iter()
                .map(|e| {
                    let kv = e.get("kv").ok_or_else(|| EtcdError::Protocol(Malformed::Field("kv")))?;
                    // PUT is the default event type, so it is left out.
                    if e.get("type").and_then(Value::as_str) == Some("DELETE") {
                        let key = unb64(kv.get("key").and_then(Value::as_str).unwrap_or(""))?;
                        let mod_revision = kv.get("mod_revision").map(num).transpose()?.unwrap_or(0);
                        Ok(Event::Delete { key, mod_revision })
                    } else {
                        parse_kv(kv).map(Event::Put)
                    }
                })
                .collect::<Result<Vec<_>, EtcdError>>()?;
            Ok(WatchMessage::Events(events))
        }
        _ => Ok(WatchMessage::Progress { revision }),
    }
}

/// One POST on a fresh connection; the status and the body stream (which owns the connection).
async fn post(authority: &str, path: &str, payload: Bytes) -> Result<(StatusCode, ResponseBody), Transport> {
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(authority))
        .await
        .map_err(|_| Transport::ConnectTimeout)?
        .map_err(|e| Transport::Connect(e.kind()))?;
    // The endpoint was validated as `host:port` ([`parse_endpoint`]): a Host of visible text.
    let head = format!(
        "POST {path} HTTP/1.1\r\nhost: {authority}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n",
        payload.len()
    );
    let outgoing = Outgoing::Length(payload.len() as u64);
    let body = Full::new(payload).map_err(|never| match never {}).boxed_unsync();
    match keyroute_http1::send(ClientConn::new(stream), head.as_bytes(), body, outgoing, false, &Limits::default())
        .await
    {
        Ok(resp) => {
            let status = StatusCode::from_u16(resp.head.status()).unwrap_or(StatusCode::BAD_GATEWAY);
            Ok((status, resp.body))
        }
        Err(keyroute_http1::SendError::NotSent(e, _)) => Err(Transport::Write(e.kind())),
        Err(keyroute_http1::SendError::Failed(e)) => Err(Transport::Http(std::sync::Arc::new(e))),
    }
}

fn broken(e: ExchangeError) -> EtcdError {
    EtcdError::Unreachable(Unreachable::Broken(Transport::Http(std::sync::Arc::new(e))))
}

async fn read_limited(mut body: ResponseBody) -> Result<Vec<u8>, EtcdError> {
    let mut out = Vec::new();
    while let Some(frame) = body.frame().await {
        let frame = frame.map_err(broken)?;
        if let Ok(data) = frame.into_data() {
            out.extend_from_slice(&data);
            if out.len() > MAX_RESPONSE {
                return Err(EtcdError::TooLarge);
            }
        }
    }
    Ok(out)
}

fn parse_endpoint(e: &str) -> Result<String, EtcdError> {
    let rest = e.strip_prefix("http://").unwrap_or(e);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    let ok = rest.rsplit_once(':').is_some_and(|(host, port)| {
        !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0) && !host.contains(['/', '@', ' '])
    });
    if e.starts_with("https://") || !ok {
        return Err(EtcdError::Endpoint(e.to_owned()));
    }
    Ok(rest.to_owned())
}

/// The end of a prefix range: the prefix with its last byte below 0xff incremented (`\0` for
/// "every key" when the prefix is all 0xff or empty).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

fn header_revision(v: &Value) -> Result<i64, EtcdError> {
    v.get("header")
        .and_then(|h| h.get("revision"))
        .map(num)
        .transpose()?
        .ok_or_else(|| EtcdError::Protocol(Malformed::Field("header.revision")))
}

/// A 64-bit integer, which the JSON gateway writes as a string.
fn num(v: &Value) -> Result<i64, EtcdError> {
    match v {
        Value::String(s) => s.parse().map_err(|_| EtcdError::Protocol(Malformed::NotInteger(s.clone()))),
        Value::Number(n) => n.as_i64().ok_or_else(|| EtcdError::Protocol(Malformed::NotInteger(n.to_string()))),
        other => Err(EtcdError::Protocol(Malformed::NotInteger(other.to_string()))),
    }
}

fn parse_kv(kv: &Value) -> Result<Kv, EtcdError> {
    let text = |name: &str| kv.get(name).and_then(Value::as_str).unwrap_or("");
    let int = |name: &str| kv.get(name).map(num).transpose().map(|n| n.unwrap_or(0));
    Ok(Kv {
        key: unb64(text("key"))?,
        value: unb64(text("value"))?,
        mod_revision: int("mod_revision")?,
        lease: int("lease")?,
    })
}

/// Standard base64 with padding, as the JSON gateway reads and writes bytes.
fn b64(bytes: &[u8]) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

fn unb64(text: &str) -> Result<Vec<u8>, EtcdError> {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| EtcdError::Protocol(Malformed::NotBase64(text.chars().take(40).collect())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_round_trips() {
        for (raw, enc) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"svc/", "c3ZjLw=="),
            (b"\xff\x00\xfe", "/wD+"),
        ] {
            assert_eq!(b64(raw), enc);
            assert_eq!(unb64(enc).expect("valid"), raw);
        }
        assert!(unb64("!!!").is_err());
        assert!(unb64("Z").is_err());
    }

    #[test]
    fn prefix_ends() {
        assert_eq!(prefix_end(b"svc/"), b"svc0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn endpoints_parse() {
        assert_eq!(parse_endpoint("http://127.0.0.1:2379").expect("ok"), "127.0.0.1:2379");
        assert_eq!(parse_endpoint("localhost:2379/").expect("ok"), "localhost:2379");
        for bad in ["https://x:1", "x", "x:0", "x:99999", ":2379", "http://a/b:1"] {
            assert!(parse_endpoint(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn watch_lines_as_etcd_3_4_writes_them() {
        let created = br#"{"result":{"header":{"cluster_id":"3","member_id":"3","revision":"12","raft_term":"2"},"created":true}}"#;
        assert_eq!(parse_watch_line(created).expect("ok"), WatchMessage::Created { revision: 12 });
        let events = br#"{"result":{"header":{"revision":"15"},"events":[{"kv":{"key":"dy9h","create_revision":"13","mod_revision":"14","version":"2","value":"Mg=="}},{"type":"DELETE","kv":{"key":"dy9h","mod_revision":"15"}}]}}"#;
        assert_eq!(
            parse_watch_line(events).expect("ok"),
            WatchMessage::Events(vec![
                Event::Put(Kv { key: b"w/a".to_vec(), value: b"2".to_vec(), mod_revision: 14, lease: 0 }),
                Event::Delete { key: b"w/a".to_vec(), mod_revision: 15 },
            ])
        );
        let compacted =
            br#"{"result":{"header":{"cluster_id":"3","raft_term":"2"},"canceled":true,"compact_revision":"17"}}"#;
        assert_eq!(parse_watch_line(compacted).expect("ok"), WatchMessage::Compacted { compact_revision: 17 });
        let closing = br#"{"error":{"grpc_code":14,"http_code":503,"message":"transport is closing","http_status":"Service Unavailable"}}"#;
        assert!(matches!(parse_watch_line(closing), Err(EtcdError::Unreachable(_))));
        assert!(parse_watch_line(b"not json").is_err());
    }
}
