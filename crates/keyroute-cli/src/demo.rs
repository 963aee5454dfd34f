//! `keyroute demo`: the first source document's thumbnail service, for real, on this machine.
//!
//! It generates source images, starts eight thumbnail workers and the gateway in this process on
//! loopback ports, and drives a Zipf workload (open loop, bounded in time) through each strategy in
//! turn, each starting with cold caches, in the scenarios: steady, scale-out (8 -> 9 mid-run), one
//! slow worker, one hot image, one worker killed mid-run; then the two problems consistent hashing
//! leaves open, each with keyroute's answer:
//!
//! - `hot-image`: each worker has a fixed capacity (four requests at a time, 40 ms each, hits
//!   included: 100 a second); the usual traffic is 96 requests a second, and from 30% of the run
//!   on one image goes viral: 144 requests a second more for it alone, more than one worker can
//!   serve even from its cache. Plain hashing overloads its owner; bounded loads spills
//!   it wherever there is room; `rendezvous+replicas` (hot-key replication) serves it from the
//!   least loaded of its top replicas. `hot-baseline` is the same run without the hot image's
//!   requests.
//! - `double-fleet`: four warm workers become eight (a busy week), at 15 requests a second, and
//!   the 10 s after the join are measured: `rendezvous` sends half the keys to cold newcomers at
//!   once, `rendezvous+handoff` keeps them on their warm previous owners and lets them move over
//!   a minute.
//!
//! Then it prints one table and writes an HTML report with charts.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressStyle};
use keyroute::Strategy;
use keyroute::hash::SplitMix64;
use keyroute_server::{Config, Gateway};
use keyroute_sim::report::{Section, page};
use keyroute_sim::{Histogram, Zipf};
use keyroute_worker::{Worker, WorkerConfig};
use serde::Serialize;
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::Usage;
use crate::cli::DemoArgs;

/// The scenarios, in order.
pub const SCENARIOS: [&str; 7] =
    ["steady", "scale-out", "slow-worker", "hot-image", "hot-baseline", "killed-worker", "double-fleet"];
/// The variants a strategy may carry in the demo: hot-key replication, previous-owner handoff.
pub const VARIANTS: [&str; 2] = ["replicas", "handoff"];
/// The strategies compared by default.
pub const STRATEGIES: [&str; 7] =
    ["round-robin", "modulo", "ring", "rendezvous", "bounded-rendezvous", "p2c", "affinity"];

const WORKERS: usize = 8;
const IMAGES: usize = 24;
const SIZES: [(u32, u32); 4] = [(96, 72), (160, 120), (240, 180), (320, 240)];
/// Each worker's disk cache: about a third of all thumbnails. With a key's requests all going to
/// one worker, the fleet caches everything; with requests spread, each worker must cache it all.
const CACHE_BYTES: u64 = 400_000;
const SLOWDOWN: f64 = 6.0;
/// The hot-image scenarios: the usual traffic's rate, the hot image's rate on top of it from
/// `HOT_FROM` of the run on, and each worker's capacity (four slots, 40 ms a request: 100 a
/// second). The hot image alone wants 144 a second: two workers, at least.
const USUAL_RATE: f64 = 96.0;
const HOT_RATE: f64 = 144.0;
const HOT_FROM: f64 = 0.3;
const CAPACITY_SLOTS: usize = 4;
const CAPACITY_COST_MS: u64 = 40;
/// Hot-key replication in the demo: each replica should carry at most 40 a second (40% of a
/// worker), so the hot image gets ceil(145 / 40) = 4. At 60 a second (3 replicas) each replica
/// ran at about 60% of its capacity with its usual traffic, where queueing shows in the tail: the
/// p99 was 1.16x to 1.72x the baseline's in five runs on an idle machine, against 1.03x to 1.27x
/// with 4. The confidence is one standard deviation: a 100 ms window holds few samples, and at
/// two the rule would wait a second for the evidence of another replica (`keyroute::hot`). The
/// pool shows key text (the keys are thumbnail paths), so that the demo finds the hot image in
/// the gateway's hot keys by its key.
const PER_REPLICA: f64 = 40.0;
/// The hot scenarios' default length.
const HOT_SECONDS: f64 = 9.0;
/// The double-fleet scenario: its rate and measured seconds after the join.
const DOUBLE_RATE: f64 = 15.0;
const DOUBLE_SECONDS: f64 = 10.0;

/// A case: a scenario, a strategy and its variants (`rendezvous+replicas`).
#[derive(Clone, Debug)]
pub struct Case {
    scenario: String,
    strategy: Strategy,
    variants: Vec<String>,
    /// Seconds of load.
    seconds: f64,
}

impl Case {
    fn label(&self) -> String {
        let mut l = self.strategy.name().to_owned();
        for v in &self.variants {
            l.push('+');
            l.push_str(v);
        }
        l
    }
}

/// One scenario under one strategy.
#[derive(Clone, Debug, Serialize)]
pub struct CaseReport {
    /// The scenario.
    pub scenario: String,
    /// The strategy.
    pub strategy: String,
    /// Requests sent.
    pub requests: u64,
    /// 200 responses.
    pub ok: u64,
    /// Anything else (status or transport error); every request is a GET, so these are failed GETs.
    pub errors: u64,
    /// Completed requests per second.
    pub throughput: f64,
    /// Median latency, ms.
    pub p50_ms: f64,
    /// 99th percentile, ms.
    pub p99_ms: f64,
    /// Cache hits over thumbnails served.
    pub hit_rate: f64,
    /// The busiest worker's requests over the mean of the workers that served.
    pub max_over_mean: f64,
    /// Requests per worker.
    pub per_worker: Vec<(String, u64)>,
    /// Share of all thumbnail keys whose owner changed at a membership change.
    pub keys_remapped: Option<f64>,
    /// Requests served by their key's owner (strategies that place by key).
    pub owner_share: Option<f64>,
    /// Workers that served at least 5% of the hot image's requests (hot-image scenarios).
    pub hot_workers: Option<usize>,
    /// The most replicas `/hotkeys` showed for the hot image (with `+replicas`).
    pub hot_replicas: Option<usize>,
    /// The 99th percentile of the hot image's requests, and of the others', ms (hot-image).
    pub hot_p99_ms: Option<(f64, f64)>,
    /// Requests per second per worker, per half second (the bin's middle, its rate), for the chart.
    #[serde(skip)]
    timeline: Vec<(String, Vec<(f64, f64)>)>,
    /// The worker cache hit rate per half second (the bin's middle, its rate), for the chart.
    #[serde(skip)]
    hit_timeline: Vec<(f64, f64)>,
    /// Latency CDF points.
    #[serde(skip)]
    cdf: Vec<(f64, f64)>,
}

struct RunningWorker {
    name: String,
    addr: SocketAddr,
    task: tokio::task::JoinHandle<()>,
    stop: tokio::sync::watch::Sender<bool>,
}

struct Sample {
    at: f64,
    latency: Duration,
    status: u16,
    hit: Option<bool>,
    worker: Option<String>,
    /// A request for the hot image.
    hot: bool,
}

pub fn run(args: &DemoArgs) -> Result<()> {
    let parse = |spec: &str| -> Result<(Strategy, Vec<String>), Usage> {
        let mut parts = spec.split('+');
        let s = parts.next().unwrap_or("").parse::<Strategy>().map_err(|e| Usage(format!("--strategies: {e}")))?;
        let variants: Vec<String> = parts.map(str::to_owned).collect();
        if let Some(bad) = variants.iter().find(|v| !VARIANTS.contains(&v.as_str())) {
            return Err(Usage(format!("--strategies: unknown variant '+{bad}' (valid: +replicas, +handoff)")));
        }
        if !variants.is_empty() && !s.uses_key() {
            return Err(Usage(format!("--strategies: '{spec}': variants need a strategy that places by key")));
        }
        Ok((s, variants))
    };
    let chosen: Option<Vec<(Strategy, Vec<String>)>> = if args.strategies.is_empty() {
        None
    } else {
        Some(args.strategies.iter().map(|s| parse(s)).collect::<Result<_, _>>()?)
    };
    let scenarios: Vec<String> = if args.scenarios.is_empty() {
        if args.quick {
            vec!["steady".into(), "killed-worker".into()]
        } else {
            SCENARIOS.iter().map(|s| (*s).to_owned()).collect()
        }
    } else {
        args.scenarios.clone()
    };
    if let Some(bad) = scenarios.iter().find(|s| !SCENARIOS.contains(&s.as_str())) {
        return Err(Usage(format!("--scenarios: unknown scenario '{bad}' (valid: {})", SCENARIOS.join(", "))).into());
    }
    let seconds = args.seconds.unwrap_or(if args.quick { 1.5 } else { 4.0 });
    let rate = args.rate.unwrap_or(80.0);
    if !(seconds > 0.0 && seconds <= 600.0 && rate > 0.0 && rate <= 10_000.0) {
        return Err(Usage("--seconds must be in (0, 600] and --rate in (0, 10000]".into()).into());
    }
    let mut cases: Vec<Case> = Vec::new();
    for sc in &scenarios {
        // Each scenario's default strategies: the document's seven, and keyroute's answers where
        // they apply.
        let defaults: Vec<&str> = match sc.as_str() {
            // Plain hashing, bounded loads and replication: the three answers to a hot key.
            "hot-image" => vec!["rendezvous", "bounded-rendezvous", "rendezvous+replicas"],
            "hot-baseline" => vec!["rendezvous+replicas"],
            "double-fleet" => vec!["rendezvous", "rendezvous+handoff"],
            _ => STRATEGIES.to_vec(),
        };
        let list = match &chosen {
            Some(l) => l.clone(),
            None => defaults.into_iter().map(parse).collect::<Result<_, _>>()?,
        };
        for (st, variants) in list {
            // Quick mode checks the killed worker with one hashing and one load-aware strategy.
            if args.quick && sc == "killed-worker" && !matches!(st, Strategy::Rendezvous | Strategy::P2c) {
                continue;
            }
            // The hot scenarios run longer by default, so that the first half second (every cache
            // cold, the hot image not yet detected) is not most of the run; double-fleet measures
            // the 10 s after its join.
            let secs = match sc.as_str() {
                "hot-image" | "hot-baseline" if args.seconds.is_none() && !args.quick => HOT_SECONDS,
                "double-fleet" => DOUBLE_SECONDS,
                _ => seconds,
            };
            cases.push(Case { scenario: sc.clone(), strategy: st, variants, seconds: secs });
        }
    }
    let dir = std::env::temp_dir().join(format!("keyroute-demo-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let result = match args.dashboard {
        Some(admin) => live(&dir, admin, args.rate.unwrap_or(80.0), args.dashboard_seconds),
        None => run_all(args, &dir, &cases, seconds, rate),
    };
    if !args.keep {
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

/// The demo's source images (generated in `dir`), the thumbnail keys over them, and a runtime.
fn prepare(dir: &Path) -> Result<(PathBuf, Vec<String>, tokio::runtime::Runtime)> {
    let images_dir = dir.join("images");
    eprintln!("generating {IMAGES} source images (1024x768) in {} ...", images_dir.display());
    let images = keyroute_worker::generate_images(&images_dir, IMAGES, 1024, 768, 7).context("generating images")?;
    let keys: Vec<String> =
        images.iter().flat_map(|img| SIZES.iter().map(move |(w, h)| format!("/thumb/{img}?w={w}&h={h}"))).collect();
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().context("runtime")?;
    Ok((images_dir, keys, rt))
}

fn run_all(args: &DemoArgs, dir: &Path, cases: &[Case], seconds: f64, rate: f64) -> Result<()> {
    let (images_dir, keys, rt) = prepare(dir)?;
    let bar = ProgressBar::new(cases.len() as u64);
    bar.set_style(
        ProgressStyle::with_template("{spinner} {msg:36} [{bar:30}] {pos}/{len} ({eta} left)")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    let mut reports = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        bar.set_message(format!("{} / {}", case.scenario, case.label()));
        let case_dir = dir.join(format!("case-{i}"));
        let report = rt.block_on(run_case(&images_dir, &case_dir, &keys, case, rate))?;
        let _ = std::fs::remove_dir_all(&case_dir);
        reports.push(report);
        bar.inc(1);
    }
    bar.finish_and_clear();
    if args.json {
        serde_json::to_writer_pretty(std::io::stdout().lock(), &reports)?;
        println!();
    } else {
        print!("{}", table(&reports));
        println!("\n{LEGEND}");
    }
    if let Some(path) = &args.report {
        let thumbnails = rt.block_on(thumbnails(&images_dir, dir, &keys));
        rt.shutdown_timeout(Duration::from_secs(2));
        std::fs::write(path, html(&reports, &thumbnails, seconds, rate))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("report written to {}", path.display());
    }
    eprintln!("see a fleet live, with the operator's dashboard: keyroute demo --dashboard");
    Ok(())
}

/// A few thumbnails as a worker makes them (for the report): four images, at 240x180, from a
/// worker started for this alone. A thumbnail that fails is left out.
async fn thumbnails(images: &Path, dir: &Path, keys: &[String]) -> Vec<(String, Vec<u8>)> {
    let Ok(worker) = start_worker(images, dir.join("gallery"), "gallery".into(), 1.0, None).await else {
        return Vec::new();
    };
    let client: Client<HttpConnector, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let mut out = Vec::new();
    for key in keys.iter().filter(|k| k.ends_with("w=240&h=180")).step_by(5).take(4) {
        let Ok(url) = format!("http://{}{key}", worker.addr).parse::<hyper::Uri>() else { continue };
        if let Ok(Ok(resp)) = tokio::time::timeout(Duration::from_secs(20), client.get(url)).await
            && resp.status() == 200
            && let Ok(body) = resp.into_body().collect().await
        {
            out.push((key.clone(), body.to_bytes().to_vec()));
        }
    }
    let _ = worker.stop.send(true);
    let _ = tokio::time::timeout(Duration::from_secs(5), worker.task).await;
    out
}

/// `demo --dashboard`: one fleet kept up for the operator's dashboard. Rendezvous with hot-key
/// replicas over 8 workers, Zipf traffic at `rate`, and a timeline that gives the page something
/// to show: a hot image from 20 s to 50 s, w3 killed at 60 s, w9 added at 90 s.
fn live(dir: &Path, admin: SocketAddr, rate: f64, seconds: Option<f64>) -> Result<()> {
    if seconds.is_some_and(|s| !(s > 0.0 && s <= 86_400.0)) {
        return Err(Usage("--dashboard-seconds must be in (0, 86400]".into()).into());
    }
    let (images_dir, keys, rt) = prepare(dir)?;
    rt.block_on(async {
        let mut workers = Vec::new();
        for i in 0..=WORKERS {
            let name = format!("w{}", i + 1);
            workers.push(start_worker(&images_dir, dir.join(&name), name, 1.0, None).await?);
        }
        let text = gateway_config(Strategy::Rendezvous, &["replicas".to_owned()], &workers, WORKERS)
            .replace("[admin]\nlisten = \"127.0.0.1:0\"", &format!("[admin]\nlisten = \"{admin}\""));
        let config = Config::parse(&text, "demo.toml").map_err(|e| anyhow::anyhow!("{e}"))?;
        let gateway =
            Gateway::bind(config).await.with_context(|| format!("starting the gateway (admin at {admin})"))?;
        let front = gateway.local_addrs()[0];
        let handle = gateway.handle();
        let gw_task = tokio::spawn(async move {
            let _ = gateway.run(std::future::pending()).await;
        });
        println!("dashboard: http://{admin}/dashboard");
        println!("gateway:   http://{front}{}", keys[0]);
        println!("timeline: a hot image from 20 s to 50 s, w3 killed at 60 s, w9 added at 90 s; Ctrl-C stops");
        let client: Client<HttpConnector, Empty<Bytes>> =
            Client::builder(TokioExecutor::new()).pool_max_idle_per_host(512).build_http();
        let zipf = Zipf::new(keys.len(), 1.0);
        let mut rng = SplitMix64::new(42);
        let hot_key = &keys[keys.len() - 1];
        let start = Instant::now();
        let mut ctrl_c = std::pin::pin!(tokio::signal::ctrl_c());
        let (mut n, mut hot_n) = (0u64, 0u64);
        let (mut killed, mut added) = (false, false);
        loop {
            let next = start + Duration::from_secs_f64(n as f64 / rate);
            let next_hot = start + Duration::from_secs_f64(20.0 + hot_n as f64 / HOT_RATE);
            let hot = next_hot < next && next_hot < start + Duration::from_secs(50);
            let at = if hot { next_hot } else { next };
            if seconds.is_some_and(|s| at.saturating_duration_since(start).as_secs_f64() >= s) {
                break;
            }
            tokio::select! {
                _ = &mut ctrl_c => break,
                () = tokio::time::sleep_until(at) => {}
            }
            let t = start.elapsed().as_secs_f64();
            if !killed && t >= 60.0 {
                eprintln!("{t:.0} s: w3 killed");
                workers[2].task.abort();
                killed = true;
            }
            if !added && t >= 90.0 {
                let share = join(&handle, &workers[WORKERS..], &keys).await?;
                eprintln!("{t:.0} s: w9 added ({:.1}% of the keys moved)", share * 100.0);
                added = true;
            }
            let key = if hot {
                hot_n += 1;
                hot_key
            } else {
                n += 1;
                &keys[zipf.sample(&mut rng)]
            };
            let url: hyper::Uri = format!("http://{front}{key}").parse().context("url")?;
            tokio::spawn(fetch(client.clone(), url, start, hot));
        }
        handle.shutdown();
        let _ = tokio::time::timeout(Duration::from_secs(5), gw_task).await;
        for w in &workers {
            let _ = w.stop.send(true);
        }
        anyhow::Ok(())
    })?;
    rt.shutdown_timeout(Duration::from_secs(2));
    Ok(())
}

const LEGEND: &str = "Each row: one scenario under one strategy, starting with cold caches. req/s: completed requests per \
second (open loop, so an overloaded fleet shows as latency, not as fewer requests sent); p50/p99: latency seen by the \
client; hit: share of thumbnails served from a worker's disk cache; max/mean: the busiest worker's requests over the \
mean; errors: responses other than 200 (a killed worker's failed GETs count here); remap: keys whose owner changed when \
the ninth worker joined; owner: requests served by their key's owner; hot wk: workers that served at least 5% of the \
hot image's requests; repl: the replicas hot-key replication gave it. hot-image and hot-baseline give each worker a \
fixed capacity (four requests at a time, 40 ms each, hits included: 100/s) for 9 s at 96 requests/s, plus in \
hot-image 144/s for one image from 2.7 s on (hot-baseline: the same run without them); double-fleet measures the 10 s \
after four warm workers become eight, at 15 requests/s, with caches warmed first.";

fn table(reports: &[CaseReport]) -> String {
    use std::fmt::Write as _;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "{:<14} {:<20} {:>7} {:>8} {:>8} {:>6} {:>8} {:>6} {:>6} {:>6} {:>6} {:>4}",
        "scenario",
        "strategy",
        "req/s",
        "p50 ms",
        "p99 ms",
        "hit",
        "max/mean",
        "errors",
        "remap",
        "owner",
        "hot wk",
        "repl"
    );
    let pct = |x: f64| format!("{:.0}%", x * 100.0);
    for r in reports {
        let _ = writeln!(
            out,
            "{:<14} {:<20} {:>7.1} {:>8.1} {:>8.1} {:>6} {:>8.2} {:>6} {:>6} {:>6} {:>6} {:>4}",
            r.scenario,
            r.strategy,
            r.throughput,
            r.p50_ms,
            r.p99_ms,
            pct(r.hit_rate),
            r.max_over_mean,
            r.errors,
            r.keys_remapped.map_or("-".into(), pct),
            r.owner_share.map_or("-".into(), pct),
            r.hot_workers.map_or("-".into(), |n| n.to_string()),
            r.hot_replicas.map_or("-".into(), |n| n.to_string()),
        );
    }
    out
}

fn gateway_config(strategy: Strategy, variants: &[String], workers: &[RunningWorker], count: usize) -> String {
    let mut text = format!(
        r#"shutdown_grace_ms = 2000
[admin]
listen = "127.0.0.1:0"
[[listener]]
listen = "127.0.0.1:0"
[[pool]]
name = "thumbs"
strategy = "{}"
key = "{{path}}?w={{query.w}}&h={{query.h}}"
worker_header = "x-keyroute-worker"
connect_timeout_ms = 500
[pool.health]
path = "/healthz"
interval_ms = 1000
timeout_ms = 1000
rise = 1
fall = 1
[pool.passive]
consecutive_failures = 2
base_ejection_ms = 2000
[pool.retry]
attempts = 3
per_try_timeout_ms = 20000
deadline_ms = 30000
"#,
        strategy.name()
    );
    if variants.iter().any(|v| v == "replicas") {
        text.push_str(&format!(
            "[pool.hot_keys]\nthreshold = {PER_REPLICA}\nper_worker = {PER_REPLICA}\nmax_replicas = 8\nwindow_ms = 100\nhold_ms = 5000\nsample_every = 1\nconfidence = 1\nshow_keys = true\n"
        ));
    }
    if variants.iter().any(|v| v == "handoff") {
        text.push_str("[pool.handoff]\nwindow_ms = 60000\n");
    }
    for w in workers.iter().take(count) {
        text.push_str(&format!("[[pool.worker]]\nname = \"{}\"\naddress = \"{}\"\n", w.name, w.addr));
    }
    text
}

async fn start_worker(
    images: &Path,
    cache: PathBuf,
    name: String,
    slowdown: f64,
    capacity: Option<(usize, u64)>,
) -> Result<RunningWorker> {
    let (slots, cost_ms) = capacity.unwrap_or((0, 0));
    let config = WorkerConfig {
        name: name.clone(),
        images: images.to_path_buf(),
        cache_dir: cache,
        cache_bytes: CACHE_BYTES,
        slowdown,
        slots,
        cost_ms,
        ..WorkerConfig::default()
    };
    let worker = Worker::bind(SocketAddr::from(([127, 0, 0, 1], 0)), config).await.context("starting a worker")?;
    let addr = worker.local_addr();
    let (stop, mut rx) = tokio::sync::watch::channel(false);
    let task = tokio::spawn(async move {
        let _ = worker
            .run(async move {
                while !*rx.borrow() {
                    if rx.changed().await.is_err() {
                        break;
                    }
                }
            })
            .await;
    });
    Ok(RunningWorker { name, addr, task, stop })
}

async fn run_case(images: &Path, dir: &Path, keys: &[String], case: &Case, rate: f64) -> Result<CaseReport> {
    let scenario = case.scenario.as_str();
    let capacity = matches!(scenario, "hot-image" | "hot-baseline").then_some((CAPACITY_SLOTS, CAPACITY_COST_MS));
    let seconds = case.seconds;
    let rate = match scenario {
        "hot-image" | "hot-baseline" => USUAL_RATE,
        "double-fleet" => DOUBLE_RATE,
        _ => rate,
    };
    let schedule = schedule(scenario, seconds, rate);
    let (started, serving) = match scenario {
        "scale-out" => (WORKERS + 1, WORKERS),
        "double-fleet" => (WORKERS, WORKERS / 2),
        _ => (WORKERS, WORKERS),
    };
    let mut workers = Vec::new();
    for i in 0..started {
        let slow = if scenario == "slow-worker" && i == 0 { SLOWDOWN } else { 1.0 };
        let name = format!("w{}", i + 1);
        workers.push(start_worker(images, dir.join(&name), name, slow, capacity).await?);
    }
    let text = gateway_config(case.strategy, &case.variants, &workers, serving);
    let config = Config::parse(&text, "demo.toml").map_err(|e| anyhow::anyhow!("{e}"))?;
    let gateway = Gateway::bind(config).await.context("starting the gateway")?;
    let front = gateway.local_addrs()[0];
    let handle = gateway.handle();
    let gw_task = tokio::spawn(async move {
        let _ = gateway.run(std::future::pending()).await;
    });

    let client: Client<HttpConnector, Empty<Bytes>> =
        Client::builder(TokioExecutor::new()).pool_max_idle_per_host(512).build_http();
    let mut keys_remapped = None;
    if scenario == "double-fleet" {
        // Warm every key's owner first (not measured), then double the fleet.
        warm_owners(&client, front, keys).await?;
        keys_remapped = Some(join(&handle, &workers[serving..], keys).await?);
    }
    let zipf = Zipf::new(keys.len(), 1.0);
    let mut rng = SplitMix64::new(42);
    let total = schedule.len() as u64;
    // The viral image: the least popular thumbnail, so that its rate is the viral rate alone.
    let hot_key = &keys[keys.len() - 1];
    // Placements so far (double-fleet's warm-up) are not part of the measured run.
    let before = handle.placements("thumbs").context("the demo pool")?;
    let start = Instant::now();
    let mut tasks: JoinSet<Sample> = JoinSet::new();
    let mut killed = false;
    let mut hot_replicas: Option<usize> = None;
    for n in 0..total {
        let (at, hot) = schedule[n as usize];
        // Open loop: each request leaves on schedule whatever happened to the earlier ones.
        tokio::time::sleep_until(start + Duration::from_secs_f64(at)).await;
        let progress = at / seconds;
        if scenario == "scale-out" && keys_remapped.is_none() && progress >= 0.5 {
            keys_remapped = Some(join(&handle, &workers[WORKERS..], keys).await?);
        }
        if scenario == "killed-worker" && !killed && progress >= 0.4 {
            // A crash, not a shutdown: the task and every connection it holds are dropped.
            workers[2].task.abort();
            killed = true;
        }
        if case.variants.iter().any(|v| v == "replicas") && n % 16 == 0 {
            let r = handle
                .hot_keys("thumbs")
                .ok()
                .and_then(|ks| ks.iter().find(|k| k.key.as_deref() == Some(hot_key.as_str())).map(|k| k.replicas));
            if let Some(r) = r {
                hot_replicas = Some(hot_replicas.map_or(r, |m| m.max(r)));
            }
        }
        let key = if hot { hot_key } else { &keys[zipf.sample(&mut rng)] };
        let url: hyper::Uri = format!("http://{front}{key}").parse().context("url")?;
        tasks.spawn(fetch(client.clone(), url, start, hot));
    }
    let mut samples = Vec::with_capacity(total as usize);
    while let Some(s) = tasks.join_next().await {
        if let Ok(s) = s {
            samples.push(s);
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    let placed = handle.placements("thumbs").context("the demo pool")?;
    let owner_share = case.strategy.uses_key().then(|| owner_share(&before, &placed));
    handle.shutdown();
    let _ = tokio::time::timeout(Duration::from_secs(5), gw_task).await;
    for w in &workers {
        let _ = w.stop.send(true);
    }
    for w in workers {
        let _ = tokio::time::timeout(Duration::from_secs(5), w.task).await;
    }
    let mut report = summarise(case, &samples, elapsed, keys_remapped, owner_share);
    report.hot_replicas = hot_replicas;
    Ok(report)
}

/// When each request leaves (seconds from the start), and whether it is for the hot image: the
/// usual traffic at `rate`, and in hot-image the hot image's on top of it from HOT_FROM on
/// (hot-baseline is the same run without them).
fn schedule(scenario: &str, seconds: f64, rate: f64) -> Vec<(f64, bool)> {
    let mut schedule: Vec<(f64, bool)> =
        (0..(seconds * rate).round() as u64).map(|n| (n as f64 / rate, false)).collect();
    if scenario == "hot-image" {
        let first = (seconds * HOT_FROM * HOT_RATE).ceil() as u64;
        let last = (seconds * HOT_RATE).round() as u64;
        schedule.extend((first..last).map(|n| (n as f64 / HOT_RATE, true)));
        schedule.sort_by(|a, b| a.0.total_cmp(&b.0));
    }
    schedule
}

/// Requests every key once, 8 at a time, so that each key's owner has it cached.
async fn warm_owners(client: &Client<HttpConnector, Empty<Bytes>>, front: SocketAddr, keys: &[String]) -> Result<()> {
    for chunk in keys.chunks(8) {
        let mut warming = JoinSet::new();
        for k in chunk {
            let url: hyper::Uri = format!("http://{front}{k}").parse().context("url")?;
            let client = client.clone();
            warming.spawn(async move {
                if let Ok(resp) = client.get(url).await {
                    let _ = resp.into_body().collect().await;
                }
            });
        }
        while warming.join_next().await.is_some() {}
    }
    Ok(())
}

/// Adds workers to the demo pool through the gateway's handle; returns the share of `keys` whose
/// owner changed.
async fn join(handle: &keyroute_server::GatewayHandle, joining: &[RunningWorker], keys: &[String]) -> Result<f64> {
    let owners = || -> Result<Vec<Option<String>>> {
        keys.iter().map(|k| handle.owner("thumbs", k).context("the demo pool")).collect()
    };
    let before = owners()?;
    for w in joining {
        let w =
            keyroute_server::WorkerConfig { name: w.name.clone(), address: w.addr, weight: 1, zone: None, id: None };
        handle.add_worker("thumbs", w).await.context("adding a worker")?;
    }
    let after = owners()?;
    let moved = before.iter().zip(&after).filter(|(b, a)| b != a).count();
    Ok(moved as f64 / keys.len().max(1) as f64)
}

/// One measured GET (60 s at most): when it left, how long it took, its status (0: no response,
/// or a body cut short), the worker's cache result and name.
async fn fetch(client: Client<HttpConnector, Empty<Bytes>>, url: hyper::Uri, start: Instant, hot: bool) -> Sample {
    let sent = Instant::now();
    let at = sent.saturating_duration_since(start).as_secs_f64();
    match tokio::time::timeout(Duration::from_secs(60), client.get(url)).await {
        Ok(Ok(resp)) => {
            let status = resp.status().as_u16();
            let header = |n: &str| resp.headers().get(n).and_then(|v| v.to_str().ok()).map(str::to_owned);
            let hit = header("x-cache").map(|c| c == "hit");
            let worker = header("x-keyroute-worker");
            let body_ok = resp.into_body().collect().await.is_ok();
            Sample { at, latency: sent.elapsed(), status: if body_ok { status } else { 0 }, hit, worker, hot }
        }
        _ => Sample { at, latency: sent.elapsed(), status: 0, hit: None, worker: None, hot },
    }
}

/// The share of the run's placements served by the key's owner (what came `before` it not
/// counted).
fn owner_share(before: &keyroute_server::Placements, placed: &keyroute_server::Placements) -> f64 {
    let total = |p: &keyroute_server::Placements| {
        p.owner + p.unavailable + p.overloaded + p.retry + p.unkeyed + p.replica + p.warming
    };
    let all = total(placed).saturating_sub(total(before));
    let owner = placed.owner.saturating_sub(before.owner);
    if all == 0 { 0.0 } else { owner as f64 / all as f64 }
}

fn summarise(
    case: &Case,
    samples: &[Sample],
    elapsed: f64,
    keys_remapped: Option<f64>,
    owner_share: Option<f64>,
) -> CaseReport {
    let mut hist = Histogram::default();
    let mut per_worker: HashMap<String, u64> = HashMap::new();
    let (mut ok, mut hits, mut served) = (0u64, 0u64, 0u64);
    // Half-second bins over the time requests were sent: the last bin may be shorter, and its
    // rate is counted over its own length (a bin past the sending would show a drop to zero).
    let span = case.seconds.max(0.5);
    let buckets = (span * 2.0).ceil() as usize;
    let bin_of = |at: f64| ((at * 2.0) as usize).min(buckets - 1);
    let width = |b: usize| if b + 1 == buckets { span - b as f64 / 2.0 } else { 0.5 };
    let mut names: Vec<String> = (1..=WORKERS + 1).map(|i| format!("w{i}")).collect();
    let mut timeline = vec![vec![0u32; buckets]; names.len()];
    let mut hit_bins = vec![(0u32, 0u32); buckets];
    for s in samples {
        if let Some(h) = s.hit {
            let bin = &mut hit_bins[bin_of(s.at)];
            bin.0 += u32::from(h);
            bin.1 += 1;
        }
        if s.status == 200 {
            ok += 1;
            hist.record(s.latency.as_nanos() as u64);
        }
        if let Some(h) = s.hit {
            served += 1;
            hits += u64::from(h);
        }
        if let Some(w) = &s.worker {
            *per_worker.entry(w.clone()).or_default() += 1;
            let wi = names.iter().position(|n| n == w).unwrap_or_else(|| {
                names.push(w.clone());
                timeline.push(vec![0; buckets]);
                names.len() - 1
            });
            timeline[wi][bin_of(s.at)] += 1;
        }
    }
    let mut per_worker: Vec<(String, u64)> = per_worker.into_iter().collect();
    per_worker.sort_by_key(|(n, _)| n.trim_start_matches('w').parse::<u32>().unwrap_or(u32::MAX));
    let mean = per_worker.iter().map(|(_, c)| *c as f64).sum::<f64>() / per_worker.len().max(1) as f64;
    let max = per_worker.iter().map(|(_, c)| *c).max().unwrap_or(0) as f64;
    let errors = samples.len() as u64 - ok;
    let s = hist.summary();
    CaseReport {
        scenario: case.scenario.clone(),
        strategy: case.label(),
        requests: samples.len() as u64,
        ok,
        errors,
        throughput: ok as f64 / elapsed.max(1e-9),
        p50_ms: s.p50_ms,
        p99_ms: s.p99_ms,
        hit_rate: if served == 0 { 0.0 } else { hits as f64 / served as f64 },
        max_over_mean: if mean > 0.0 { max / mean } else { 0.0 },
        per_worker,
        keys_remapped,
        owner_share,
        hot_workers: case.scenario.starts_with("hot-image").then(|| {
            let hot: Vec<&Sample> = samples.iter().filter(|s| s.hot).collect();
            let mut by: HashMap<&str, usize> = HashMap::new();
            for s in &hot {
                if let Some(w) = &s.worker {
                    *by.entry(w.as_str()).or_default() += 1;
                }
            }
            by.values().filter(|&&n| n * 20 >= hot.len()).count()
        }),
        hot_replicas: None,
        hot_p99_ms: case.scenario.starts_with("hot-image").then(|| {
            let (mut hot, mut cold) = (Histogram::default(), Histogram::default());
            for s in samples.iter().filter(|s| s.status == 200) {
                let h = if s.hot { &mut hot } else { &mut cold };
                h.record(s.latency.as_nanos() as u64);
            }
            (hot.summary().p99_ms, cold.summary().p99_ms)
        }),
        timeline: names
            .into_iter()
            .zip(timeline)
            .filter(|(_, t)| t.iter().any(|&c| c > 0))
            .map(|(name, t)| {
                let rates =
                    t.iter().enumerate().map(|(b, &c)| (b as f64 / 2.0 + width(b) / 2.0, f64::from(c) / width(b)));
                (name, rates.collect())
            })
            .collect(),
        hit_timeline: hit_bins
            .iter()
            .enumerate()
            .filter(|(_, (_, served))| *served > 0)
            .map(|(b, &(hits, served))| (b as f64 / 2.0 + width(b) / 2.0, f64::from(hits) / f64::from(served)))
            .collect(),
        cdf: hist.cdf_points(100),
    }
}

fn html(reports: &[CaseReport], thumbnails: &[(String, Vec<u8>)], seconds: f64, rate: f64) -> String {
    let mut scenarios: Vec<&str> = reports.iter().map(|r| r.scenario.as_str()).collect();
    scenarios.dedup();
    let sections: Vec<Section> = scenarios
        .iter()
        .map(|&sc| {
            let rs: Vec<&CaseReport> = reports.iter().filter(|r| r.scenario == sc).collect();
            Section {
                title: sc.to_owned(),
                table: None,
                cdfs: rs.iter().map(|r| (r.strategy.clone(), r.cdf.clone())).collect(),
                hits: rs.iter().map(|r| (r.strategy.clone(), r.hit_timeline.clone())).collect(),
                moved: rs.iter().filter_map(|r| Some((r.strategy.clone(), r.keys_remapped?))).collect(),
                load: rs
                    .iter()
                    .map(|r| {
                        (
                            format!("{sc} / {}: requests per second per worker", r.strategy),
                            "time (s)",
                            "requests per second",
                            r.timeline.clone(),
                        )
                    })
                    .collect(),
                figures: Vec::new(),
            }
        })
        .collect();
    let mut sections = sections;
    if !thumbnails.is_empty() {
        let figures = thumbnails
            .iter()
            .map(|(key, jpeg)| (key.clone(), format!("data:image/jpeg;base64,{}", keyroute_sim::report::base64(jpeg))))
            .collect();
        sections.insert(
            0,
            Section { title: "Thumbnails, as the workers served them".into(), figures, ..Section::default() },
        );
    }
    let intro = [
        format!(
            "{WORKERS} workers, {IMAGES} source images x {} sizes, Zipf(1.0), {rate} requests/s for {seconds} s per run, cold caches.",
            SIZES.len()
        ),
        LEGEND.to_owned(),
    ];
    page("keyroute demo: the thumbnail service", &intro, Some(&table(reports)), &sections)
}
