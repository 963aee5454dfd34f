//! End-to-end tests: real workers on `127.0.0.1:0`, real HTTP/1.1 over a `TcpStream`, real files.
//!
//! Each test gets its own directory under Cargo's per-target temporary directory, with
//! `images/` (generated sources), `cache/` and, for the traversal test, files outside `images/`.
//! Every network step is bounded by a timeout.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use keyroute_worker::{Worker, WorkerConfig, WorkerError, WorkerStats, generate_images};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

/// The bound on any single network exchange or shutdown.
const STEP: Duration = Duration::from_secs(20);

/// A fresh directory for one test, with `images/` holding three 320x240 sources.
struct Fixture {
    root: PathBuf,
}

impl Fixture {
    fn new(test: &str) -> Fixture {
        let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("keyroute-worker-{test}"));
        let _ = std::fs::remove_dir_all(&root);
        std::fs::create_dir_all(&root).expect("create fixture root");
        generate_images(&root.join("images"), 3, 320, 240, 42).expect("generate images");
        Fixture { root }
    }

    fn images(&self) -> PathBuf {
        self.root.join("images")
    }

    fn cache(&self) -> PathBuf {
        self.root.join("cache")
    }

    fn config(&self, name: &str) -> WorkerConfig {
        WorkerConfig {
            name: name.to_owned(),
            images: self.images(),
            cache_dir: self.cache(),
            ..WorkerConfig::default()
        }
    }
}

impl Drop for Fixture {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// A worker running on a spawned task.
struct Running {
    addr: SocketAddr,
    stats: Arc<WorkerStats>,
    stop: oneshot::Sender<()>,
    task: JoinHandle<Result<(), WorkerError>>,
}

async fn start(config: WorkerConfig) -> Running {
    let worker = Worker::bind("127.0.0.1:0".parse().expect("addr"), config).await.expect("bind worker");
    let addr = worker.local_addr();
    let stats = worker.stats();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(worker.run(async {
        let _ = stopped.await;
    }));
    Running { addr, stats, stop, task }
}

impl Running {
    async fn stop(self) {
        let _ = self.stop.send(());
        let joined = tokio::time::timeout(STEP, self.task).await.expect("worker stops in time");
        joined.expect("worker task").expect("worker run");
    }
}

/// One parsed HTTP response.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers.iter().find(|(n, _)| n.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str())
    }

    fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// Sends one request on a fresh connection (`Connection: close`) and reads the whole response.
async fn request(addr: SocketAddr, method: &str, target: &str, headers: &[(&str, &str)]) -> Reply {
    let exchange = async {
        let mut stream = TcpStream::connect(addr).await.expect("connect");
        let mut head = format!("{method} {target} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
        for (name, value) in headers {
            head.push_str(&format!("{name}: {value}\r\n"));
        }
        if method == "POST" {
            head.push_str("Content-Length: 0\r\n");
        }
        head.push_str("\r\n");
        stream.write_all(head.as_bytes()).await.expect("write request");
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).await.expect("read response");
        raw
    };
    let raw = tokio::time::timeout(STEP, exchange).await.expect("response in time");
    let split = raw.windows(4).position(|w| w == b"\r\n\r\n").expect("end of headers");
    let head = String::from_utf8(raw[..split].to_vec()).expect("ascii head");
    let mut lines = head.split("\r\n");
    let status_line = lines.next().expect("status line");
    let status = status_line.split(' ').nth(1).and_then(|s| s.parse().ok()).expect("status code");
    let headers = lines
        .filter_map(|line| line.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect::<Vec<_>>();
    let reply = Reply { status, headers, body: raw[split + 4..].to_vec() };
    if method != "HEAD" {
        let length: usize = reply.header("content-length").and_then(|v| v.parse().ok()).expect("content-length");
        assert_eq!(length, reply.body.len(), "content-length matches the body");
    }
    reply
}

async fn get(addr: SocketAddr, target: &str) -> Reply {
    request(addr, "GET", target, &[]).await
}

fn decode(body: &[u8]) -> image::DynamicImage {
    image::load_from_memory(body).expect("thumbnail decodes")
}

fn cache_files(dir: &Path) -> Vec<(String, u64)> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .expect("read cache dir")
        .map(|e| e.expect("entry"))
        .map(|e| (e.file_name().to_string_lossy().into_owned(), e.metadata().expect("metadata").len()))
        .collect();
    files.sort();
    files
}

#[tokio::test]
async fn miss_then_hit_with_fitting_dimensions() {
    let fx = Fixture::new("miss-hit");
    let worker = start(fx.config("w-a")).await;

    let first = get(worker.addr, "/thumb/img-000.jpg?w=100&h=100").await;
    assert_eq!(first.status, 200, "{}", first.text());
    assert_eq!(first.header("x-cache"), Some("miss"));
    assert_eq!(first.header("x-worker"), Some("w-a"));
    assert_eq!(first.header("content-type"), Some("image/jpeg"));
    assert_eq!(first.header("cache-control"), Some("public, max-age=86400"));
    let thumb = decode(&first.body);
    assert_eq!(image::guess_format(&first.body).expect("format"), image::ImageFormat::Jpeg);
    // 320x240 into 100x100: width-bound, 100x75.
    assert_eq!((thumb.width(), thumb.height()), (100, 75));

    let second = get(worker.addr, "/thumb/img-000.jpg?w=100&h=100").await;
    assert_eq!(second.status, 200);
    assert_eq!(second.header("x-cache"), Some("hit"));
    assert_eq!(second.body, first.body, "a hit serves the stored bytes");

    // A tall box: height-bound, aspect preserved.
    let tall = get(worker.addr, "/thumb/img-001.jpg?w=200&h=60").await;
    assert_eq!(tall.status, 200);
    let tall = decode(&tall.body);
    assert!(tall.width() <= 200 && tall.height() <= 60, "{}x{}", tall.width(), tall.height());
    assert_eq!(tall.height(), 60);
    let aspect = f64::from(tall.width()) / f64::from(tall.height());
    assert!((aspect - 320.0 / 240.0).abs() < 0.03, "aspect {aspect}");

    // A box larger than the source never enlarges it.
    let big = get(worker.addr, "/thumb/img-002.jpg?w=2000&h=2000").await;
    assert_eq!(big.status, 200);
    let big = decode(&big.body);
    assert_eq!((big.width(), big.height()), (320, 240));

    // HEAD: the same headers, no body.
    let head = request(worker.addr, "HEAD", "/thumb/img-000.jpg?w=100&h=100", &[]).await;
    assert_eq!(head.status, 200);
    assert_eq!(head.header("x-cache"), Some("hit"));
    assert_eq!(head.header("content-length"), Some(first.body.len().to_string().as_str()));
    assert!(head.body.is_empty());

    assert_eq!(worker.stats.misses.load(Ordering::Relaxed), 3);
    assert_eq!(worker.stats.hits.load(Ordering::Relaxed), 2);
    assert_eq!(worker.stats.cache_entries.load(Ordering::Relaxed), 3);
    assert_eq!(worker.stats.in_flight.load(Ordering::Relaxed), 0);
    worker.stop().await;
}

#[tokio::test]
async fn png_when_accept_prefers_it() {
    let fx = Fixture::new("png");
    let worker = start(fx.config("w-png")).await;
    let target = "/thumb/img-000.jpg?w=64&h=64";

    let png = request(worker.addr, "GET", target, &[("Accept", "image/png")]).await;
    assert_eq!(png.status, 200, "{}", png.text());
    assert_eq!(png.header("content-type"), Some("image/png"));
    assert_eq!(png.header("x-cache"), Some("miss"));
    assert_eq!(png.header("vary"), Some("Accept"));
    assert_eq!(image::guess_format(&png.body).expect("format"), image::ImageFormat::Png);
    assert_eq!(decode(&png.body).width(), 64);

    // The format is part of the cache key: JPEG is a separate miss, then each hits on its own.
    let jpeg = request(worker.addr, "GET", target, &[("Accept", "image/png, image/jpeg")]).await;
    assert_eq!(jpeg.header("content-type"), Some("image/jpeg"));
    assert_eq!(jpeg.header("x-cache"), Some("miss"));
    let png_again = request(worker.addr, "GET", target, &[("Accept", "image/png")]).await;
    assert_eq!(png_again.header("x-cache"), Some("hit"));
    assert_eq!(png_again.body, png.body);
    let jpeg_again = get(worker.addr, target).await;
    assert_eq!(jpeg_again.header("x-cache"), Some("hit"));
    assert_eq!(jpeg_again.body, jpeg.body);
    worker.stop().await;
}

#[tokio::test]
async fn cache_survives_a_restart() {
    let fx = Fixture::new("restart");
    let first = start(fx.config("w-1")).await;
    let miss = get(first.addr, "/thumb/img-001.jpg?w=80&h=80").await;
    assert_eq!(miss.header("x-cache"), Some("miss"));
    first.stop().await;

    // A write that a crash interrupted: the next bind deletes it and does not count it.
    let stray = fx.cache().join(".tmp-0123456789abcdef.jpg.1.1");
    std::fs::write(&stray, b"half a thumbnail").expect("write stray temp file");

    let second = start(fx.config("w-2")).await;
    assert!(!stray.exists(), "stray temp file deleted at bind");
    assert_eq!(second.stats.cache_entries.load(Ordering::Relaxed), 1);
    assert_eq!(second.stats.cache_bytes.load(Ordering::Relaxed), miss.body.len() as u64);
    let hit = get(second.addr, "/thumb/img-001.jpg?w=80&h=80").await;
    assert_eq!(hit.status, 200);
    assert_eq!(hit.header("x-cache"), Some("hit"));
    assert_eq!(hit.header("x-worker"), Some("w-2"));
    assert_eq!(hit.body, miss.body);
    second.stop().await;
}

#[tokio::test]
async fn lru_eviction_keeps_the_cache_under_its_capacity() {
    let fx = Fixture::new("lru");
    let targets =
        ["/thumb/img-000.jpg?w=120&h=120", "/thumb/img-001.jpg?w=120&h=120", "/thumb/img-002.jpg?w=120&h=120"];

    // Learn the three thumbnails' sizes on a worker with a roomy cache of its own.
    let mut probe_config = fx.config("probe");
    probe_config.cache_dir = fx.root.join("probe-cache");
    let probe = start(probe_config).await;
    let mut sizes = Vec::new();
    for target in targets {
        sizes.push(get(probe.addr, target).await.body.len() as u64);
    }
    probe.stop().await;

    // Room for any two of the three, not for all three.
    let capacity = sizes.iter().sum::<u64>() - 1;
    let config = WorkerConfig { cache_bytes: capacity, ..fx.config("w-lru") };
    let worker = start(config).await;
    let [a, b, c] = targets;
    assert_eq!(get(worker.addr, a).await.header("x-cache"), Some("miss"));
    assert_eq!(get(worker.addr, b).await.header("x-cache"), Some("miss"));
    assert_eq!(get(worker.addr, a).await.header("x-cache"), Some("hit")); // b is now least recently used
    assert_eq!(get(worker.addr, c).await.header("x-cache"), Some("miss")); // evicts b

    let on_disk = cache_files(&fx.cache());
    assert_eq!(on_disk.len(), 2, "{on_disk:?}");
    let total: u64 = on_disk.iter().map(|(_, size)| size).sum();
    assert!(total <= capacity, "{total} > {capacity}");
    assert_eq!(worker.stats.cache_bytes.load(Ordering::Relaxed), total);
    assert_eq!(worker.stats.cache_entries.load(Ordering::Relaxed), 2);

    assert_eq!(get(worker.addr, a).await.header("x-cache"), Some("hit"));
    assert_eq!(get(worker.addr, c).await.header("x-cache"), Some("hit"));
    assert_eq!(get(worker.addr, b).await.header("x-cache"), Some("miss"), "b was evicted");
    assert!(worker.stats.cache_bytes.load(Ordering::Relaxed) <= capacity);
    worker.stop().await;
}

#[tokio::test]
async fn bad_requests_and_unknown_images() {
    let fx = Fixture::new("bad-requests");
    let worker = start(fx.config("w-bad")).await;

    let unknown = get(worker.addr, "/thumb/nope.jpg?w=10&h=10").await;
    assert_eq!(unknown.status, 404);
    assert!(unknown.text().contains("unknown image"), "{}", unknown.text());
    assert_eq!(unknown.header("x-worker"), Some("w-bad"));

    for (target, needle) in [
        ("/thumb/img-000.jpg?w=0&h=10", "w must be from 1 to 4096"),
        ("/thumb/img-000.jpg?w=5000&h=10", "w must be from 1 to 4096"),
        ("/thumb/img-000.jpg?w=10", "missing query parameter h"),
        ("/thumb/img-000.jpg", "missing query parameter w"),
        ("/thumb/img-000.jpg?w=ten&h=10", "w must be an integer"),
        ("/thumb/img-000.jpg?w=10&h=-3", "h must be an integer"),
    ] {
        let reply = get(worker.addr, target).await;
        assert_eq!(reply.status, 400, "{target}: {}", reply.text());
        assert_eq!(reply.header("content-type"), Some("application/json"));
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json error body");
        assert_eq!(body["reason"], "bad_request");
        assert_eq!(body["status"], 400);
        let reason = body["error"].as_str().unwrap_or_default();
        assert!(reason.contains(needle), "{target}: {reason}");
    }

    assert_eq!(get(worker.addr, "/nowhere").await.status, 404);
    assert_eq!(get(worker.addr, "/thumb").await.status, 404);
    assert_eq!(worker.stats.errors.load(Ordering::Relaxed), 9);
    worker.stop().await;
}

#[tokio::test]
async fn path_traversal_never_escapes_the_image_directory() {
    let fx = Fixture::new("traversal");
    // Valid images outside the image directory: serving one would be a 200 with a JPEG.
    generate_images(&fx.root.join("outside"), 1, 320, 240, 5).expect("generate outside");
    let secret = fx.root.join("outside").join("img-000.jpg");
    std::fs::copy(&secret, fx.root.join("secret.jpg")).expect("copy secret");
    #[cfg(unix)]
    std::os::unix::fs::symlink(&secret, fx.images().join("link.jpg")).expect("symlink");
    let worker = start(fx.config("w-safe")).await;

    let absolute = secret.to_string_lossy().replace('/', "%2F");
    let names = [
        "..%2Fsecret.jpg",
        "..%2fsecret.jpg",
        "%2e%2e%2fsecret.jpg",
        "%2E%2E%2Fsecret.jpg",
        "..",
        "%2e%2e",
        "../secret.jpg",
        "..%5Csecret.jpg",
        "..%2Foutside%2Fimg-000.jpg",
        "%2e%2e/outside/img-000.jpg",
        &absolute,
        &format!("/{}", secret.display()),
        "%252e%252e%252fsecret.jpg",
        ".%2E%2Fsecret.jpg",
        "img-000.jpg%00",
        "link.jpg",
    ];
    for name in names {
        let target = format!("/thumb/{name}?w=50&h=50");
        let reply = get(worker.addr, &target).await;
        assert!(reply.status == 400 || reply.status == 404, "{target}: {} {}", reply.status, reply.text());
        assert!(image::load_from_memory(&reply.body).is_err(), "{target} served an image");
        assert_eq!(reply.header("x-cache"), None);
    }
    assert_eq!(worker.stats.misses.load(Ordering::Relaxed), 0);
    assert_eq!(worker.stats.hits.load(Ordering::Relaxed), 0);
    #[cfg(unix)]
    {
        // The name is plain; only canonicalization catches where the link leads.
        let link = get(worker.addr, "/thumb/link.jpg?w=50&h=50").await;
        assert_eq!(link.status, 400);
        assert!(link.text().contains("outside the image directory"), "{}", link.text());
    }
    // The worker still serves its own images.
    assert_eq!(get(worker.addr, "/thumb/img-000.jpg?w=50&h=50").await.status, 200);
    worker.stop().await;
}

#[tokio::test]
async fn corrupt_source_is_a_502_and_the_worker_keeps_serving() {
    let fx = Fixture::new("corrupt");
    std::fs::write(fx.images().join("garbage.jpg"), b"this is not an image at all").expect("write garbage");
    let mut fake = vec![0xFF, 0xD8, 0xFF, 0xE0];
    fake.extend(std::iter::repeat_n(0x5A, 500));
    std::fs::write(fx.images().join("broken.jpg"), &fake).expect("write broken jpeg");
    let worker = start(fx.config("w-corrupt")).await;

    for name in ["garbage.jpg", "broken.jpg"] {
        let reply = get(worker.addr, &format!("/thumb/{name}?w=50&h=50")).await;
        assert_eq!(reply.status, 502, "{name}: {}", reply.text());
        let body: serde_json::Value = serde_json::from_slice(&reply.body).expect("json error body");
        assert_eq!(body["reason"], "undecodable_source");
        assert!(body["error"].as_str().unwrap_or_default().contains(name), "{body}");
        let good = get(worker.addr, "/thumb/img-000.jpg?w=50&h=50").await;
        assert_eq!(good.status, 200);
    }
    assert_eq!(worker.stats.cache_entries.load(Ordering::Relaxed), 1, "nothing cached for a failure");
    worker.stop().await;
}

#[tokio::test]
async fn health_stats_and_methods() {
    let fx = Fixture::new("health");
    let worker = start(fx.config("w-health")).await;

    let health = get(worker.addr, "/healthz").await;
    assert_eq!((health.status, health.text().as_str()), (200, "ok"));
    assert_eq!(health.header("x-worker"), Some("w-health"));

    for target in ["/healthz", "/thumb/img-000.jpg?w=10&h=10", "/stats"] {
        let post = request(worker.addr, "POST", target, &[]).await;
        assert_eq!(post.status, 405, "{target}");
        assert_eq!(post.header("allow"), Some("GET, HEAD"));
    }
    assert_eq!(request(worker.addr, "DELETE", "/thumb/img-000.jpg?w=10&h=10", &[]).await.status, 405);

    let _ = get(worker.addr, "/thumb/img-000.jpg?w=10&h=10").await;
    let stats = get(worker.addr, "/stats").await;
    assert_eq!(stats.status, 200);
    let json: serde_json::Value = serde_json::from_slice(&stats.body).expect("stats json");
    assert_eq!(json["worker"], "w-health");
    assert_eq!(json["requests"], 7);
    assert_eq!(json["misses"], 1);
    assert_eq!(json["errors"], 4);
    assert_eq!(json["in_flight"], 1, "the stats request itself");
    assert_eq!(json["cache_entries"], 1);
    worker.stop().await;
}

#[tokio::test]
async fn concurrent_misses_for_one_key_do_not_corrupt_the_cache() {
    let fx = Fixture::new("concurrent");
    let worker = start(fx.config("w-conc")).await;
    let target = "/thumb/img-002.jpg?w=90&h=90";
    let replies =
        futures_join(worker.addr, target, 6).await.into_iter().map(|r| (r.status, r.body)).collect::<Vec<_>>();
    for (status, body) in &replies {
        assert_eq!(*status, 200);
        assert_eq!(decode(body).width(), 90);
    }
    assert_eq!(worker.stats.cache_entries.load(Ordering::Relaxed), 1);
    assert_eq!(cache_files(&fx.cache()).len(), 1, "no temp files left behind");
    let hit = get(worker.addr, target).await;
    assert_eq!(hit.header("x-cache"), Some("hit"));
    assert_eq!(decode(&hit.body).width(), 90);
    worker.stop().await;
}

async fn futures_join(addr: SocketAddr, target: &'static str, n: usize) -> Vec<Reply> {
    let tasks: Vec<_> = (0..n).map(|_| tokio::spawn(get(addr, target))).collect();
    let mut replies = Vec::new();
    for task in tasks {
        replies.push(task.await.expect("request task"));
    }
    replies
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn shutdown_lets_in_flight_requests_finish() {
    let fx = Fixture::new("shutdown");
    // A large source and a big slowdown make the miss last long enough to overlap the shutdown.
    generate_images(&fx.root.join("big"), 1, 1600, 1200, 3).expect("generate big");
    std::fs::rename(fx.root.join("big").join("img-000.jpg"), fx.images().join("big.jpg")).expect("move big");
    let config = WorkerConfig { slowdown: 20.0, ..fx.config("w-stop") };
    let worker = start(config).await;
    let addr = worker.addr;

    let pending = tokio::spawn(get(addr, "/thumb/big.jpg?w=400&h=400"));
    let waiting = async {
        while worker.stats.in_flight.load(Ordering::Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    };
    tokio::time::timeout(STEP, waiting).await.expect("request arrives");
    let stats = Arc::clone(&worker.stats);
    worker.stop().await;

    let reply = tokio::time::timeout(STEP, pending).await.expect("reply in time").expect("request task");
    assert_eq!(reply.status, 200);
    assert_eq!(reply.header("x-cache"), Some("miss"));
    assert_eq!(stats.in_flight.load(Ordering::Relaxed), 0);
    assert!(TcpStream::connect(addr).await.is_err(), "no longer accepting");
}

#[test]
fn generated_images_are_deterministic_and_sized() {
    let root = Path::new(env!("CARGO_TARGET_TMPDIR")).join("keyroute-worker-generate");
    let _ = std::fs::remove_dir_all(&root);
    let names = generate_images(&root.join("a"), 4, 320, 240, 11).expect("generate a");
    assert_eq!(names, ["img-000.jpg", "img-001.jpg", "img-002.jpg", "img-003.jpg"]);
    generate_images(&root.join("b"), 4, 320, 240, 11).expect("generate b");
    generate_images(&root.join("c"), 4, 320, 240, 12).expect("generate c");
    let read = |dir: &str, name: &str| std::fs::read(root.join(dir).join(name)).expect("read generated");
    for name in &names {
        let a = read("a", name);
        assert_eq!(a, read("b", name), "{name}: same seed, same bytes");
        assert_ne!(a, read("c", name), "{name}: another seed, another image");
        let img = decode(&a);
        assert_eq!((img.width(), img.height()), (320, 240));
    }
    assert_ne!(read("a", "img-000.jpg"), read("a", "img-001.jpg"));
    let only_dir_entries = std::fs::read_dir(root.join("a")).expect("read dir").count();
    assert_eq!(only_dir_entries, 4, "no temporary files left");
    assert!(matches!(generate_images(&root.join("d"), 1, 0, 10, 1), Err(WorkerError::Config { .. })));
    let _ = std::fs::remove_dir_all(&root);
}

#[tokio::test]
async fn bind_rejects_bad_configs() {
    let fx = Fixture::new("configs");
    let addr: SocketAddr = "127.0.0.1:0".parse().expect("addr");
    let bad = [
        WorkerConfig { slowdown: 0.5, ..fx.config("x") },
        WorkerConfig { slowdown: f64::NAN, ..fx.config("x") },
        WorkerConfig { jpeg_quality: 0, ..fx.config("x") },
        WorkerConfig { max_dimension: 0, ..fx.config("x") },
        WorkerConfig { name: String::new(), ..fx.config("x") },
        WorkerConfig { name: "bad\nname".into(), ..fx.config("x") },
    ];
    for config in bad {
        let result = Worker::bind(addr, config.clone()).await;
        assert!(matches!(result, Err(WorkerError::Config { .. })), "{config:?}: {result:?}");
    }
    let missing = WorkerConfig { images: fx.root.join("no-such-dir"), ..fx.config("x") };
    assert!(matches!(Worker::bind(addr, missing).await, Err(WorkerError::ImagesDir { .. })));
}
