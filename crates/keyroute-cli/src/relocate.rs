//! `keyroute move`: the plan, the proxies' check, and the move (see
//! `keyroute_server::relocate` for the order of operations and what it guarantees).

use std::time::Duration;

use anyhow::{Context as _, Result};
use bytes::Bytes;
use http_body_util::{BodyExt as _, Empty};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use keyroute_server::Config;
use keyroute_server::relocate::{self, Layout, Options, Plan, Report, Store};

use crate::Usage;
use crate::cli::MoveArgs;

pub fn run(args: &MoveArgs) -> Result<()> {
    let load = |path: &std::path::Path| Config::load(path).map_err(|e| Usage(e.to_string()));
    let (from_config, to_config) = (load(&args.from)?, load(&args.to)?);
    let pool = match &args.pool {
        Some(p) => p.clone(),
        None if to_config.pools.len() == 1 => to_config.pools[0].name.clone(),
        None => return Err(Usage("--pool: the configuration has several pools; name one".into()).into()),
    };
    let usage = |what: &str, e: relocate::MoveError| Usage(format!("{what}: {e}"));
    let from = Layout::of(&from_config.pools, &pool).map_err(|e| usage(&args.from.display().to_string(), e))?;
    let to = Layout::of(&to_config.pools, &pool).map_err(|e| usage(&args.to.display().to_string(), e))?;
    let store = Store::of(to_config.cache_listeners(), &pool).map_err(|e| usage(&args.to.display().to_string(), e))?;
    if args.batch == 0 {
        return Err(Usage("--batch: must be at least 1".into()).into());
    }
    if !(args.timeout > 0.0 && args.timeout <= 3600.0) {
        return Err(Usage("--timeout: between 0 and 3600 seconds".into()).into());
    }
    if !args.dry_run && args.admins.is_empty() && !args.proxies_switched {
        return Err(Usage(
            "name each proxy's admin API with --admin (the move starts once every one uses the new member set), or say --proxies-switched".into(),
        )
        .into());
    }
    let options = Options {
        batch: args.batch,
        rate: args.rate,
        max_keys: args.max_keys,
        state: args.state.clone(),
        timeout: Duration::from_secs_f64(args.timeout),
    };
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        if args.dry_run {
            let plan = relocate::plan(&store, &from, &to, &options).await?;
            print_plan(&plan, args, &store);
            return Ok(());
        }
        for admin in &args.admins {
            check_proxy(admin, args.admin_token.as_deref(), &pool, &from, &to).await?;
        }
        let mut last = std::time::Instant::now();
        let report = relocate::run(&store, &from, &to, &options, |r| {
            if last.elapsed() >= Duration::from_secs(2) {
                last = std::time::Instant::now();
                eprintln!(
                    "keyroute move: {} keys moved, {} superseded, {} vanished, {} failed",
                    r.moved(),
                    r.superseded,
                    r.vanished,
                    r.failed
                );
            }
        })
        .await?;
        print_report(&report, args);
        if report.complete && (report.failed > 0 || report.misplaced > 0) {
            anyhow::bail!(
                "{} keys could not be moved and {} are still on a server that does not own them; run again to retry",
                report.failed,
                report.misplaced
            );
        }
        Ok(())
    })
}

fn print_plan(plan: &Plan, args: &MoveArgs, store: &Store) {
    if args.json {
        println!("{}", serde_json::json!({ "plan": plan, "keys": plan.keys(), "bytes": plan.bytes() }));
        return;
    }
    let what = match store {
        Store::Redis { .. } => "bytes by MEMORY USAGE",
        Store::Memcached => "bytes by item size",
    };
    println!(
        "scanned {} keys: {} stay, {} move ({}, {what})",
        plan.scanned,
        plan.stay,
        plan.keys(),
        human(plan.bytes())
    );
    println!("{:<24} {:<24} {:>10} {:>12}", "FROM", "TO", "KEYS", "BYTES");
    for p in &plan.pairs {
        println!("{:<24} {:<24} {:>10} {:>12}", p.from, p.to, p.keys, p.bytes);
    }
    if let Some(rate) = args.rate.filter(|&r| r > 0) {
        println!("at --rate {rate} keys/s: about {:.0} s", plan.keys() as f64 / f64::from(rate));
    }
}

fn print_report(report: &Report, args: &MoveArgs) {
    if args.json {
        println!("{}", serde_json::json!({ "report": report, "moved": report.moved() }));
        return;
    }
    let rate = if report.seconds > 0.0 { report.moved() as f64 / report.seconds } else { 0.0 };
    println!(
        "moved {} keys in {:.1} s ({rate:.0} keys/s): {} superseded (the new owner had a newer value), {} vanished (expired or deleted meanwhile), {} failed",
        report.moved(),
        report.seconds,
        report.superseded,
        report.vanished,
        report.failed
    );
    println!("{:<24} {:<24} {:>10}", "FROM", "TO", "KEYS");
    for p in &report.pairs {
        println!("{:<24} {:<24} {:>10}", p.from, p.to, p.keys);
    }
    if report.complete {
        println!("verified: {} keys on a server that does not own them", report.misplaced);
    } else {
        println!("stopped at --max-keys: run again with the same --state to go on");
    }
}

fn human(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 30 => format!("{:.1} GiB", b as f64 / f64::from(1u32 << 30)),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / f64::from(1u32 << 20)),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

#[derive(serde::Deserialize)]
struct Pools {
    pools: Vec<PoolView>,
}

#[derive(serde::Deserialize)]
struct PoolView {
    workers: Vec<WorkerView>,
}

#[derive(serde::Deserialize)]
struct WorkerView {
    name: String,
    warm_up: f64,
}

/// Asks a proxy's admin API which members it uses for `pool`: the new set, or the move cannot
/// start. Warns when the servers that joined are past their handoff window.
async fn check_proxy(admin: &str, token: Option<&str>, pool: &str, from: &Layout, to: &Layout) -> Result<()> {
    let client: Client<_, Empty<Bytes>> = Client::builder(TokioExecutor::new()).build_http();
    let uri: hyper::Uri = format!("http://{admin}/workers?pool={pool}")
        .parse()
        .map_err(|_| Usage(format!("--admin {admin}: not a host:port")))?;
    let mut req = hyper::Request::get(uri).header("accept", "application/json");
    if let Some(t) = token {
        req = req.header("authorization", format!("Bearer {t}"));
    }
    let req = req.body(Empty::new()).context("request")?;
    let resp = tokio::time::timeout(Duration::from_secs(10), client.request(req))
        .await
        .map_err(|_| anyhow::anyhow!("--admin {admin}: no answer within 10 s"))?
        .with_context(|| format!("--admin {admin}"))?;
    let status = resp.status();
    let body = resp.into_body().collect().await.with_context(|| format!("--admin {admin}"))?.to_bytes();
    if !status.is_success() {
        anyhow::bail!("--admin {admin}: {status}: {}", String::from_utf8_lossy(&body).trim());
    }
    let pools: Pools =
        serde_json::from_slice(&body).with_context(|| format!("--admin {admin}: not the workers list"))?;
    let Some(view) = pools.pools.first() else { anyhow::bail!("--admin {admin}: no pool '{pool}'") };
    let mut theirs: Vec<&str> = view.workers.iter().map(|w| w.name.as_str()).collect();
    let mut ours: Vec<&str> = to.names().iter().map(String::as_str).collect();
    theirs.sort_unstable();
    ours.sort_unstable();
    if theirs != ours {
        anyhow::bail!(
            "the proxy at {admin} does not use the new member set yet (it has {}; the move needs {}): switch it first, so that nothing is written to an old owner after its keys went",
            theirs.join(","),
            ours.join(",")
        );
    }
    let joined: Vec<&WorkerView> = view.workers.iter().filter(|w| !from.names().contains(&w.name)).collect();
    if joined.iter().any(|w| w.warm_up >= 1.0) {
        eprintln!(
            "keyroute move: warning: the proxy at {admin} has no handoff window running for the servers that joined; until their keys have moved, they are not read through from the old owners"
        );
    }
    Ok(())
}
