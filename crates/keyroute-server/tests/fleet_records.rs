//! Records an operator (or a mistake) leaves under an etcd prefix, and what the fleet does with
//! them (issue 19, defects 5, 6 and 7): one bad record is refused alone, a record at a gateway's
//! own address leaves every gateway's table the same, and a prefix of any size is read. A real
//! etcd on loopback.

mod support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use keyroute_etcd::record::{RecordState, WorkerRecord};
use keyroute_etcd::registry::Registry;
use keyroute_testkit::Etcd;
use support::*;

fn etcd_config(endpoint: &str, prefix: &str, strategy: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nstrategy = \"{strategy}\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n\n[pool.membership]\nsource = \"etcd\"\nendpoints = [\"{endpoint}\"]\nprefix = \"{prefix}\"\n"
    )
}

fn record(addr: SocketAddr, weight: i64) -> WorkerRecord {
    WorkerRecord { address: addr.to_string(), weight, zone: None, id: None, state: RecordState::Active }
}

async fn applied(gw: &Gw, revision: i64) {
    eventually(Duration::from_secs(10), &format!("revision {revision} applied"), || async {
        gw.handle.membership("p").expect("pool").revision >= revision
    })
    .await;
}

fn members(gw: &Gw) -> Vec<String> {
    let mut m = gw.handle.membership("p").expect("pool").workers;
    m.sort();
    m
}

/// Defect 5: a record whose weight would pass the table limit froze the pool ("keeping the
/// current members" on every later change, a join never applied, a deleted worker kept traffic,
/// `rejected_records` 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_record_past_the_table_limit_is_refused_alone() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/huge/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let bs = backends(3).await;
    registry.add("w1", &record(bs[0].addr, 1), 0).await.expect("add");
    registry.add("w2", &record(bs[1].addr, 1), 0).await.expect("add");
    let gw = start_gateway(&etcd_config(&etcd.endpoint(), prefix, "ring")).await;
    // 1e9 x 160 points: far past the ring's limit.
    let huge = record("127.0.0.1:9".parse().expect("addr"), 1_000_000_000);
    let r = registry.add("huge", &huge, 0).await.expect("add");
    applied(&gw, r).await;
    assert_eq!(members(&gw), ["w1", "w2"]);
    let r = registry.add("w3", &record(bs[2].addr, 2), 0).await.expect("add");
    applied(&gw, r).await;
    assert_eq!(members(&gw), ["w1", "w2", "w3"], "the join applied beside the bad record");
    let r = registry.remove("w2").await.expect("remove");
    applied(&gw, r).await;
    assert_eq!(members(&gw), ["w1", "w3"], "the leave applied");
    let m = gw.handle.membership("p").expect("pool");
    assert_eq!(m.rejected, 1, "the bad record is counted");
    let (_, metrics) = admin(&gw, "GET", "/metrics", "", None).await;
    let text = metrics.as_str().unwrap_or_default().to_owned();
    assert!(
        text.lines().any(|l| l.starts_with("keyroute_membership_rejected_records{") && l.ends_with(" 1")),
        "{text}"
    );
    let c = client();
    for k in 0..50 {
        let (s, h, _) = get(&c, &format!("http://{}/thumb?k={k}", gw.addr)).await;
        assert_eq!(s.as_u16(), 200);
        assert_ne!(h["x-keyroute-worker"], "w2", "a deleted worker keeps no traffic");
    }
    gw.task.abort();
}

/// Defect 6: a record at one gateway's own listener was dropped by that gateway only, and 481 of
/// 2,000 keys were placed differently across the fleet. Now every gateway keeps the same table;
/// the member is only never sent to by the gateway it points at (its state is `loop`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_at_a_gateways_own_address_leaves_every_table_the_same() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/selfish/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let bs = backends(3).await;
    for b in &bs {
        registry.add(&b.name, &record(b.addr, 1), 0).await.expect("add");
    }
    let gws = [
        start_gateway(&etcd_config(&etcd.endpoint(), prefix, "rendezvous")).await,
        start_gateway(&etcd_config(&etcd.endpoint(), prefix, "rendezvous")).await,
    ];
    let r = registry.add("gw0", &record(gws[0].addr, 1), 0).await.expect("add");
    for g in &gws {
        applied(g, r).await;
        assert_eq!(members(g), ["gw0", "w1", "w2", "w3"]);
    }
    let mut differ = 0;
    let mut owned_by_gw0 = Vec::new();
    for k in 0..2000 {
        let key = format!("/thumb?k={k}");
        let owners: Vec<Option<String>> = gws.iter().map(|g| g.handle.owner("p", &key).expect("pool")).collect();
        differ += usize::from(owners[0] != owners[1]);
        if owners[0].as_deref() == Some("gw0") {
            owned_by_gw0.push(k);
        }
    }
    assert_eq!(differ, 0, "keys placed differently across the two gateways");
    assert!(owned_by_gw0.len() > 300, "gw0 owns its share: {}", owned_by_gw0.len());
    // Gateway 0 never sends to itself: its keys fail over to their next-ranked worker.
    assert_eq!(worker_info(&gws[0], "gw0").await["state"], "loop");
    let c = client();
    let mut served = HashMap::new();
    for k in owned_by_gw0.iter().take(40) {
        let (s, h, _) = get(&c, &format!("http://{}/thumb?k={k}", gws[0].addr)).await;
        assert_eq!(s.as_u16(), 200, "key {k}");
        *served.entry(h["x-keyroute-worker"].clone()).or_insert(0) += 1;
    }
    assert!(!served.contains_key("gw0") && served.values().sum::<i32>() == 40, "{served:?}");
    for g in gws {
        g.task.abort();
    }
}

/// Defect 7: 50 values of 1 MiB beside the workers made the prefix's one read pass the 64 MiB an
/// answer may hold; a restarted gateway stayed at "etcd unreachable, revision 0" and never
/// applied a join. The prefix is read in pages now.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_prefix_past_64_mib_is_read_in_pages() {
    let etcd = Etcd::start();
    let prefix = "/keyroute/pools/big/workers/";
    let registry = Registry::new(&[etcd.endpoint()], prefix).expect("registry");
    let bs = backends(2).await;
    registry.add("w1", &record(bs[0].addr, 1), 0).await.expect("add");
    // 1 MiB each: 50 of them in base64 pass the 64 MiB an answer may hold.
    let junk = vec![b'x'; 1 << 20];
    for i in 0..50 {
        registry.client().put(format!("{prefix}junk-{i:02}").as_bytes(), &junk, 0).await.expect("put 1 MB");
    }
    let gw = start_gateway(&etcd_config(&etcd.endpoint(), prefix, "rendezvous")).await;
    eventually(Duration::from_secs(20), "the prefix read and applied", || async {
        let m = gw.handle.membership("p").expect("pool");
        m.source_up && m.revision > 0
    })
    .await;
    assert_eq!(members(&gw), ["w1"]);
    assert_eq!(gw.handle.membership("p").expect("pool").rejected, 50, "each junk value is refused alone");
    let r = registry.add("w2", &record(bs[1].addr, 1), 0).await.expect("add");
    applied(&gw, r).await;
    assert_eq!(members(&gw), ["w1", "w2"], "a join after the big read applies");
    gw.task.abort();
}

/// Issue 31 (10): a pool placed as twemproxy, libketama or Redis Cluster places, takes its
/// members from etcd like any other: it starts with the records there (it exited 2, "twemproxy
/// needs a server with weight", since its table was first built over no member), and follows a
/// join.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn compatibility_modes_take_their_members_from_etcd() {
    let etcd = Etcd::start();
    let bs = backends(4).await;
    for strategy in ["twemproxy", "libketama", "redis-cluster"] {
        let prefix = format!("/keyroute/pools/{strategy}/workers/");
        let registry = Registry::new(&[etcd.endpoint()], &prefix).expect("registry");
        for (i, b) in bs[..3].iter().enumerate() {
            registry.add(&format!("w{}", i + 1), &record(b.addr, 1), 0).await.expect("add");
        }
        let gw = start_gateway(&etcd_config(&etcd.endpoint(), &prefix, strategy)).await;
        eventually(Duration::from_secs(10), "the records are the members", || async {
            members(&gw) == ["w1", "w2", "w3"]
        })
        .await;
        let c = client();
        let ks = keys(60);
        let owners = owners(&c, &gw, &ks).await;
        let mut used: Vec<&String> = owners.values().collect();
        used.sort();
        used.dedup();
        assert_eq!(used.len(), 3, "{strategy}: keys on every member: {used:?}");
        let r = registry.add("w4", &record(bs[3].addr, 1), 0).await.expect("add");
        applied(&gw, r).await;
        assert_eq!(members(&gw), ["w1", "w2", "w3", "w4"], "{strategy}");
        gw.task.abort();
    }
}
