//! Arbitrary requests through the gateway's request path (`ProxyService::call`, no client socket)
//! to in-process backends on loopback. Input: a request as in `keyroute_fuzz` (optional `@` line
//! with `peer=`, `chunks=`, `fail`; request line; headers; body).
//!
//! Once per process: a tokio runtime, two trivial hyper backends on 127.0.0.1:0 that answer 200
//! with a JSON echo of the request they received (method, target, headers, body length and hash),
//! and a gateway over them with three pools routed by host and path prefix (see `CONFIG`).
//!
//! Checks, per request: never a panic (in any thread: libfuzzer-sys aborts on every panic); a
//! complete answer within 5 s; then [`check`]: the status is the backends' 200 (with the worker
//! header, and an echo showing the request was forwarded as it should be, see [`forwarded`]: no
//! hop-by-hop headers nor those Connection names, one Host that is the routed authority, an
//! origin-form target without dot segments and with the query untouched, the gateway's Via entry,
//! one request id, the client's when valid, and the body byte for byte) or one the gateway makes
//! (400, 404, 408, 502, 503, 504, 508),
//! and every response the gateway makes is JSON with `reason`, `status` and `request_id` (equal to
//! the `x-request-id` header) that names no worker address (`127.0.0.1`) outside the request id.
//!
//! `ProxyService::call` takes heads that the listener's HTTP/1 parser would refuse (an empty
//! `Content-Length`, a body longer than its length...). So when [`check`] fails, the same request
//! is replayed as bytes over a loopback socket to the gateway's real listener: a failure there
//! too is a finding reachable by any client and panics; a head the listener's parser refuses (hyper
//! answers an empty 4xx itself), or a failure of the direct call only, is
//! counted (`direct-only`) and, with `KEYROUTE_FUZZ_STRICT=1`, panics as well. A timeout or a
//! panic is a finding either way.
//!
//! `KEYROUTE_FUZZ_CHECK_KNOWN=1` also checks the invariants of known findings (README).
//! `KEYROUTE_FUZZ_REPLAY=1` replays every input over the socket too (to triage an artifact).
//! `KEYROUTE_FUZZ_STATS=N` prints a histogram of statuses and reasons every N requests (default
//! 10,000 when N is not a number; with N=1 also each input's outcome).

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::{Decoded, body, decode};
use bytes::Bytes;
use http::header::{self, HeaderMap};
use http::{Method, Request, Response, StatusCode, Version};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use keyroute_server::{Config, Gateway, ProxyService};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::runtime::Runtime;

const BACKEND_BODY_WAIT: Duration = Duration::from_millis(200);
const WORKER_HEADER: &str = "x-keyroute-worker";
const TIMEOUT: Duration = Duration::from_secs(5);
const GATEWAY_STATUSES: [u16; 7] = [400, 404, 408, 502, 503, 504, 508];

/// Three pools: `thumbs` (the brief's key, p2c when it is missing), `strict` (a key of host,
/// header and cookie, normalised, rejected when missing; host strict.example) and `rr`
/// (round-robin, /api/). Passive ejection is off so one input's failures cannot change how the
/// next is answered; tries are bounded well under the 5 s timeout.
const CONFIG: &str = r#"
shutdown_grace_ms = 100

[admin]
listen = "127.0.0.1:0"

[[listener]]
name = "fuzz"
listen = "127.0.0.1:0"

  [[listener.route]]
  host = "strict.example"
  pool = "strict"

  [[listener.route]]
  path_prefix = "/thumb/"
  pool = "thumbs"

  [[listener.route]]
  path_prefix = "/api/"
  pool = "rr"

[[pool]]
name = "thumbs"
strategy = "rendezvous"
key = "{path}?k={query.k}"
on_missing_key = "p2c"
worker_header = "x-keyroute-worker"
connect_timeout_ms = 500
  [pool.passive]
  consecutive_failures = 0
  [pool.retry]
  attempts = 2
  per_try_timeout_ms = 1500
  deadline_ms = 2500
  @WORKERS@

[[pool]]
name = "strict"
strategy = "bounded-ring"
key = "{host}{uri} {header.x-user} {cookie.sid}"
normalize = ["lowercase", "decode"]
on_missing_key = "reject"
worker_header = "x-keyroute-worker"
connect_timeout_ms = 500
  [pool.passive]
  consecutive_failures = 0
  [pool.retry]
  attempts = 2
  per_try_timeout_ms = 1500
  deadline_ms = 2500
  @WORKERS@

[[pool]]
name = "rr"
strategy = "round-robin"
worker_header = "x-keyroute-worker"
connect_timeout_ms = 500
  [pool.passive]
  consecutive_failures = 0
  [pool.retry]
  attempts = 2
  per_try_timeout_ms = 1500
  deadline_ms = 2500
  @WORKERS@
"#;

struct World {
    rt: Runtime,
    service: ProxyService,
    /// The gateway's real listener, for replays.
    listen: SocketAddr,
    stats: Option<(Mutex<BTreeMap<String, u64>>, u64)>,
    calls: AtomicU64,
    strict: bool,
    replay_all: bool,
}

async fn backend() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind backend");
    let addr = listener.local_addr().expect("backend addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else { continue };
            tokio::spawn(async move {
                let svc = service_fn(|req: Request<Incoming>| async {
                    let (parts, body) = req.into_parts();
                    // Bounded: a body shorter than its declared length (which only a direct call
                    // can send) would otherwise hold the try until the gateway's timeout.
                    let body = match tokio::time::timeout(BACKEND_BODY_WAIT, body.collect()).await {
                        Ok(Ok(c)) => Ok(c.to_bytes()),
                        Ok(Err(_)) | Err(_) => Err(()),
                    };
                    let headers: Vec<[String; 2]> = parts
                        .headers
                        .iter()
                        .map(|(n, v)| [n.as_str().to_owned(), String::from_utf8_lossy(v.as_bytes()).into_owned()])
                        .collect();
                    let echo = serde_json::json!({
                        "method": parts.method.as_str(),
                        "uri": parts.uri.to_string(),
                        "headers": headers,
                        "body_hash": body.as_ref().ok().map(|b| hash(b)),
                        "body_len": body.as_ref().ok().map(Bytes::len),
                    });
                    let mut r = Response::new(Full::new(Bytes::from(echo.to_string())));
                    r.headers_mut().insert(header::CONTENT_TYPE, http::HeaderValue::from_static("application/json"));
                    Ok::<_, Infallible>(r)
                });
                let _ = http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    });
    addr
}

fn world() -> &'static World {
    static WORLD: OnceLock<World> = OnceLock::new();
    WORLD.get_or_init(|| {
        let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().expect("runtime");
        let (service, listen) = rt.block_on(async {
            let (a, b) = (backend().await, backend().await);
            let workers = format!(
                "[[pool.worker]]\n  name = \"w1\"\n  address = \"{a}\"\n  [[pool.worker]]\n  name = \"w2\"\n  address = \"{b}\"\n"
            );
            let text = CONFIG.replace("@WORKERS@", &workers);
            let config = Config::parse(&text, "fuzz.toml").expect("the fuzz gateway's config is valid");
            let gateway = Gateway::bind(config).await.expect("bind the gateway");
            let listen = gateway.local_addrs()[0];
            let handle = gateway.handle();
            tokio::spawn(async move {
                let _ = gateway.run(std::future::pending()).await;
            });
            (handle.service(0).expect("listener 0"), listen)
        });
        let stats = std::env::var("KEYROUTE_FUZZ_STATS")
            .ok()
            .map(|n| (Mutex::new(BTreeMap::new()), n.parse::<u64>().unwrap_or(10_000).max(1)));
        let strict = std::env::var_os("KEYROUTE_FUZZ_STRICT").is_some();
        let replay_all = std::env::var_os("KEYROUTE_FUZZ_REPLAY").is_some();
        World { rt, service, listen, stats, calls: AtomicU64::new(0), strict, replay_all }
    })
}

fn hash(b: &[u8]) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    b.hash(&mut h);
    h.finish()
}

/// The invariants of one answer to `d`; `Ok` names its class for the statistics. `sent_body` is
/// the body the gateway received, when it is known exactly.
fn check(
    d: &Decoded,
    sent_body: Option<&[u8]>,
    status: StatusCode,
    headers: &HeaderMap,
    body: Result<&Bytes, &str>,
) -> Result<String, String> {
    let method = d.head.method();
    if status == StatusCode::OK && headers.contains_key(WORKER_HEADER) {
        let worker = headers[WORKER_HEADER].to_str().unwrap_or("");
        if worker != "w1" && worker != "w2" {
            return Err(format!("worker header {worker:?}"));
        }
        let body = body.map_err(|e| format!("the backend's body failed: {e}"))?;
        if method == Method::HEAD {
            return if body.is_empty() { Ok("200 backend".into()) } else { Err(format!("a body for HEAD: {body:?}")) };
        }
        let echo: serde_json::Value =
            serde_json::from_slice(body).map_err(|e| format!("the backend's echo is not JSON ({e}): {body:?}"))?;
        forwarded(d, sent_body, &echo).map_err(|e| format!("forwarded request: {e}\n  worker saw: {echo}"))?;
        return Ok("200 backend".into());
    }
    let text = |b: &Bytes| String::from_utf8_lossy(b).into_owned();
    if !GATEWAY_STATUSES.contains(&status.as_u16()) {
        let from = headers.get(WORKER_HEADER).map_or("the gateway".to_owned(), |w| format!("worker {w:?}"));
        return Err(format!(
            "status {status} from {from}, neither the backend's 200 nor one the gateway makes: {:?}",
            body.map(text)
        ));
    }
    let body = body.map_err(|e| format!("the gateway's own {status} body failed: {e}"))?;
    if method == Method::HEAD && body.is_empty() {
        // Over a socket a HEAD response has no body; its request id header remains.
        return match headers.get("x-request-id") {
            Some(_) => Ok(format!("{} (HEAD)", status.as_u16())),
            None => Err(format!("a {status} to HEAD without x-request-id")),
        };
    }
    let v: serde_json::Value = serde_json::from_slice(body).map_err(|e| {
        let from = headers.get(WORKER_HEADER).map_or("the gateway".to_owned(), |w| format!("worker {w:?}"));
        format!("a {status} from {from} is not JSON ({e}): {:?}", text(body))
    })?;
    let reason = v["reason"].as_str().ok_or_else(|| format!("a {status} without a reason: {v}"))?;
    let id = v["request_id"].as_str().ok_or_else(|| format!("a {status} without a request_id: {v}"))?;
    if v["status"].as_u64() != Some(u64::from(status.as_u16())) {
        return Err(format!("a {status} whose status field differs: {v}"));
    }
    let header_id = headers.get("x-request-id").and_then(|h| h.to_str().ok());
    if header_id != Some(id) {
        return Err(format!("x-request-id header {header_id:?} and body differ: {v}"));
    }
    let mut rest = v.clone();
    if let Some(m) = rest.as_object_mut() {
        m.remove("request_id");
    }
    if rest.to_string().contains("127.0.0.1") {
        return Err(format!("a {status} leaks a worker address: {v}"));
    }
    Ok(format!("{} {reason}", status.as_u16()))
}

/// Headers the gateway must not forward (RFC 9110 section 7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "upgrade",
];

/// Headers the gateway sets itself after removing hop-by-hop ones, and framing (hyper's).
const SET_BY_GATEWAY: [&str; 9] = [
    "host",
    "via",
    "x-forwarded-for",
    "x-forwarded-proto",
    "x-forwarded-host",
    "forwarded",
    "x-request-id",
    "content-length",
    "transfer-encoding",
];

/// What the worker saw (`echo`) against what the client sent (`d`).
fn forwarded(d: &Decoded, sent_body: Option<&[u8]>, echo: &serde_json::Value) -> Result<(), String> {
    let seen: Vec<(String, String)> = echo["headers"]
        .as_array()
        .map(|a| {
            a.iter().map(|p| (p[0].as_str().unwrap_or("").to_owned(), p[1].as_str().unwrap_or("").to_owned())).collect()
        })
        .unwrap_or_default();
    fn values<'s>(seen: &'s [(String, String)], name: &str) -> Vec<&'s str> {
        seen.iter().filter(|(n, _)| n == name).map(|(_, v)| v.as_str()).collect()
    }
    let all = |name: &str| values(&seen, name);
    if echo["method"].as_str() != Some(d.head.method().as_str()) {
        return Err(format!("method {} became {}", d.head.method(), echo["method"]));
    }
    // Hop-by-hop headers, and those the client's Connection header names (read as bytes: a
    // value with obs-text still names the tokens around it), are not forwarded.
    for h in HOP_BY_HOP {
        if !all(h).is_empty() {
            return Err(format!("hop-by-hop header {h} forwarded"));
        }
    }
    for v in d.head.headers().get_all(header::CONNECTION) {
        for token in v.as_bytes().split(|&b| b == b',') {
            let Ok(name) = http::HeaderName::from_bytes(token.trim_ascii()) else { continue };
            if !SET_BY_GATEWAY.contains(&name.as_str()) && !all(name.as_str()).is_empty() {
                return Err(format!("{name}, named by Connection {v:?}, forwarded"));
            }
        }
    }
    // One Host: the absolute form's authority, else the client's Host.
    let hosts = all("host");
    if hosts.len() != 1 {
        return Err(format!("Host headers forwarded: {hosts:?}"));
    }
    let want_host = match d.head.uri().authority() {
        Some(a) => Some(a.as_str().to_owned()),
        None => d.head.headers().get(header::HOST).map(|h| String::from_utf8_lossy(h.as_bytes()).into_owned()),
    };
    if let Some(want) = want_host
        && hosts[0] != want
    {
        return Err(format!("Host {want:?} forwarded as {:?}", hosts[0]));
    }
    // Origin form, no dot segments, the query untouched.
    let uri = echo["uri"].as_str().unwrap_or("");
    let (path, query) = match uri.split_once('?') {
        Some((p, q)) => (p, Some(q)),
        None => (uri, None),
    };
    if !(path.starts_with('/') || path == "*") {
        return Err(format!("target {uri:?} is not in origin form"));
    }
    let dotty = |s: &str| matches!(s.replace("%2e", ".").replace("%2E", ".").as_str(), "." | "..");
    if path.split('/').any(dotty) {
        return Err(format!("path {path:?} has dot segments"));
    }
    if query != d.head.uri().query() {
        return Err(format!("query {:?} forwarded as {query:?}", d.head.uri().query()));
    }
    // The gateway's own entries.
    if !all("via").iter().any(|v| v.contains("keyroute-")) {
        return Err("no Via entry of the gateway".into());
    }
    let ids = all("x-request-id");
    if ids.len() != 1 {
        return Err(format!("x-request-id forwarded {} times", ids.len()));
    }
    if let Some(sent) = d.head.headers().get("x-request-id").and_then(|v| v.to_str().ok())
        && (1..=128).contains(&sent.len())
        && sent.bytes().all(|b| b.is_ascii_graphic())
        && ids[0] != sent
    {
        return Err(format!("the client's request id {sent:?} forwarded as {:?}", ids[0]));
    }
    // The body, byte for byte. (Found by this target and fixed: a chunked GET or HEAD body was
    // dropped, hyper's client sending no body for them without a framing header.)
    if let Some(b) = sent_body
        && (echo["body_len"].as_u64() != Some(b.len() as u64) || echo["body_hash"].as_u64() != Some(hash(b)))
    {
        return Err(format!("a body of {} bytes arrived as {} bytes (or changed)", b.len(), echo["body_len"]));
    }
    Ok(())
}

/// Whether every Content-Length value is digits and they all agree (what hyper's server
/// requires of a request).
fn lengths_valid(h: &HeaderMap) -> bool {
    let mut seen: Option<u64> = None;
    for v in h.get_all(header::CONTENT_LENGTH) {
        for part in v.as_bytes().split(|&b| b == b',') {
            let part = part.trim_ascii();
            if part.is_empty() || !part.iter().all(u8::is_ascii_digit) {
                return false;
            }
            let Some(n) = std::str::from_utf8(part).ok().and_then(|p| p.parse::<u64>().ok()) else { return false };
            if seen.is_some_and(|s| s != n) {
                return false;
            }
            seen = Some(n);
        }
    }
    true
}

/// The framing the request's headers declare: `Some(true)` chunked, `Some(false)` a valid
/// Content-Length equal to the body's length, `None` otherwise (no framing, or a length that
/// disagrees with the body: the body that arrives is then not the input's).
fn framed(d: &Decoded) -> Option<bool> {
    let h = d.head.headers();
    if let Some(te) = h.get_all(header::TRANSFER_ENCODING).iter().next_back() {
        return te.to_str().ok().is_some_and(|v| v.trim().to_ascii_lowercase().ends_with("chunked")).then_some(true);
    }
    let lengths: Vec<_> = h.get_all(header::CONTENT_LENGTH).iter().collect();
    match lengths.as_slice() {
        [one] => one.to_str().ok()?.trim().parse::<usize>().ok().filter(|n| *n == d.body.len()).map(|_| false),
        _ => None,
    }
}

/// The request as HTTP/1 bytes: its head as decoded, and its body (chunked when the request says
/// so; a failing chunked body ends with an invalid chunk). `None` for a failing body that is not
/// chunked: a client can only cut it by closing, which hyper answers by closing too.
fn wire(d: &Decoded) -> Option<Vec<u8>> {
    let h = &d.head;
    let version = if h.version() == Version::HTTP_10 { "HTTP/1.0" } else { "HTTP/1.1" };
    let mut out = format!("{} {} {version}\r\n", h.method(), h.uri()).into_bytes();
    for (name, value) in h.headers() {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
    let chunked = h
        .headers()
        .get_all(header::TRANSFER_ENCODING)
        .iter()
        .next_back()
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.trim().to_ascii_lowercase().ends_with("chunked"));
    if chunked {
        if !d.body.is_empty() {
            out.extend_from_slice(format!("{:x}\r\n", d.body.len()).as_bytes());
            out.extend_from_slice(&d.body);
            out.extend_from_slice(b"\r\n");
        }
        out.extend_from_slice(if d.options.fail { b"zz\r\n\r\n" } else { b"0\r\n\r\n" });
    } else if d.options.fail {
        return None;
    } else {
        out.extend_from_slice(&d.body);
    }
    Some(out)
}

/// Sends `bytes` on a new connection to the real listener and reads the first response. The
/// write side stays open: hyper closes a connection whose client half-closes, without answering.
async fn replay(
    addr: SocketAddr,
    bytes: &[u8],
    method: &Method,
) -> Result<(StatusCode, HeaderMap, Result<Bytes, String>), String> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    s.write_all(bytes).await.map_err(|e| format!("write: {e}"))?;
    let mut buf = Vec::new();
    let mut eof = false;
    loop {
        if let Some(r) = parse_response(&buf, method, eof)? {
            return Ok(r);
        }
        if eof {
            return Err(format!(
                "the connection closed before a complete response: {:?}",
                String::from_utf8_lossy(&buf)
            ));
        }
        let mut chunk = [0u8; 4096];
        match s.read(&mut chunk).await {
            Ok(0) | Err(_) => eof = true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
        }
    }
}

type Parsed = (StatusCode, HeaderMap, Result<Bytes, String>);

/// A complete response in `buf`, `None` when more is needed (`eof`: nothing more will come).
fn parse_response(buf: &[u8], method: &Method, eof: bool) -> Result<Option<Parsed>, String> {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut hs);
    let head_len = match r.parse(buf) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => return Ok(None),
        Err(e) => return Err(format!("bad response head ({e}): {:?}", String::from_utf8_lossy(buf))),
    };
    let status = StatusCode::from_u16(r.code.unwrap_or(0)).map_err(|e| format!("status: {e}"))?;
    if status.is_informational() {
        // `100 Continue` (the client sent `Expect`): the answer follows.
        return parse_response(&buf[head_len..], method, eof);
    }
    let mut headers = HeaderMap::new();
    for h in r.headers.iter() {
        if let (Ok(n), Ok(v)) =
            (http::HeaderName::from_bytes(h.name.as_bytes()), http::HeaderValue::from_bytes(h.value))
        {
            headers.append(n, v);
        }
    }
    let rest = &buf[head_len..];
    let body = if method == Method::HEAD || status == StatusCode::NO_CONTENT || status == StatusCode::NOT_MODIFIED {
        Ok(Bytes::new())
    } else if headers.contains_key(header::TRANSFER_ENCODING) {
        match dechunk(rest) {
            Ok(Some(b)) => Ok(Bytes::from(b)),
            Ok(None) if !eof => return Ok(None),
            Ok(None) => Err("chunked body cut short".into()),
            Err(e) => Err(e),
        }
    } else if let Some(n) = headers.get(header::CONTENT_LENGTH).and_then(|v| v.to_str().ok()?.parse::<usize>().ok()) {
        if rest.len() >= n {
            Ok(Bytes::copy_from_slice(&rest[..n]))
        } else if !eof {
            return Ok(None);
        } else {
            Err(format!("body cut at {} of {n} bytes", rest.len()))
        }
    } else if !eof {
        return Ok(None);
    } else {
        Ok(Bytes::copy_from_slice(rest))
    };
    Ok(Some((status, headers, body)))
}

/// A chunked body: `Some` when complete, `None` when more is needed.
fn dechunk(mut b: &[u8]) -> Result<Option<Vec<u8>>, String> {
    let mut out = Vec::new();
    loop {
        let (at, n) = match httparse::parse_chunk_size(b) {
            Ok(httparse::Status::Complete(x)) => x,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(_) => return Err("bad chunk size".into()),
        };
        let n = usize::try_from(n).map_err(|_| "huge chunk")?;
        if n == 0 {
            return Ok(Some(out));
        }
        let Some(data) = b.get(at..at + n) else { return Ok(None) };
        out.extend_from_slice(data);
        let Some(next) = b.get(at + n + 2..) else { return Ok(None) };
        b = next;
    }
}

/// One input (libFuzzer's, or a corpus file's in `tests/replay.rs`).
pub fn run(data: &[u8]) {
    let w = world();
    let Some(mut d) = decode(data) else { return };
    // A valid Content-Length frames the body as the listener would: bytes past it are not this
    // request's, and a body shorter than it (without an error) would only stall until a timeout.
    if !d.head.headers().contains_key(header::TRANSFER_ENCODING)
        && let [one] = d.head.headers().get_all(header::CONTENT_LENGTH).iter().collect::<Vec<_>>().as_slice()
        && let Some(n) = one.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok())
    {
        if d.body.len() > n {
            d.body.truncate(n);
        } else if d.body.len() < n && !d.options.fail {
            return;
        }
    }
    let peer = d.options.peer;
    let method = d.head.method().clone();
    let mut req = Request::new(body(&d.options, d.body.clone()));
    *req.method_mut() = method.clone();
    *req.uri_mut() = d.head.uri().clone();
    *req.version_mut() = d.head.version();
    *req.headers_mut() = d.head.headers().clone();
    let service = w.service.clone();
    let (head, bytes) = w.rt.block_on(async move {
        let answer = async {
            let (head, body) = service.call(req, peer).await.into_parts();
            (head, body.collect().await.map(|c| c.to_bytes()))
        };
        match tokio::time::timeout(TIMEOUT, answer).await {
            Ok(r) => r,
            Err(_) => panic!("no complete response within {TIMEOUT:?}"),
        }
    });
    let bytes = bytes.map_err(|e| e.to_string());
    // The direct call's body is the input's, unless it fails or its declared length disagrees.
    // (Transfer-Encoding makes the gateway drop both framing headers and hyper frame it anew.)
    let h = d.head.headers();
    let length_ok = match h.get_all(header::CONTENT_LENGTH).iter().collect::<Vec<_>>().as_slice() {
        [] => true,
        [one] => one.to_str().ok().and_then(|v| v.trim().parse::<usize>().ok()) == Some(d.body.len()),
        _ => false,
    };
    let direct_body =
        (!d.options.fail && (h.contains_key(header::TRANSFER_ENCODING) || length_ok)).then_some(&d.body[..]);
    let outcome = check(&d, direct_body, head.status, &head.headers, bytes.as_ref().map_err(String::as_str));
    // With KEYROUTE_FUZZ_REPLAY=1 every input is also replayed over a socket (for triage).
    let outcome = match outcome {
        Ok(label) if w.replay_all => Err(format!("(replaying; the direct call passed: {label})")),
        o => o,
    };
    let label = match outcome {
        Ok(label) => label,
        Err(direct) => 'replayed: {
            // hyper's server refuses a Content-Length that is not digits (or lengths that
            // differ) with its own 400: no replay needed to know (it saves a connection each).
            if !w.replay_all && !w.strict && !lengths_valid(d.head.headers()) {
                break 'replayed format!("direct-only: {}", direct.chars().take(60).collect::<String>());
            }
            let Some(bytes) = wire(&d) else {
                if w.strict && !w.replay_all {
                    panic!("direct call only (no replay of a failing unchunked body): {direct}");
                }
                break 'replayed format!("direct-only: {}", direct.chars().take(60).collect::<String>());
            };
            let replayed = w.rt.block_on(async {
                match tokio::time::timeout(TIMEOUT, replay(w.listen, &bytes, &method)).await {
                    Ok(r) => r,
                    Err(_) => panic!(
                        "direct call: {direct}\nreplay over a socket: no response within {TIMEOUT:?}\nbytes: {:?}",
                        String::from_utf8_lossy(&bytes)
                    ),
                }
            });
            let again = match &replayed {
                // hyper's own answer to a head it cannot parse (an empty 4xx without a request
                // id): the request never reaches the service over a socket.
                Ok((status, headers, Ok(b)))
                    if status.is_client_error() && b.is_empty() && !headers.contains_key("x-request-id") =>
                {
                    Ok(format!("{} refused by the listener's parser", status.as_u16()))
                }
                Ok((status, headers, body)) => {
                    // Over a socket, the body that arrives is the input's only when framed.
                    let sent = if d.options.fail {
                        None
                    } else if framed(&d).is_some() {
                        Some(&d.body[..])
                    } else {
                        None
                    };
                    check(&d, sent, *status, headers, body.as_ref().map_err(String::as_str))
                }
                Err(e) => Err(format!("replay failed: {e}")),
            };
            match again {
                Err(over_socket) => panic!(
                    "reachable over a socket: {over_socket}\ndirect call: {direct}\nbytes: {:?}",
                    String::from_utf8_lossy(&bytes)
                ),
                Ok(label) if w.strict && !w.replay_all => panic!("direct call only (over a socket: {label}): {direct}"),
                Ok(_) => format!("direct-only: {}", direct.chars().take(60).collect::<String>()),
            }
        }
    };
    if w.stats.as_ref().is_some_and(|(_, every)| *every == 1) {
        eprintln!("{:?} -> {label}", String::from_utf8_lossy(&data[..data.len().min(60)]));
    }
    count(w, label);
}

fn count(w: &World, what: String) {
    let Some((stats, every)) = &w.stats else { return };
    let mut s = stats.lock().unwrap_or_else(|e| e.into_inner());
    *s.entry(what).or_default() += 1;
    let n = w.calls.fetch_add(1, Relaxed) + 1;
    if n.is_multiple_of(*every) {
        eprintln!("request stats after {n}: {s:?}");
    }
}
