//! Access logs: one line per request, written off the request path.
//!
//! The request path only fills an [`Entry`] (no formatting, no I/O) and offers it to a bounded
//! queue; when the queue is full the line is dropped and counted
//! (`keyroute_listener_access_log_dropped_total`): a slow disk never stalls a request. A thread of
//! its own formats and writes the lines, flushing whenever the queue runs empty.
//!
//! A line is written when the response has been sent (its body ended or was dropped), so that it
//! carries the bytes sent and the whole duration. Fields: `time` (RFC 3339, UTC, when the request
//! arrived), `client`, `method`, `path`, `protocol` (`h1`, `h2`), `tls`, `status`, `bytes` (response
//! body), `duration_ms`, `pool`, `worker`, `decision` (`owner`, `unavailable`, `overloaded`,
//! `unkeyed`, or `-` when no worker was tried), `attempts`, `key_hash`, `key` (only when the
//! listener's `access_log.key` is on) and `request_id`. A tunnel (status 101) is logged when it
//! closes: `bytes` is what the worker sent the client, `tunnel_up` and `tunnel_down` the bytes
//! each way, `duration_ms` the tunnel's whole life.

use std::fmt::Write as _;
use std::io::Write as _;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering::Relaxed};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime};

use bytes::Bytes;
use http_body::{Body, Frame, SizeHint};
use tokio::sync::mpsc;
use tokio::time::Instant;

use crate::body::{BoxError, ProxyBody};
use crate::config::{AccessLogConfig, AccessLogFormat};
use crate::head::Answer;
use keyroute_fleet::metrics::ListenerMetrics;

/// What the request path learnt about a request: put in the response's extensions by the proxy,
/// read when the line is written.
#[derive(Clone, Debug, Default)]
pub(crate) struct Placed {
    /// The request id.
    pub request_id: String,
    /// The pool it was routed to.
    pub pool: Option<Arc<str>>,
    /// The worker that answered (the last one tried).
    pub worker: Option<Arc<str>>,
    /// How the first try was placed.
    pub decision: &'static str,
    /// Tries made.
    pub attempts: u32,
    /// The key's hash.
    pub key_hash: Option<u64>,
    /// The key itself (only kept when the log asks for it).
    pub key: Option<String>,
}

/// One request, as the log writes it.
#[derive(Debug)]
pub(crate) struct Entry {
    time: SystemTime,
    client: SocketAddr,
    method: http::Method,
    uri: http::Uri,
    h2: bool,
    tls: bool,
    status: u16,
    bytes: u64,
    duration: Duration,
    placed: Placed,
    /// For a tunnel: the bytes each way, when it closed.
    tunnel: Option<TunnelEnd>,
}

/// A tunnel's bytes, client to worker (`up`) and worker to client (`down`), sent when it closes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct TunnelEnd {
    /// Client to worker.
    pub up: u64,
    /// Worker to client.
    pub down: u64,
}

/// In a 101 response's extensions: the tunnel's end, which its access-log line waits for
/// (extensions must be `Clone`; the first to take it has it).
#[derive(Clone, Debug)]
pub(crate) struct TunnelLine(Arc<parking_lot::Mutex<Option<tokio::sync::oneshot::Receiver<TunnelEnd>>>>);

impl TunnelLine {
    /// A line that waits for `end`.
    pub(crate) fn new(end: tokio::sync::oneshot::Receiver<TunnelEnd>) -> TunnelLine {
        TunnelLine(Arc::new(parking_lot::Mutex::new(Some(end))))
    }

    fn take(&self) -> Option<tokio::sync::oneshot::Receiver<TunnelEnd>> {
        self.0.lock().take()
    }
}

/// What the writer thread is sent.
#[derive(Debug)]
enum Msg {
    Line(Box<Entry>),
    /// Reopen the file at its path (after logrotate moved or deleted it).
    Reopen,
}

/// A listener's access log: the queue to its writer thread.
#[derive(Debug)]
pub struct AccessLog {
    tx: mpsc::Sender<Msg>,
    key: bool,
    metrics: Arc<ListenerMetrics>,
    /// Set by [`AccessLog::reopen`]; the writer reopens before its next line.
    reopen: Arc<AtomicBool>,
}

impl AccessLog {
    /// Opens the log (the file is created or appended to) and starts its writer thread.
    ///
    /// # Errors
    ///
    /// The file cannot be opened.
    pub fn open(config: &AccessLogConfig, metrics: Arc<ListenerMetrics>) -> std::io::Result<Arc<AccessLog>> {
        let out = Output::open(&config.path)?;
        let (tx, rx) = mpsc::channel(config.buffer);
        let format = config.format;
        let written = Arc::clone(&metrics);
        let reopen = Arc::new(AtomicBool::new(false));
        let asked = Arc::clone(&reopen);
        let path = config.path.clone();
        std::thread::Builder::new()
            .name("keyroute-access-log".into())
            .spawn(move || write_lines(rx, out, &path, &asked, format, &written))?;
        Ok(Arc::new(AccessLog { tx, key: config.key, metrics, reopen }))
    }

    /// Reopens the file at its path, as NGINX does on `SIGUSR1`: after logrotate has moved the
    /// file away (or deleted it), lines go to a new file at the configured path. Lines already
    /// queued go to the new file; none is lost. Standard output is left as it is.
    pub fn reopen(&self) {
        self.reopen.store(true, Relaxed);
        // Wakes an idle writer; a full queue means it is busy and will see the flag anyway.
        let _ = self.tx.try_send(Msg::Reopen);
    }

    /// Whether lines carry the key itself.
    pub(crate) fn wants_key(&self) -> bool {
        self.key
    }

    fn offer(&self, entry: Entry) {
        if self.tx.try_send(Msg::Line(Box::new(entry))).is_err() {
            self.metrics.log_dropped.fetch_add(1, Relaxed);
        }
    }
}

/// Where lines go: a file opened for appending, or standard output (`-`).
enum Output {
    File(std::fs::File),
    Stdout(std::io::Stdout),
}

impl Output {
    fn open(path: &std::path::Path) -> std::io::Result<Output> {
        if path.as_os_str() == "-" {
            return Ok(Output::Stdout(std::io::stdout()));
        }
        Ok(Output::File(std::fs::OpenOptions::new().create(true).append(true).open(path)?))
    }
}

impl std::io::Write for Output {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        match self {
            Output::File(f) => f.write(buf),
            Output::Stdout(s) => s.write(buf),
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        match self {
            Output::File(f) => f.flush(),
            Output::Stdout(s) => s.flush(),
        }
    }
}

fn write_lines(
    mut rx: mpsc::Receiver<Msg>,
    out: Output,
    path: &std::path::Path,
    reopen: &AtomicBool,
    format: AccessLogFormat,
    metrics: &ListenerMetrics,
) {
    let mut out = std::io::BufWriter::with_capacity(64 * 1024, out);
    let mut line = String::with_capacity(512);
    while let Some(first) = rx.blocking_recv() {
        let mut next = Some(first);
        while let Some(msg) = next {
            if reopen.swap(false, Relaxed) && path.as_os_str() != "-" {
                // What is buffered belongs to the old file.
                let _ = out.flush();
                match Output::open(path) {
                    Ok(file) => {
                        out = std::io::BufWriter::with_capacity(64 * 1024, file);
                        tracing::info!(path = %path.display(), "access log reopened");
                    }
                    Err(e) => {
                        tracing::error!(path = %path.display(), error = %e, "access log not reopened; still writing to the old file")
                    }
                }
            }
            if let Msg::Line(e) = msg {
                line.clear();
                render(&e, format, &mut line);
                if out.write_all(line.as_bytes()).is_ok() {
                    metrics.log_written.fetch_add(1, Relaxed);
                }
            }
            next = rx.try_recv().ok();
        }
        // The queue ran empty: write out what is buffered.
        let _ = out.flush();
    }
    let _ = out.flush();
}

/// `2026-12-01T10:54:54.123Z`.
fn rfc3339(t: SystemTime, out: &mut String) {
    let t = time::OffsetDateTime::from(t);
    let _ = write!(
        out,
        "{:04}-{:02}-{:02}T{:02}:{:02}:{:02}.{:03}Z",
        t.year(),
        u8::from(t.month()),
        t.day(),
        t.hour(),
        t.minute(),
        t.second(),
        t.millisecond()
    );
}

/// A JSON string (quotes, backslashes and control characters escaped), by serde_json: a logfmt
/// value that needs quoting.
fn json_str(s: &str, out: &mut String) {
    match serde_json::to_string(s) {
        Ok(quoted) => out.push_str(&quoted),
        Err(_) => out.push_str("\"\""),
    }
}

/// A logfmt value: bare when it needs no quoting, else quoted like JSON.
fn logfmt_str(s: &str, out: &mut String) {
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_graphic() && b != b'"' && b != b'=' && b != b'\\') {
        out.push_str(s);
    } else {
        json_str(s, out);
    }
}

/// One line's fields, in order: serialised by serde for JSON, written pair by pair for logfmt.
/// `tunnel_*` only for a tunnel, `key` only when the log keeps keys.
#[derive(serde::Serialize)]
struct Line<'a> {
    time: &'a str,
    client: &'a str,
    method: &'a str,
    path: &'a str,
    protocol: &'a str,
    pool: &'a str,
    worker: &'a str,
    decision: &'a str,
    tls: bool,
    status: u16,
    bytes: u64,
    /// Rounded to microseconds.
    duration_ms: f64,
    attempts: u32,
    key_hash: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tunnel_up: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tunnel_down: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    key: Option<&'a str>,
    request_id: &'a str,
}

impl Line<'_> {
    fn logfmt(&self, out: &mut String) {
        let text = [
            ("time", self.time),
            ("client", self.client),
            ("method", self.method),
            ("path", self.path),
            ("protocol", self.protocol),
            ("pool", self.pool),
            ("worker", self.worker),
            ("decision", self.decision),
        ];
        for (i, (k, v)) in text.into_iter().enumerate() {
            if i > 0 {
                out.push(' ');
            }
            let _ = write!(out, "{k}=");
            logfmt_str(v, out);
        }
        let _ = write!(
            out,
            " tls={} status={} bytes={} duration_ms={:.3} attempts={} key_hash={}",
            self.tls,
            self.status,
            self.bytes,
            self.duration_ms,
            self.attempts,
            self.key_hash.unwrap_or("-")
        );
        if let (Some(up), Some(down)) = (self.tunnel_up, self.tunnel_down) {
            let _ = write!(out, " tunnel_up={up} tunnel_down={down}");
        }
        if let Some(k) = self.key {
            out.push_str(" key=");
            logfmt_str(k, out);
        }
        out.push_str(" request_id=");
        logfmt_str(self.request_id, out);
        out.push('\n');
    }
}

fn render(e: &Entry, format: AccessLogFormat, out: &mut String) {
    let mut time = String::with_capacity(24);
    rfc3339(e.time, &mut time);
    let p = &e.placed;
    let hash = p.key_hash.map(|h| format!("{h:016x}"));
    let client = e.client.to_string();
    let line = Line {
        time: &time,
        client: &client,
        method: e.method.as_str(),
        path: e.uri.path_and_query().map_or("/", |pq| pq.as_str()),
        protocol: if e.h2 { "h2" } else { "h1" },
        pool: p.pool.as_deref().unwrap_or("-"),
        worker: p.worker.as_deref().unwrap_or("-"),
        decision: if p.decision.is_empty() { "-" } else { p.decision },
        tls: e.tls,
        status: e.status,
        bytes: e.bytes,
        duration_ms: (e.duration.as_secs_f64() * 1_000_000.0).round() / 1000.0,
        attempts: p.attempts,
        key_hash: hash.as_deref(),
        tunnel_up: e.tunnel.map(|t| t.up),
        tunnel_down: e.tunnel.map(|t| t.down),
        key: p.key.as_deref(),
        request_id: &p.request_id,
    };
    match format {
        // Borrowed strings and numbers into a String: serialising cannot fail.
        AccessLogFormat::Json => {
            if let Ok(json) = serde_json::to_string(&line) {
                out.push_str(&json);
                out.push('\n');
            }
        }
        AccessLogFormat::Logfmt => line.logfmt(out),
    }
}

/// What a connection knows of its requests for the log.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conn {
    /// The client.
    pub client: SocketAddr,
    /// HTTP/2.
    pub h2: bool,
    /// Over TLS.
    pub tls: bool,
}

/// The request's side of a line, taken before the request is handled.
#[derive(Debug)]
pub(crate) struct Pending {
    time: SystemTime,
    started: Instant,
    method: http::Method,
    uri: http::Uri,
    conn: Conn,
}

impl Pending {
    /// Notes a request as it arrives.
    pub(crate) fn new(method: &http::Method, uri: &http::Uri, conn: Conn) -> Pending {
        Pending { time: SystemTime::now(), started: Instant::now(), method: method.clone(), uri: uri.clone(), conn }
    }
}

/// Wraps a response so that its line is offered to `log` when its body ends or is dropped; a
/// tunnel's line (a 101 with a [`TunnelLine`]) when the tunnel closes, with its bytes each way.
pub(crate) fn logged(log: &Arc<AccessLog>, pending: Pending, mut resp: Answer) -> Answer {
    let placed = resp.head.extensions.remove::<Placed>().unwrap_or_default();
    let status = resp.head.status.as_u16();
    if let Some(end) = resp.head.extensions.remove::<TunnelLine>().and_then(|t| t.take()) {
        let log = Arc::clone(log);
        tokio::spawn(async move {
            let tunnel = end.await.unwrap_or_default();
            log.offer(pending.entry(status, tunnel.down, placed, Some(tunnel)));
        });
        return resp;
    }
    resp.map(|inner| {
        let body = Logged { inner, log: Arc::clone(log), pending: Some((pending, placed)), status, bytes: 0 };
        http_body_util::BodyExt::boxed_unsync(body)
    })
}

struct Logged {
    inner: ProxyBody,
    log: Arc<AccessLog>,
    pending: Option<(Pending, Placed)>,
    status: u16,
    bytes: u64,
}

impl Pending {
    fn entry(self, status: u16, bytes: u64, placed: Placed, tunnel: Option<TunnelEnd>) -> Entry {
        Entry {
            time: self.time,
            client: self.conn.client,
            method: self.method,
            uri: self.uri,
            h2: self.conn.h2,
            tls: self.conn.tls,
            status,
            bytes,
            duration: self.started.elapsed(),
            placed,
            tunnel,
        }
    }
}

impl Logged {
    fn finish(&mut self) {
        if let Some((p, placed)) = self.pending.take() {
            self.log.offer(p.entry(self.status, self.bytes, placed, None));
        }
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        self.finish();
    }
}

impl Body for Logged {
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let poll = Pin::new(&mut self.inner).poll_frame(cx);
        match &poll {
            Poll::Ready(Some(Ok(frame))) => {
                if let Some(d) = frame.data_ref() {
                    self.bytes += d.len() as u64;
                }
                if self.inner.is_end_stream() {
                    self.finish();
                }
            }
            Poll::Ready(None) | Poll::Ready(Some(Err(_))) => self.finish(),
            Poll::Pending => {}
        }
        poll
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_are_rfc3339_utc() {
        let mut s = String::new();
        rfc3339(SystemTime::UNIX_EPOCH + Duration::from_millis(1_796_122_494_123), &mut s);
        assert_eq!(s, "2026-12-01T10:54:54.123Z");
        s.clear();
        rfc3339(SystemTime::UNIX_EPOCH + Duration::from_secs(951_782_400), &mut s); // a leap day
        assert_eq!(s, "2000-02-29T00:00:00.000Z");
    }

    #[test]
    fn lines_in_both_formats() {
        let e = Entry {
            time: SystemTime::UNIX_EPOCH,
            client: "10.0.0.1:5000".parse().expect("addr"),
            method: http::Method::GET,
            uri: "/a?b=c".parse().expect("uri"),
            h2: true,
            tls: true,
            status: 200,
            bytes: 5,
            duration: Duration::from_micros(1500),
            placed: Placed {
                request_id: "r1".into(),
                pool: Some("p".into()),
                worker: Some("w1".into()),
                decision: "owner",
                attempts: 1,
                key_hash: Some(0xab),
                key: Some("k \"1\"".into()),
            },
            tunnel: None,
        };
        let mut s = String::new();
        render(&e, AccessLogFormat::Json, &mut s);
        let v: serde_json::Value = serde_json::from_str(s.trim_end()).expect("a JSON line");
        assert_eq!(v["path"], "/a?b=c");
        assert_eq!(
            (v["status"].as_u64(), v["bytes"].as_u64(), v["protocol"].as_str()),
            (Some(200), Some(5), Some("h2"))
        );
        assert_eq!(
            (v["key_hash"].as_str(), v["key"].as_str(), v["request_id"].as_str()),
            (Some("00000000000000ab"), Some("k \"1\""), Some("r1"))
        );
        s.clear();
        render(&e, AccessLogFormat::Logfmt, &mut s);
        assert!(
            s.starts_with("time=1970-01-01T00:00:00.000Z client=10.0.0.1:5000 method=GET path=\"/a?b=c\" protocol=h2"),
            "{s}"
        );
        assert!(s.ends_with(" key=\"k \\\"1\\\"\" request_id=r1\n"), "{s}");
    }
}
