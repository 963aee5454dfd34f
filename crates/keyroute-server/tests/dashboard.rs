//! The dashboard as an operator sees it (issue 21): a real browser (Debian's Chromium, driven
//! through its ChromeDriver over the WebDriver protocol on 127.0.0.1) opens `/dashboard` on a
//! gateway with live workers and keyed traffic, and the page's DOM is checked; `/events` is checked
//! against its documented contract without a browser.
//!
//! The screenshot in the README is this test's: `KEYROUTE_SCREENSHOT=docs/dashboard.png cargo test
//! -p keyroute-gateway --test dashboard` writes it there (every run writes one under the temporary
//! directory).

mod support;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use support::*;

/// ChromeDriver and the one session it runs; both end (by pid) when this is dropped.
struct Browser {
    driver: Child,
    port: u16,
    session: String,
    _profile: TempDir,
}

struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// One WebDriver command over a fresh connection (`Connection: close`), answered within 60 s.
fn webdriver(port: u16, method: &str, path: &str, body: Option<&Value>) -> Value {
    let mut s = TcpStream::connect(("127.0.0.1", port)).expect("connect to chromedriver");
    s.set_read_timeout(Some(Duration::from_secs(60))).expect("timeout");
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nhost: 127.0.0.1:{port}\r\nconnection: close\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    s.write_all(req.as_bytes()).expect("write");
    // ChromeDriver keeps the connection open whatever the request says: read the head, then
    // Content-Length bytes.
    let mut r = BufReader::new(s);
    let mut length = 0usize;
    loop {
        let mut line = String::new();
        r.read_line(&mut line).expect("read a header line");
        let line = line.trim_end();
        if line.is_empty() {
            break;
        }
        if let Some((k, v)) = line.split_once(':')
            && k.eq_ignore_ascii_case("content-length")
        {
            length = v.trim().parse().expect("content-length");
        }
    }
    let mut buf = vec![0; length];
    r.read_exact(&mut buf).expect("read the body");
    let body = String::from_utf8_lossy(&buf);
    let v: Value = serde_json::from_str(&body).unwrap_or_else(|e| panic!("chromedriver: {e}: {body}"));
    if v["value"]["error"].is_string() {
        panic!("webdriver {method} {path}: {}", v["value"]);
    }
    v["value"].clone()
}

impl Browser {
    fn start() -> Browser {
        Browser::start_with(&[])
    }

    /// A browser started with `extra` command-line switches too.
    fn start_with(extra: &[String]) -> Browser {
        let driver_path = ["/usr/bin/chromedriver", "/usr/lib/chromium/chromedriver"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .expect("chromedriver (Debian's chromium-driver; scripts/test.sh installs it)");
        let probe = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        let port = probe.local_addr().expect("addr").port();
        drop(probe);
        let mut driver = Command::new(driver_path)
            .arg(format!("--port={port}"))
            .arg("--allowed-ips=127.0.0.1")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver");
        let out = driver.stdout.take().expect("stdout");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                let _ = tx.send(line);
            }
        });
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let line = rx
                .recv_timeout(deadline.saturating_duration_since(Instant::now()))
                .expect("chromedriver started within 20 s");
            if line.contains("started successfully") {
                break;
            }
        }
        let profile = TempDir(std::env::temp_dir().join(format!("keyroute-chromium-{}-{port}", std::process::id())));
        let mut args: Vec<String> = [
            "--headless=new",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--window-size=1500,1100",
            "--no-first-run",
            "--no-default-browser-check",
        ]
        .map(str::to_owned)
        .to_vec();
        args.push(format!("--user-data-dir={}", profile.0.display()));
        args.extend_from_slice(extra);
        let caps = json!({ "capabilities": { "alwaysMatch": {
            "browserName": "chrome",
            "goog:chromeOptions": { "binary": "/usr/bin/chromium", "args": args },
        }}});
        let mut b = Browser { driver, port, session: String::new(), _profile: profile };
        let v = webdriver(port, "POST", "/session", Some(&caps));
        b.session = v["sessionId"].as_str().expect("a session").to_owned();
        b
    }

    /// A browser with `url` open.
    fn open(url: &str) -> Browser {
        let b = Browser::start();
        b.go(url);
        b
    }

    fn go(&self, url: &str) {
        webdriver(self.port, "POST", &format!("/session/{}/url", self.session), Some(&json!({ "url": url })));
    }

    /// Runs `script` (a function body; `arguments` holds `args`) in the page and returns its value.
    fn js(&self, script: &str, args: Value) -> Value {
        webdriver(
            self.port,
            "POST",
            &format!("/session/{}/execute/sync", self.session),
            Some(&json!({ "script": script, "args": args })),
        )
    }

    /// Polls `script` until it returns something truthy, for at most `limit`.
    fn wait_for(&self, limit: Duration, what: &str, script: &str, args: Value) -> Value {
        let deadline = Instant::now() + limit;
        loop {
            let v = self.js(script, args.clone());
            if !(v.is_null() || v == false || v == 0 || v == "") {
                return v;
            }
            assert!(Instant::now() < deadline, "the page did not show {what} within {limit:?}");
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    fn screenshot(&self) -> Vec<u8> {
        let v = webdriver(self.port, "GET", &format!("/session/{}/screenshot", self.session), None);
        base64(v.as_str().expect("base64 png"))
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        if !self.session.is_empty() {
            // Closes Chromium; then ChromeDriver is killed by its pid.
            let _ = std::panic::catch_unwind(|| {
                webdriver(self.port, "DELETE", &format!("/session/{}", self.session), None)
            });
        }
        let _ = self.driver.kill();
        let _ = self.driver.wait();
    }
}

fn base64(text: &str) -> Vec<u8> {
    let val = |c: u8| match c {
        b'A'..=b'Z' => c - b'A',
        b'a'..=b'z' => c - b'a' + 26,
        b'0'..=b'9' => c - b'0' + 52,
        b'+' => 62,
        b'/' => 63,
        _ => panic!("not base64: {c}"),
    };
    let bytes: Vec<u8> = text.bytes().filter(|&c| c != b'=' && !c.is_ascii_whitespace()).map(val).collect();
    bytes
        .chunks(4)
        .flat_map(|c| {
            let n = c.iter().enumerate().fold(0u32, |n, (i, &v)| n | u32::from(v) << (18 - 6 * i));
            n.to_be_bytes()[1..c.len()].to_vec()
        })
        .collect()
}

/// Keyed requests, a few hundred a second, until the returned sender is dropped.
fn traffic(addr: SocketAddr) -> tokio::sync::oneshot::Sender<()> {
    let (tx, mut rx) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(async move {
        let c = client();
        let mut i = 0u64;
        loop {
            // A few keys are hot.
            let k = if i.is_multiple_of(3) { "hot".to_owned() } else { format!("img-{}", i % 500) };
            let url: hyper::Uri = format!("http://{addr}/thumb?k={k}").parse().expect("uri");
            let _ = tokio::time::timeout(Duration::from_secs(2), c.get(url)).await;
            i += 1;
            tokio::select! {
                _ = &mut rx => return,
                () = tokio::time::sleep(Duration::from_millis(3)) => {}
            }
        }
    });
    tx
}

/// Reads `/events` over a raw connection until `frames` data events (after the history) arrived.
async fn read_events(admin: SocketAddr, frames: usize) -> (Value, Vec<Value>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(admin).await.expect("connect");
    s.write_all(format!("GET /events HTTP/1.1\r\nhost: {admin}\r\n\r\n").as_bytes()).await.expect("write");
    let mut buf = Vec::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let mut chunk = [0u8; 65536];
        let n = tokio::time::timeout_at(deadline, s.read(&mut chunk)).await.expect("events in time").expect("read");
        assert!(n > 0, "the feed ended");
        buf.extend_from_slice(&chunk[..n]);
        let text = String::from_utf8_lossy(&buf);
        let Some((head, _)) = text.split_once("\r\n\r\n") else { continue };
        assert!(head.starts_with("HTTP/1.1 200"), "{head}");
        assert!(head.to_ascii_lowercase().contains("content-type: text/event-stream"), "{head}");
        // The body is chunked: data lines are whole within it, so they can be read off the text.
        let events: Vec<&str> = text.split("\n\n").collect();
        let history = events
            .iter()
            .find_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")).filter(|_| e.contains("event: history")));
        let data: Vec<Value> = events
            .iter()
            .filter(|e| !e.contains("event: history"))
            .filter_map(|e| e.lines().find_map(|l| l.strip_prefix("data: ")))
            .filter_map(|d| serde_json::from_str(d).ok())
            .collect();
        if let Some(h) = history
            && data.len() >= frames
        {
            return (serde_json::from_str(h).expect("history json"), data);
        }
    }
}

/// `value` has every field of `shape`, each of the type given (`"n"` number, `"n?"` number or
/// null, `"s"` string, `"s?"`, `"b"` bool, `"a"` array, `"o"` object), recursively for objects
/// and the first element of arrays.
fn conforms(path: &str, value: &Value, shape: &Value) {
    match shape {
        Value::Object(fields) => {
            for (k, want) in fields {
                let got = value.get(k).unwrap_or_else(|| panic!("{path}.{k} is missing in {value}"));
                conforms(&format!("{path}.{k}"), got, want);
            }
        }
        Value::Array(one) => {
            let items = value.as_array().unwrap_or_else(|| panic!("{path} is not an array: {value}"));
            assert!(!items.is_empty(), "{path} is empty");
            for (i, item) in items.iter().enumerate() {
                conforms(&format!("{path}[{i}]"), item, &one[0]);
            }
        }
        Value::String(t) => {
            let ok = match t.as_str() {
                "n" => value.is_number(),
                "n?" => value.is_number() || value.is_null(),
                "s" => value.is_string(),
                "s?" => value.is_string() || value.is_null(),
                "b" => value.is_boolean(),
                "a" => value.is_array(),
                "o" => value.is_object(),
                other => panic!("bad shape {other}"),
            };
            assert!(ok, "{path} should be {t}: {value}");
        }
        _ => panic!("bad shape at {path}"),
    }
}

fn affinity_shape(with_t: bool) -> Value {
    let mut v = json!({ "owner": "n", "replica": "n", "unavailable": "n", "overloaded": "n", "retry": "n",
        "warming": "n", "unkeyed": "n", "no_worker": "n" });
    if with_t {
        v["t"] = json!("n");
    }
    v
}

/// The snapshot's documented shape (src/admin/dashboard.rs).
fn snapshot_shape() -> Value {
    json!({
        "version": "n", "time": "n", "interval_ms": "n",
        "gateway": { "version": "s", "uptime_s": "n", "ready": "b", "viewers": "n" },
        "listeners": [{ "name": "s", "address": "s", "tls": "b", "admin": "b", "open": "n", "limit": "n?",
            "accepted": "n", "accepts_per_s": "n", "limited": "n", "tls_errors": "n", "h2_connections": "n",
            "upgrades": "n", "header_timeouts": "n", "send_timeouts": "n", "log_written": "n", "log_dropped": "n" }],
        "pools": [{
            "name": "s", "strategy": "s", "key": "s", "generation": "n", "source": { "kind": "s" },
            "workers": [{ "name": "s", "address": "s", "zone": "s?", "weight": "n", "state": "s", "warm_up": "n",
                "in_flight": "n", "rps": "n", "error_rate": "n", "p99_ms": "n?", "requests": "n", "errors": "n",
                "ejections": "n", "retries": "n", "key_share": "n", "request_share": "n" }],
            "affinity": affinity_shape(true), "affinity_total": affinity_shape(false),
            "balance": { "sampled_keys": "n", "keys_max_over_mean": "n?", "requests_max_over_mean": "n?" },
            "hot_keys": { "pool": "s", "enabled": "b", "keys": "a" },
            "changes": [{ "at_ms": "n", "generation": "n", "workers": "n", "added": "a", "removed": "a",
                "reweighted": "a", "remapped": "n", "sampled_keys": "n" }],
            "remapped_keys": "n",
        }],
    })
}

const POOL: &str = "[pool.health]\npath = \"/healthz\"\ninterval_ms = 300\ntimeout_ms = 250\nrise = 1\nfall = 1\n\n[pool.hot_keys]\nthreshold = 40.0\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_feed_keeps_its_contract_and_costs_nothing_unwatched() {
    let bs = backends(3).await;
    let gw = start_gateway(&config_text(&bs.iter().collect::<Vec<_>>(), POOL, "")).await;
    let stop = traffic(gw.addr);
    // A change, so the membership log has an entry.
    let (status, _) = admin(&gw, "PATCH", "/workers/w3", r#"{"weight":2}"#, None).await;
    assert_eq!(status, 200);
    let (history, data) = read_events(gw.admin, 3).await;
    assert_eq!(history["version"], 1);
    assert!(history["pools"].is_object());
    for snap in &data {
        conforms("snapshot", snap, &snapshot_shape());
        assert_eq!(snap["version"], 1);
    }
    let last = data.last().expect("a snapshot");
    let pool = &last["pools"][0];
    assert_eq!(pool["workers"].as_array().map(Vec::len), Some(3));
    assert_eq!(pool["changes"][0]["reweighted"], json!(["w3"]));
    // Shares are shares: each sums to 1 over the pool.
    for field in ["key_share", "request_share"] {
        let sum: f64 =
            pool["workers"].as_array().expect("workers").iter().map(|w| w[field].as_f64().unwrap_or(0.0)).sum();
        assert!((sum - 1.0).abs() < 0.01, "{field} sums to {sum}");
    }
    let served: u64 = data.iter().map(|s| s["pools"][0]["affinity"]["owner"].as_u64().unwrap_or(0)).sum();
    assert!(served > 0, "requests to owners are counted per second: {data:?}");
    drop(stop);
    // The reader has gone: nobody is counted, and at the next tick the sampler stops.
    eventually(Duration::from_secs(5), "no viewer left", || async {
        let (_, _, text) = get(&client(), &format!("http://{}/metrics", gw.admin)).await;
        text.lines().any(|l| l == "keyroute_dashboard_viewers 0")
    })
    .await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    // So a second subscriber gets no history: a sampler keeps it only while it runs, and a
    // new one starts empty.
    let (history, _) = read_events(gw.admin, 1).await;
    assert!(
        history["pools"].as_object().is_some_and(|p| p.values().all(|v| v.as_array().is_some_and(|a| a.len() <= 1))),
        "{history}"
    );
}

/// The admin token of the browser tests: the page is reached as an operator reaches it, logged
/// in (issue 31, defect 14: Chromium could not log in while the challenge was one line).
const TOKEN: &str = "dashboard-token-0123456789";

/// `text` with the admin token set.
fn with_token(text: &str) -> String {
    text.replacen(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        &format!("[admin]\nlisten = \"127.0.0.1:0\"\ntoken = \"{TOKEN}\"\n"),
        1,
    )
}

/// The dashboard's address with the token as the password of Basic credentials, which Chromium
/// sends once the page challenges it with Basic.
fn dashboard_url(admin: SocketAddr) -> String {
    format!("http://operator:{TOKEN}@{admin}/dashboard")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operator_sees_the_fleet_and_a_dead_worker_in_a_real_browser() {
    let mut bs = backends(4).await;
    let gw = start_gateway(&with_token(&config_text(&bs.iter().collect::<Vec<_>>(), POOL, ""))).await;
    let stop = traffic(gw.addr);
    let url = dashboard_url(gw.admin);
    let browser = tokio::task::spawn_blocking(move || Browser::open(&url)).await.expect("browser");
    let b = std::sync::Arc::new(browser);
    let run = |script: &'static str, what: &'static str, args: Value| {
        let b = std::sync::Arc::clone(&b);
        async move {
            tokio::task::spawn_blocking(move || b.wait_for(Duration::from_secs(20), what, script, args))
                .await
                .expect("js")
        }
    };
    // Every worker, with its figures, once traffic has been sampled.
    let rows = run(
        r#"const rows = [...document.querySelectorAll('tr[data-worker]')].map(r => ({
              name: r.dataset.worker, state: r.dataset.state,
              weight: r.querySelector('.weight').textContent, rps: r.querySelector('.rps').textContent,
              keys: r.querySelector('.key-share').textContent, requests: r.querySelector('.request-share').textContent,
              p99: r.querySelector('.p99').textContent }));
           return rows.length === 4 && rows.every(r => parseFloat(r.rps) > 0 && r.p99 !== '–') ? rows : null;"#,
        "four workers serving",
        json!([]),
    )
    .await;
    let mut names: Vec<&str> = rows.as_array().expect("rows").iter().filter_map(|r| r["name"].as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["w1", "w2", "w3", "w4"]);
    for r in rows.as_array().expect("rows") {
        assert_eq!(r["state"], "healthy", "{r}");
        assert_eq!(r["weight"], "1", "{r}");
        assert!(r["keys"].as_str().is_some_and(|k| k.ends_with('%')), "{r}");
    }
    // The affinity chart has drawn, the hot key is listed, the listener is there.
    run(
        r#"return document.querySelector('details.pool svg path') !== null
             && document.querySelector('[data-outcome="owner"]').textContent.includes('%')
             && document.querySelector('tr[data-listener="admin"]') !== null;"#,
        "the affinity chart and the listeners",
        json!([]),
    )
    .await;
    // The affinity axis: 0, half and the top, three distinct round values (a chart of 1/s had
    // read "0/s, 1/s, 1/s"), the top above every point drawn.
    let ticks = run(
        r#"const t = [...document.querySelectorAll('details.pool svg text.tick')].slice(0, 3).map(e => e.textContent);
           return t.length === 3 ? t : null;"#,
        "the affinity axis",
        json!([]),
    )
    .await;
    let values: Vec<f64> = ticks
        .as_array()
        .expect("labels")
        .iter()
        .map(|t| t.as_str().and_then(|t| t.trim_end_matches("/s").replace(',', "").parse().ok()).expect("a rate"))
        .collect();
    assert!(values[0] == 0.0 && values[1] > 0.0 && values[2] == 2.0 * values[1], "{ticks}");
    // The page draws the area of the latest second inside the frame.
    let inside = run(
        r#"const p = document.querySelector('details.pool svg path');
           if (!p) return null;
           const ys = [...p.getAttribute('d').matchAll(/[ML][\d.]+,([\d.]+)/g)].map(m => parseFloat(m[1]));
           return ys.length ? Math.min(...ys) : null;"#,
        "the affinity area",
        json!([]),
    )
    .await;
    assert!(inside.as_f64().is_some_and(|y| y > 6.0), "the area reaches the frame: top y {inside}");
    // The placement box answers with the ranking and a what-if.
    let answer = run(
        r#"const f = document.querySelector('form.box');
           if (!f.dataset.sent) { const [k, a] = f.querySelectorAll('input'); k.value = 'img-7'; a.value = 'w9';
             f.dataset.sent = '1'; f.requestSubmit(); }
           const t = f.querySelector('.answer').textContent;
           return t.includes('after the change') ? t : null;"#,
        "the placement box's answer",
        json!([]),
    )
    .await;
    // What the box says is what the API says for the same question: the owner, and the owner
    // and movement after the hypothetical change.
    let answer = answer.as_str().unwrap_or_default().to_owned();
    let (status, v) = admin(&gw, "GET", "/placement?key=img-7&add=w9", "", Some(TOKEN)).await;
    assert_eq!(status, 200, "{v}");
    let owner = v["owner"].as_str().expect("an owner");
    let after = v["what_if"]["owner"].as_str().expect("an owner after the change");
    assert!(answer.contains(&format!("owner {owner}")), "{answer} vs {v}");
    assert!(answer.contains(&format!("after the change: owner {after}")), "{answer} vs {v}");
    let moves = v["what_if"]["moves"].as_bool().expect("moves");
    assert_eq!(answer.contains("(the key moves)"), moves, "{answer} vs {v}");
    assert_eq!(answer.contains("(it stays)"), !moves, "{answer} vs {v}");
    // A worker dies: the page shows it not healthy within a few seconds.
    let t0 = Instant::now();
    bs[1].kill();
    let state = run(
        r#"const r = document.querySelector('tr[data-worker="w2"]');
           return r && ['unhealthy', 'ejected'].includes(r.dataset.state) ? r.dataset.state : null;"#,
        "w2 down",
        json!([]),
    )
    .await;
    eprintln!("w2 shown {state} {:.1} s after it was killed", t0.elapsed().as_secs_f64());
    assert!(t0.elapsed() < Duration::from_secs(10));
    // Let the chart show the change, then keep a picture of it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b2 = std::sync::Arc::clone(&b);
    let png = tokio::task::spawn_blocking(move || b2.screenshot()).await.expect("screenshot");
    assert!(png.starts_with(b"\x89PNG\r\n\x1a\n") && png.len() > 20_000, "a PNG of the page: {} bytes", png.len());
    let path = std::env::temp_dir().join(format!("keyroute-dashboard-{}.png", std::process::id()));
    std::fs::write(&path, &png).expect("write screenshot");
    eprintln!("screenshot: {}", path.display());
    if let Ok(dest) = std::env::var("KEYROUTE_SCREENSHOT") {
        let dest = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").join(dest);
        std::fs::write(&dest, &png).expect("write KEYROUTE_SCREENSHOT");
    }
    drop(stop);
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ten_pools_of_a_hundred_workers_stay_readable() {
    // Workers at closed ports: nobody sends to them, the page only has to show them.
    let mut text = String::from("[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n");
    for i in 0..10 {
        text.push_str(&format!("[[listener.route]]\npath_prefix = \"/p{i}/\"\npool = \"pool-{i}\"\n\n"));
    }
    for i in 0..10 {
        text.push_str(&format!("[[pool]]\nname = \"pool-{i}\"\nkey = \"{{path}}\"\n"));
        for w in 0..100 {
            text.push_str(&format!(
                "[[pool.worker]]\nname = \"w{w}\"\naddress = \"127.0.0.1:{}\"\nweight = {}\n",
                20_000 + i * 100 + w,
                1 + w % 5
            ));
        }
    }
    let gw = start_gateway(&text).await;
    let (_, data) = read_events(gw.admin, 1).await;
    let bytes = data[0].to_string().len();
    eprintln!("a snapshot of 10 pools x 100 workers: {bytes} bytes");
    assert_eq!(data[0]["pools"].as_array().map(Vec::len), Some(10));
    let url = format!("http://{}/dashboard", gw.admin);
    let out = tokio::task::spawn_blocking(move || {
        let b = Browser::open(&url);
        // Ten pools, collapsed: no worker row is drawn until one is opened.
        let pools = b.wait_for(
            Duration::from_secs(20),
            "ten pools",
            "const d = document.querySelectorAll('details.pool'); return d.length === 10 ? [d.length, [...d].filter(x => x.open).length, document.querySelectorAll('tr[data-worker]').length] : null;",
            json!([]),
        );
        assert_eq!(pools, json!([10, 0, 0]));
        // Opening one shows its first rows and says how many more there are.
        b.js("document.querySelector('details.pool[data-pool=\"pool-3\"]').open = true;", json!([]));
        let first = b.wait_for(
            Duration::from_secs(10),
            "pool-3's first rows",
            "const n = document.querySelectorAll('tr[data-pool=\"pool-3\"]').length; const m = document.querySelector('.more'); return n ? [n, m && m.textContent] : null;",
            json!([]),
        );
        assert_eq!(first[0], 25, "{first}");
        assert!(first[1].as_str().is_some_and(|t| t.contains("show all 100")), "{first}");
        b.js("document.querySelector('.more button').click();", json!([]));
        b.wait_for(Duration::from_secs(10), "all 100 rows", "return document.querySelectorAll('tr[data-pool=\"pool-3\"]').length === 100;", json!([]));
        // A header sorts by its column: by weight, largest first, ties by name (the page opens
        // sorted by state, then name, so this order is the click's)...
        let click = |label: &str| {
            b.js(
                "[...document.querySelectorAll('details.pool[data-pool=\"pool-3\"] th')].find(t => t.textContent.startsWith(arguments[0])).click();",
                json!([label]),
            )
        };
        let first = "return [...document.querySelectorAll('tr[data-pool=\"pool-3\"]')].slice(0, 3).map(r => r.dataset.worker);";
        assert_eq!(b.js(first, json!([])), json!(["w0", "w1", "w2"]), "opened in name order (one state)");
        click("weight");
        assert_eq!(b.js(first, json!([])), json!(["w99", "w94", "w89"]), "the weight-5 workers first");
        // ...then by name, numbers as numbers (w2 before w10), and again to reverse it.
        click("worker");
        assert_eq!(b.js(first, json!([])), json!(["w0", "w1", "w2"]));
        click("worker");
        assert_eq!(b.js(first, json!([])), json!(["w99", "w98", "w97"]));
        // The filter narrows the rows.
        b.js("const f = document.getElementById('filter'); f.value = 'w9'; f.dispatchEvent(new Event('input'));", json!([]));
        b.wait_for(Duration::from_secs(10), "the filtered rows", "return document.querySelectorAll('tr[data-pool=\"pool-3\"]').length === 11;", json!([]))
    })
    .await;
    out.expect("browser");
}

/// Issue 31, defects 18 and 19: a pool named `constructor` stopped the page from rendering any
/// pool, and the placement box of `pool two` answered "no such pool" (its space sent as `+`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pools_named_like_javascript_properties_or_with_spaces_render() {
    let mut text = String::from("[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n");
    let names = ["constructor", "__proto__", "toString", "pool two"];
    for (i, name) in names.iter().enumerate() {
        text.push_str(&format!("[[listener.route]]\npath_prefix = \"/p{i}/\"\npool = \"{name}\"\n\n"));
    }
    for (i, name) in names.iter().enumerate() {
        text.push_str(&format!(
            "[[pool]]\nname = \"{name}\"\nkey = \"{{path}}\"\n[[pool.worker]]\nname = \"w{i}\"\naddress = \"127.0.0.1:{}\"\n",
            21_000 + i
        ));
    }
    let gw = start_gateway(&with_token(&text)).await;
    let url = dashboard_url(gw.admin);
    let out = tokio::task::spawn_blocking(move || {
        let b = Browser::open(&url);
        let shown = b.wait_for(
            Duration::from_secs(20),
            "four pools",
            "const d = [...document.querySelectorAll('details.pool')].map(x => x.dataset.pool); return d.length === 4 ? d : null;",
            json!([]),
        );
        // The box of `pool two`, with a key holding a space.
        let answer = b.wait_for(
            Duration::from_secs(20),
            "the placement box's answer",
            r#"const f = document.querySelector('details.pool[data-pool="pool two"] form.box');
               if (!f.dataset.sent) { f.querySelector('input').value = 'a key'; f.dataset.sent = '1'; f.requestSubmit(); }
               const t = f.querySelector('.answer').textContent;
               return t ? t : null;"#,
            json!([]),
        );
        (shown, answer)
    })
    .await;
    let (shown, answer) = out.expect("browser");
    let mut shown: Vec<String> = serde_json::from_value(shown).expect("names");
    shown.sort();
    let mut want: Vec<String> = names.iter().map(|n| (*n).to_owned()).collect();
    want.sort();
    assert_eq!(shown, want);
    let answer = answer.as_str().unwrap_or_default().to_owned();
    assert!(answer.contains("owner") && answer.contains("w3"), "{answer}");
    // The box asked for the key "a key", as the API answers it.
    let c = client();
    let (status, _, body) = get(&c, &format!("http://{}/placement?pool=pool%20two&key=a%20key", gw.admin)).await;
    assert_eq!(status.as_u16(), 401, "{body}");
    let (_, v) = admin(&gw, "GET", "/placement?pool=pool%20two&key=a%20key", "", Some(TOKEN)).await;
    assert!(answer.contains(v["hash"].as_str().unwrap_or("no hash")), "{answer} vs {v}");
}

/// Issue 31, defect 17: a page of another site held `/events` slots with `<img>` tags against an
/// `admin.hosts` name over plain http (no Origin, and no Fetch Metadata: the name is not a
/// potentially trustworthy origin). Chromium resolves both names to 127.0.0.1 here.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_cross_site_image_does_not_hold_the_feed() {
    let b = Backend::start("w1").await;
    let text = config_text(&[&b], "", "").replacen(
        "[admin]\nlisten = \"127.0.0.1:0\"\n",
        "[admin]\nlisten = \"127.0.0.1:0\"\nhosts = [\"admin.test\"]\n",
        1,
    );
    let gw = start_gateway(&text).await;
    let page = format!(
        "<!doctype html><title>evil</title><img id=a src=\"http://admin.test:{0}/events\"><img id=b src=\"http://admin.test:{0}/events?2\">\
         <script>for (const i of document.images) i.onerror = i.onload = () => i.dataset.done = '1';</script>",
        gw.admin.port()
    );
    let evil = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let evil_port = evil.local_addr().expect("addr").port();
    let server = tokio::spawn(async move {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        while let Ok((mut s, _)) = evil.accept().await {
            let page = page.clone();
            tokio::spawn(async move {
                let mut buf = [0u8; 4096];
                let _ = s.read(&mut buf).await;
                let resp = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: text/html\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{page}",
                    page.len()
                );
                let _ = s.write_all(resp.as_bytes()).await;
            });
        }
    });
    let url = format!("http://evil.test:{evil_port}/");
    let rules = "--host-resolver-rules=MAP evil.test 127.0.0.1, MAP admin.test 127.0.0.1".to_owned();
    let b2 = tokio::task::spawn_blocking(move || {
        let b = Browser::start_with(&[rules]);
        b.go(&url);
        b
    })
    .await
    .expect("browser");
    let b2 = std::sync::Arc::new(b2);
    let page_b = std::sync::Arc::clone(&b2);
    // Both images were answered and ended (refused); an event stream would never end.
    let done = tokio::task::spawn_blocking(move || {
        page_b.wait_for(
            Duration::from_secs(15),
            "both images answered",
            "return [...document.images].every(i => i.dataset.done === '1');",
            json!([]),
        )
    })
    .await;
    // Nobody subscribed at any moment of the next two seconds.
    let mut held = Vec::new();
    for _ in 0..10 {
        let (_, _, metrics) = get(&client(), &format!("http://{}/metrics", gw.admin)).await;
        held.extend(metrics.lines().filter(|l| l.starts_with("keyroute_dashboard_viewers ")).map(str::to_owned));
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    server.abort();
    drop(b2);
    assert!(held.iter().all(|l| l == "keyroute_dashboard_viewers 0"), "the page held feeds: {held:?}");
    done.expect("the images were refused");
}
