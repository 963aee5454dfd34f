//! A fleet of gateways on one etcd prefix (issue 9): every gateway applies every change and
//! places every key alike; etcd lost, restarted or compacted; bad records; admin changes that
//! go through etcd; workers that register and leave by themselves. A real etcd on loopback.

mod support;

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering::SeqCst;
use std::time::Duration;

use http::StatusCode;
use keyroute::hash::{RandomSource, SplitMix64};
use keyroute::{Node, NodeSet, Options, Placement, Strategy, Table};
use keyroute_etcd::client::Client;
use keyroute_etcd::record::{RecordState, WorkerRecord};
use keyroute_etcd::register::Registrar;
use keyroute_etcd::registry::Registry;
use keyroute_testkit::{Cuttable, Etcd};
use support::*;
use tokio::time::Instant;

/// A gateway config for pool `p` whose members come from etcd.
fn etcd_config(endpoint: &str, prefix: &str, strategy: &str, state_file: &std::path::Path) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nstrategy = \"{strategy}\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n\n[pool.health]\ninterval_ms = 200\n\n[pool.membership]\nsource = \"etcd\"\nendpoints = [\"{endpoint}\"]\nprefix = \"{prefix}\"\nstate_file = \"{}\"\n",
        state_file.display()
    )
}

fn record(addr: std::net::SocketAddr, weight: u32, draining: bool) -> WorkerRecord {
    WorkerRecord {
        address: addr.to_string(),
        weight: i64::from(weight),
        zone: None,
        id: None,
        state: if draining { RecordState::Draining } else { RecordState::Active },
    }
}

/// The members every gateway should have: name -> (weight, draining).
type Expected = BTreeMap<String, (u32, bool)>;

/// The table the library builds for the expected members (listed in any order: the table is a
/// function of the set).
fn reference(strategy: Strategy, expected: &Expected) -> Table {
    let nodes = NodeSet::try_new(expected.iter().rev().map(|(n, (w, _))| Node::new_unchecked(n).with_weight(*w)))
        .expect("valid");
    Table::build(strategy, nodes, &Options::default()).expect("builds").expect("a table")
}

/// Waits until every gateway has applied `revision`; returns how long it took.
async fn converged(gws: &[Gw], revision: i64, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        if gws.iter().all(|g| g.handle.membership("p").expect("pool").revision >= revision) {
            return start.elapsed();
        }
        assert!(start.elapsed() < limit, "revision {revision} not applied by every gateway within {limit:?}");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Every gateway's owner of each key, checked equal to the library's table over `expected`.
fn assert_placements(gws: &[Gw], strategy: Strategy, expected: &Expected, keys: &[String]) -> HashMap<String, String> {
    let want = reference(strategy, expected);
    let mut owners = HashMap::new();
    for (i, g) in gws.iter().enumerate() {
        let m = g.handle.membership("p").expect("pool");
        let names: Vec<&String> = expected.keys().collect();
        let mut have = m.workers.clone();
        have.sort();
        assert_eq!(have.iter().collect::<Vec<_>>(), names, "gateway {i}: members");
        for k in keys {
            let got = g.handle.owner("p", &format!("/thumb?k={k}")).expect("pool");
            let exp = want.pick(format!("/thumb?k={k}").as_bytes()).map(|n| n.name().to_owned());
            assert_eq!(got, exp, "gateway {i}, key {k}: owner differs from the library's table");
            if i == 0
                && let Some(o) = got
            {
                owners.insert(k.clone(), o);
            }
        }
    }
    owners
}

/// Every gateway's routing state of each expected member: `draining` exactly where the records
/// say so (a gateway that ignored the draining state would show it healthy).
async fn assert_drain_states(gws: &[Gw], expected: &Expected) {
    for (i, g) in gws.iter().enumerate() {
        let (_, v) = admin(g, "GET", "/workers", "", None).await;
        let workers = v["pools"][0]["workers"].as_array().cloned().unwrap_or_default();
        for (name, (_, draining)) in expected {
            let w = workers.iter().find(|w| w["name"] == name.as_str()).expect("the member in /workers");
            assert_eq!(w["state"] == "draining", *draining, "gateway {i}, {name}: {w}");
        }
    }
}

fn median(v: &mut [Duration]) -> Duration {
    v.sort();
    v[v.len() / 2]
}

async fn start_fleet(etcd: &Etcd, prefix: &str, strategy: &str, n: usize) -> Vec<Gw> {
    let mut gws = Vec::new();
    for i in 0..n {
        let state = etcd.dir().join(format!("gw{i}-{}.json", prefix.replace('/', "_")));
        gws.push(start_gateway(&etcd_config(&etcd.endpoint(), prefix, strategy, &state)).await);
    }
    gws
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_gateways_agree_after_every_change() {
    let mut etcd = Etcd::start();
    let backends = backends(8).await;
    let keys = keys(10_000);
    let mut report = Vec::new();
    let mut all = Vec::new();
    // (strategy, membership changes, seed of the change sequence)
    for (strategy, changes, seed) in
        [(Strategy::Rendezvous, 50, 2), (Strategy::Slots, 12, 5), (Strategy::Maglev, 12, 4), (Strategy::Ring, 12, 1)]
    {
        let prefix = format!("/keyroute/pools/{strategy}/workers/");
        let registry = Registry::new(&[etcd.endpoint()], &prefix).expect("registry");
        let gws = start_fleet(&etcd, &prefix, strategy.name(), 3).await;
        let mut expected = Expected::new();
        let mut rng = SplitMix64::new(0xf1ee7 ^ seed);
        let mut times = Vec::new();
        let mut owners = assert_placements(&gws, strategy, &expected, &keys);
        let mut step = 0;
        while step < changes {
            let b = &backends[rng.below(backends.len() as u64) as usize];
            let present = expected.get(&b.name).copied();
            let (kind, revision) = match present {
                // Joins first, so that the fleet grows; then anything.
                None => {
                    let w = 1 + rng.below(3) as u32;
                    expected.insert(b.name.clone(), (w, false));
                    ("join", registry.add(&b.name, &record(b.addr, w, false), 0).await.expect("add"))
                }
                Some(_) if expected.len() < 3 => continue,
                Some((w, draining)) => match rng.below(3) {
                    0 => {
                        expected.remove(&b.name);
                        ("leave", registry.remove(&b.name).await.expect("remove"))
                    }
                    1 if !draining => {
                        expected.insert(b.name.clone(), (w, true));
                        ("drain", registry.drain(&b.name).await.expect("drain"))
                    }
                    _ => {
                        let nw = 1 + (w % 4);
                        expected.insert(b.name.clone(), (nw, draining));
                        ("reweight", registry.set_weight(&b.name, nw).await.expect("weight"))
                    }
                },
            };
            step += 1;
            times.push(converged(&gws, revision, Duration::from_secs(10)).await);
            let now = assert_placements(&gws, strategy, &expected, &keys);
            assert_drain_states(&gws, &expected).await;
            if kind == "drain" {
                // A drained worker keeps its keys in the table but gets no new request: its keys
                // go to the next worker of their ranking, on every gateway.
                let c = client();
                let theirs: Vec<&String> = now.iter().filter(|(_, o)| **o == b.name).map(|(k, _)| k).take(5).collect();
                assert!(!theirs.is_empty(), "{} owns keys", b.name);
                for g in &gws {
                    for k in &theirs {
                        let (s, h, _) = get(&c, &format!("http://{}/thumb?k={k}", g.addr)).await;
                        assert_eq!(s, StatusCode::OK);
                        assert_ne!(h["x-keyroute-worker"], b.name, "{k} was sent to the drained {}", b.name);
                    }
                }
            }
            // Rendezvous moves keys only as its guarantee says: a join moves keys only to the
            // newcomer, a leave only the leaver's keys, a drain nothing (drained workers keep
            // their keys in the table; requests fail over along the ranking).
            if strategy == Strategy::Rendezvous {
                for (k, before) in &owners {
                    let after = &now[k];
                    match kind {
                        "join" => assert!(after == before || *after == b.name, "{k} moved {before} -> {after}"),
                        "leave" => assert!(after == before || *before == b.name, "{k} moved {before} -> {after}"),
                        "drain" => assert_eq!(after, before, "{k} moved on a drain"),
                        _ => assert!(after == before || *after == b.name || *before == b.name),
                    }
                }
            }
            owners = now;
            if strategy == Strategy::Rendezvous && step == changes / 2 {
                // etcd restarts: every gateway keeps its members and reconnects.
                let t = Instant::now();
                etcd.restart();
                let restart = t.elapsed();
                let t = Instant::now();
                eventually(Duration::from_secs(10), "every gateway reconnects", || async {
                    gws.iter().all(|g| g.handle.membership("p").expect("pool").source_up)
                })
                .await;
                report.push(format!("etcd restart: {restart:?} down, gateways back {:?} after", t.elapsed()));
                assert_placements(&gws, strategy, &expected, &keys);
            }
        }
        all.extend(times.iter().copied());
        let n = times.len();
        let max = *times.iter().max().expect("changes");
        let med = median(&mut times);
        report.push(format!("{strategy}: {n} changes, convergence median {med:?}, max {max:?}"));
        // Every change reached every gateway (`converged` fails past its limit); how fast is
        // reported (measured: 111 ms at most, about 50 ms median), not asserted: a shared machine's
        // etcd sets that pace, and speed is the benchmarks' to measure.
        for g in gws {
            g.task.abort();
        }
    }
    let (n, max) = (all.len(), *all.iter().max().expect("changes"));
    report.push(format!("all: {n} changes, convergence median {:?}, max {max:?}", median(&mut all)));
    println!("{}", report.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_serve_through_an_etcd_outage_and_start_from_their_saved_members() {
    let mut etcd = Etcd::start();
    let prefix = "/keyroute/pools/outage/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let backends = backends(4).await;
    for b in &backends[..3] {
        registry.add(&b.name, &record(b.addr, 1, false), 0).await.expect("add");
    }
    let mut gws = start_fleet(&etcd, prefix, "rendezvous", 3).await;
    eventually(Duration::from_secs(5), "three workers everywhere", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers.len() == 3)
    })
    .await;
    let c = client();
    let get_all = |gws: &Vec<Gw>| {
        let urls: Vec<String> = gws.iter().map(|g| format!("http://{}/thumb", g.addr)).collect();
        let c = c.clone();
        async move {
            let mut failed = 0;
            for (i, u) in urls.iter().enumerate() {
                for k in 0..20 {
                    let (s, _, _) = get(&c, &format!("{u}?k={i}-{k}")).await;
                    failed += usize::from(s != StatusCode::OK);
                }
            }
            failed
        }
    };
    assert_eq!(get_all(&gws).await, 0);

    etcd.kill();
    let down = Instant::now();
    eventually(Duration::from_secs(5), "every gateway notices", || async {
        gws.iter().all(|g| !g.handle.membership("p").expect("pool").source_up)
    })
    .await;
    let (status, text) = admin(&gws[1], "GET", "/readyz", "", None).await;
    assert_eq!(status, StatusCode::OK, "still ready: serving the last known members");
    assert!(text.as_str().is_some_and(|t| t.contains("unreachable")), "{text}");
    let (_, metrics) = admin(&gws[1], "GET", "/metrics", "", None).await;
    assert!(metrics.as_str().is_some_and(|m| m.contains("keyroute_membership_source_up{pool=\"p\"} 0")), "{metrics}");
    // A gateway restarted while etcd is down serves its saved members.
    let old = gws.remove(0);
    old.handle.shutdown();
    let _ = old.task.await;
    let state = etcd.dir().join(format!("gw0-{}.json", prefix.replace('/', "_")));
    gws.insert(0, start_gateway(&etcd_config(&etcd.endpoint(), prefix, "rendezvous", &state)).await);
    assert_eq!(gws[0].handle.membership("p").expect("pool").workers.len(), 3, "started from the saved members");
    // 30 s without etcd: every GET through every gateway is served.
    let mut failed = 0;
    let mut rounds = 0;
    while down.elapsed() < Duration::from_secs(30) {
        failed += get_all(&gws).await;
        rounds += 1;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert_eq!(failed, 0, "failed GETs during the outage ({rounds} rounds of 60)");

    etcd.restart();
    let revision = registry.add(&backends[3].name, &record(backends[3].addr, 1, false), 0).await.expect("add");
    let t = converged(&gws, revision, Duration::from_secs(5)).await;
    println!(
        "after a 30 s outage: {rounds} rounds of 60 GETs, 0 failed; a change applied everywhere {t:?} after etcd came back"
    );
    // The gateways retry at most a second apart (backoff 100 ms doubling to 1 s), then the watch
    // delivers the change: measured 53 ms (etcd's restart itself covers most of the backoff).
    assert!(t <= Duration::from_millis(1500), "a change after the outage took {t:?} to reach every gateway");
    for g in &gws {
        assert_eq!(g.handle.membership("p").expect("pool").workers.len(), 4);
    }
    for g in gws {
        g.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_compacted_watch_reads_the_prefix_again() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/compact/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let backends = backends(4).await;
    for b in &backends[..2] {
        registry.add(&b.name, &record(b.addr, 1, false), 0).await.expect("add");
    }
    let cut = Cuttable::start(etcd.client).await;
    let state = etcd.dir().join("compact.json");
    let gw = start_gateway(&etcd_config(&format!("http://{}", cut.addr), prefix, "rendezvous", &state)).await;
    eventually(Duration::from_secs(5), "two workers", || async {
        gw.handle.membership("p").expect("pool").workers.len() == 2
    })
    .await;
    // Parted from etcd while others change the members and etcd compacts its history.
    cut.cut();
    eventually(Duration::from_secs(5), "the gateway notices", || async {
        !gw.handle.membership("p").expect("pool").source_up
    })
    .await;
    registry.remove(&backends[0].name).await.expect("remove");
    registry.add(&backends[2].name, &record(backends[2].addr, 2, false), 0).await.expect("add");
    let revision = registry.add(&backends[3].name, &record(backends[3].addr, 1, false), 0).await.expect("add");
    registry.client().compact(revision).await.expect("compact");
    cut.restore();
    eventually(Duration::from_secs(5), "the gateway catches up", || async {
        gw.handle.membership("p").expect("pool").workers == ["w2", "w3", "w4"]
    })
    .await;
    assert!(gw.handle.membership("p").expect("pool").compactions >= 1, "it read the prefix again");
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_records_are_ignored_one_by_one_and_the_pool_empties_only_when_none_is_valid() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/junk/workers/";
    let client = Client::new(&[etcd.endpoint()]).expect("client");
    let backends = backends(3).await;
    let mut kvs: Vec<(Vec<u8>, Vec<u8>)> = backends
        .iter()
        .map(|b| (format!("{prefix}{}", b.name).into_bytes(), record(b.addr, 1, false).to_json()))
        .collect();
    let a = backends[0].addr;
    let bad = [
        ("bad-json", "{\"address\":".to_owned()),
        ("bad-state", format!("{{\"address\":\"{a}\",\"state\":\"sleeping\"}}")),
        ("zero", "{\"address\":\"127.0.0.1:9\",\"weight\":0}".to_owned()),
        ("negative", "{\"address\":\"127.0.0.1:9\",\"weight\":-1}".to_owned()),
        // w1's address under a name that sorts after it: w1 keeps it.
        ("x-duplicate", format!("{{\"address\":\"{a}\"}}")),
        ("no-address", "{\"weight\":1}".to_owned()),
        ("nested/name", "{\"address\":\"127.0.0.1:9\"}".to_owned()),
    ];
    for (k, v) in &bad {
        kvs.push((format!("{prefix}{k}").into_bytes(), v.clone().into_bytes()));
    }
    for i in 0..10_000 {
        kvs.push((format!("{prefix}junk-{i}").into_bytes(), format!("junk {i}").into_bytes()));
    }
    client.put_all(&kvs).await.expect("put");
    let state = etcd.dir().join("junk.json");
    let gw = start_gateway(&etcd_config(&etcd.endpoint(), prefix, "rendezvous", &state)).await;
    eventually(Duration::from_secs(10), "the three valid workers", || async {
        gw.handle.membership("p").expect("pool").workers == ["w1", "w2", "w3"]
    })
    .await;
    assert_eq!(gw.handle.membership("p").expect("pool").rejected, 10_000 + bad.len() as u64);
    let c = client_for_test();
    for k in 0..30 {
        let (s, _, _) = get(&c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        assert_eq!(s, StatusCode::OK);
    }
    // A valid record overwritten with junk: that worker goes, the others stay.
    let revision = client.put(format!("{prefix}w2").as_bytes(), b"{not json", 0).await.expect("put");
    converged(std::slice::from_ref(&gw), revision, Duration::from_secs(5)).await;
    assert_eq!(gw.handle.membership("p").expect("pool").workers, ["w1", "w3"]);
    // w1 broken too: its address is free, so the duplicate record is valid now (the same on
    // every gateway: the rule depends on the records alone).
    let revision = client.put(format!("{prefix}w1").as_bytes(), b"[]", 0).await.expect("put");
    converged(std::slice::from_ref(&gw), revision, Duration::from_secs(5)).await;
    assert_eq!(gw.handle.membership("p").expect("pool").workers, ["w3", "x-duplicate"]);
    // While a valid record is left, the pool serves every key.
    for k in 0..30 {
        let (s, h, _) = get(&c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        assert_eq!(s, StatusCode::OK, "key {k} with two valid records left");
        assert!(["w3", "x-duplicate"].contains(&h["x-keyroute-worker"].as_str()), "{h:?}");
    }
    // Every record broken: the pool empties only because no valid record is left, and says so.
    for b in ["w3", "x-duplicate"] {
        client.put(format!("{prefix}{b}").as_bytes(), b"[]", 0).await.expect("put");
    }
    eventually(Duration::from_secs(5), "no valid worker left", || async {
        gw.handle.membership("p").expect("pool").workers.is_empty()
    })
    .await;
    let (s, _, body) = get(&c, &format!("http://{}/thumb?k=1", gw.addr)).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    gw.task.abort();
}

fn client_for_test() -> TestClient {
    client()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_changes_on_one_gateway_reach_every_gateway_through_etcd() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/admin/workers/";
    let backends = backends(3).await;
    let gws = start_fleet(&etcd, prefix, "rendezvous", 2).await;
    let add = |b: &Backend| format!("{{\"name\":\"{}\",\"address\":\"{}\"}}", b.name, b.addr);
    for b in &backends {
        let (s, v) = admin(&gws[0], "POST", "/workers", &add(b), None).await;
        assert_eq!(s, StatusCode::CREATED, "{v}");
        assert_eq!(v["applied"], true, "{v}");
    }
    let (s, v) = admin(&gws[1], "POST", "/workers", &add(&backends[0]), None).await;
    assert_eq!(s, StatusCode::CONFLICT, "a name that exists: {v}");
    let (s, v) = admin(&gws[1], "POST", "/workers", r#"{"name":"z","address":"127.0.0.1:9","weight":0}"#, None).await;
    assert_eq!(s, StatusCode::BAD_REQUEST, "{v}");
    eventually(Duration::from_secs(5), "both gateways have the three", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers.len() == 3)
    })
    .await;
    let (s, v) = admin(&gws[1], "PATCH", "/workers/w2", r#"{"weight":3}"#, None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    eventually(Duration::from_secs(5), "the weight everywhere", || async {
        worker_info(&gws[0], "w2").await["weight"] == 3
    })
    .await;
    let (s, v) = admin(&gws[0], "DELETE", "/workers/w1?drain=true", "", None).await;
    assert_eq!(s, StatusCode::ACCEPTED, "{v}");
    eventually(Duration::from_secs(5), "w1 draining on the other gateway", || async {
        worker_info(&gws[1], "w1").await["state"] == "draining"
    })
    .await;
    eventually(Duration::from_secs(10), "w1 removed everywhere once drained", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers == ["w2", "w3"])
    })
    .await;
    let (s, v) = admin(&gws[1], "DELETE", "/workers/w3", "", None).await;
    assert_eq!(s, StatusCode::OK, "{v}");
    eventually(Duration::from_secs(5), "w3 removed everywhere", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers == ["w2"])
    })
    .await;
    let (s, _) = admin(&gws[1], "DELETE", "/workers/nobody", "", None).await;
    assert_eq!(s, StatusCode::NOT_FOUND);
    // A reload changes the pool's settings, not its members, and the source goes on.
    let state = etcd.dir().join(format!("gw0-{}.json", prefix.replace('/', "_")));
    let text = etcd_config(&etcd.endpoint(), prefix, "ring", &state);
    gws[0].handle.reload(keyroute_server::Config::parse(&text, "t.toml").expect("valid")).expect("reload");
    assert_eq!(gws[0].handle.membership("p").expect("pool").workers, ["w2"]);
    let (_, v) = admin(&gws[0], "GET", "/workers", "", None).await;
    assert_eq!(v["pools"][0]["strategy"], "ring");
    let (s, v) = admin(&gws[1], "POST", "/workers", &add(&backends[0]), None).await;
    assert_eq!(s, StatusCode::CREATED, "{v}");
    eventually(Duration::from_secs(5), "the reloaded gateway still follows etcd", || async {
        gws[0].handle.membership("p").expect("pool").workers == ["w1", "w2"]
    })
    .await;
    drop(etcd);
    let (s, v) = admin(&gws[0], "POST", "/workers", &add(&backends[0]), None).await;
    assert_eq!(s, StatusCode::SERVICE_UNAVAILABLE, "etcd down: nothing changes, and says so: {v}");
    for g in gws {
        g.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_workers_join_leave_and_are_dropped_when_they_die() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/leases/workers/";
    let mut backends = backends(3).await;
    let gws = start_fleet(&etcd, prefix, "rendezvous", 3).await;
    let mut keepers = Vec::new();
    let mut registrars = Vec::new();
    for b in &backends {
        let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
        let r = Arc::new(Registrar::new(registry, &b.name, record(b.addr, 1, false), 2));
        let (tx, rx) = tokio::sync::watch::channel(false);
        let k = Arc::clone(&r);
        keepers.push((tx, tokio::spawn(async move { k.keep(|| async { true }, Duration::from_secs(60), rx).await })));
        registrars.push(r);
    }
    eventually(Duration::from_secs(5), "three registered workers everywhere", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers.len() == 3)
    })
    .await;
    // Steady load through all three gateways while w1 leaves gracefully and w3 dies.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut load = tokio::task::JoinSet::new();
    for (i, g) in gws.iter().enumerate() {
        let (url, stop) = (format!("http://{}/thumb", g.addr), Arc::clone(&stop));
        load.spawn(async move {
            let c = client();
            let (mut ok, mut failed) = (0u64, 0u64);
            let mut n = 0u64;
            while !stop.load(SeqCst) {
                let (s, _, _) = get(&c, &format!("{url}?k={i}-{}", n % 200)).await;
                if s == StatusCode::OK {
                    ok += 1
                } else {
                    failed += 1
                }
                n += 1;
            }
            (ok, failed)
        });
    }
    eventually(Duration::from_secs(5), "the load reaches every worker", || async {
        backends.iter().all(|b| b.arrived.load(SeqCst) > 0)
    })
    .await;
    let (tx, keeper) = keepers.remove(0);
    let _ = tx.send(true);
    let _ = keeper.await;
    let arrived = Arc::clone(&backends[0].arrived);
    let t = Instant::now();
    registrars[0]
        .leave(move || arrived.load(SeqCst), Duration::from_millis(500), Duration::from_secs(10))
        .await
        .expect("leave");
    let left = t.elapsed();
    eventually(Duration::from_secs(5), "w1 gone everywhere", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers == ["w2", "w3"])
    })
    .await;
    // w3 dies without a word: its lease (2 s) runs out, and every gateway drops it.
    let (_tx3, keeper3) = keepers.remove(1);
    keeper3.abort();
    backends[2].kill();
    let died = Instant::now();
    eventually(Duration::from_secs(6), "w3 dropped everywhere within its lease", || async {
        gws.iter().all(|g| g.handle.membership("p").expect("pool").workers == ["w2"])
    })
    .await;
    let dropped = died.elapsed();
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop.store(true, SeqCst);
    let (mut ok, mut failed) = (0, 0);
    while let Some(r) = load.join_next().await {
        let (o, f) = r.expect("load task");
        ok += o;
        failed += f;
    }
    println!(
        "graceful leave took {left:?}; a dead worker (lease 2 s) was dropped after {dropped:?}; GETs: {ok} ok, {failed} failed"
    );
    assert_eq!(failed, 0, "failed GETs while workers left");
    assert!(dropped <= Duration::from_millis(3500), "dropped after {dropped:?}, lease 2 s");
    // A graceful leave waits until its worker has seen no new request for the grace (500 ms): the
    // gateways stop sending once they read the draining record, so it takes the grace and a little
    // more, far under the 10 s limit it would reach if the gateways kept sending.
    assert!(left >= Duration::from_millis(500), "the leave did not wait for its grace: {left:?}");
    assert!(left < Duration::from_millis(2000), "the leave took {left:?}: the gateways kept sending to w1");
    for g in gws {
        g.task.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_etcd_rebuilt_from_nothing_is_read_again() {
    let mut etcd = Etcd::start();
    let prefix = "/keyroute/pools/rebuilt/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let backends = backends(3).await;
    // Enough history that the new cluster's revisions stay behind the old one's.
    for b in &backends {
        registry.add(&b.name, &record(b.addr, 1, false), 0).await.expect("add");
    }
    for w in 2..8 {
        registry.set_weight("w1", w).await.expect("weight");
    }
    let gw =
        start_gateway(&etcd_config(&etcd.endpoint(), prefix, "rendezvous", &etcd.dir().join("rebuilt.json"))).await;
    eventually(Duration::from_secs(5), "three workers", || async {
        gw.handle.membership("p").expect("pool").workers.len() == 3
    })
    .await;
    etcd.replace_with_empty();
    registry.add("w9", &record(backends[0].addr, 1, false), 0).await.expect("add");
    eventually(Duration::from_secs(8), "the new cluster's members", || async {
        gw.handle.membership("p").expect("pool").workers == ["w9"]
    })
    .await;
    gw.task.abort();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_switched_to_static_and_back_follows_etcd_again() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/switch/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let backends = backends(3).await;
    registry.add("e1", &record(backends[0].addr, 1, false), 0).await.expect("add");
    let state = etcd.dir().join("switch.json");
    let text = etcd_config(&etcd.endpoint(), prefix, "rendezvous", &state);
    let gw = start_gateway(&text).await;
    eventually(Duration::from_secs(5), "e1 from etcd", || async {
        gw.handle.membership("p").expect("pool").workers == ["e1"]
    })
    .await;
    // To static: the file's workers.
    let static_text = config_text(&[&backends[1]], "", "");
    gw.handle.reload(keyroute_server::Config::parse(&static_text, "t.toml").expect("valid")).expect("reload");
    assert_eq!(gw.handle.membership("p").expect("pool").workers, ["w2"]);
    registry.add("e2", &record(backends[2].addr, 1, false), 0).await.expect("add");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.handle.membership("p").expect("pool").workers, ["w2"], "a static pool ignores etcd");
    // And back to etcd: the source runs again and applies what etcd has now.
    gw.handle.reload(keyroute_server::Config::parse(&text, "t.toml").expect("valid")).expect("reload");
    eventually(Duration::from_secs(5), "etcd's members again", || async {
        gw.handle.membership("p").expect("pool").workers == ["e1", "e2"]
    })
    .await;
    gw.task.abort();
}
