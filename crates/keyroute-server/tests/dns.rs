//! Issue 34: members from DNS, served by a real DNS server (dnsmasq, started here on a loopback
//! port and stopped by pid) whose records the test changes: a join, a weight change, a leave, no
//! such name and a server that stops answering (the pool keeps its members through both), and
//! address records with a port.

mod support;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::Duration;

use support::*;

fn dnsmasq_bin() -> &'static str {
    if std::path::Path::new("/usr/sbin/dnsmasq").exists() { "/usr/sbin/dnsmasq" } else { "dnsmasq" }
}

/// dnsmasq on 127.0.0.1:`port`, authoritative for `test.` (a name it has no record of is
/// NXDOMAIN), serving `records` (its config lines), TTL 1 s.
struct Dns {
    port: u16,
    dir: PathBuf,
    proc: Option<Proc>,
}

impl Dns {
    fn start(records: &[String]) -> Dns {
        let dir = std::env::temp_dir().join(format!("keyroute-dns-{}-{}", std::process::id(), free_port()));
        std::fs::create_dir_all(&dir).expect("dir");
        // A port free for UDP and TCP alike (dnsmasq binds both); another one if it is taken
        // before dnsmasq binds it (the tests beside this one make connections all the time).
        for _ in 0..20 {
            let mut d = Dns { port: free_port(), dir: dir.clone(), proc: None };
            if d.try_serve(records, 5) {
                return d;
            }
        }
        panic!("dnsmasq did not start on any of 20 ports");
    }

    /// (Re)starts dnsmasq on the same port with these records (dnsmasq reads SRV records only
    /// at start).
    fn serve(&mut self, records: &[String]) {
        assert!(self.try_serve(records, 50), "dnsmasq did not start again on port {}", self.port);
    }

    /// Starts dnsmasq with these records, `attempts` times at most: whether it runs.
    fn try_serve(&mut self, records: &[String], attempts: usize) -> bool {
        self.proc = None;
        let conf = self.dir.join("dnsmasq.conf");
        let mut text = String::from("local=/test/\n");
        for r in records {
            text.push_str(r);
            text.push('\n');
        }
        std::fs::write(&conf, text).expect("conf");
        for _ in 0..attempts {
            let child = Command::new(dnsmasq_bin())
                .args([
                    "--keep-in-foreground",
                    "--no-resolv",
                    "--no-hosts",
                    "--bind-interfaces",
                    "--listen-address=127.0.0.1",
                    "--local-ttl=1",
                    "--pid-file=",
                    "--log-facility=-",
                ])
                .arg(format!("--port={}", self.port))
                .arg(format!("--conf-file={}", conf.display()))
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("dnsmasq (scripts/test.sh installs dnsmasq-base)");
            let mut p = Proc(child);
            std::thread::sleep(Duration::from_millis(100));
            // Still running: it bound its port (it exits at once when it cannot).
            if p.0.try_wait().ok().flatten().is_none() {
                self.proc = Some(p);
                return true;
            }
            drop(p);
        }
        false
    }

    fn signal(&self, sig: &str) {
        if let Some(p) = &self.proc {
            let _ = Command::new("kill").args([sig, &p.0.id().to_string()]).status();
        }
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        self.signal("-CONT");
        self.proc = None;
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A loopback port free for UDP and for TCP now.
fn free_port() -> u16 {
    loop {
        let s = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind");
        let port = s.local_addr().expect("addr").port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// An SRV record for a backend, with its target's address record.
fn srv(host: &str, b: &Backend, priority: u16, weight: u16) -> [String; 2] {
    [
        format!("srv-host=_http._tcp.web.test,{host}.web.test,{},{priority},{weight}", b.addr.port()),
        format!("host-record={host}.web.test,127.0.0.1"),
    ]
}

fn records(list: &[[String; 2]]) -> Vec<String> {
    list.iter().flat_map(|r| r.iter().cloned()).collect()
}

fn name(host: &str, b: &Backend) -> String {
    format!("{host}.web.test:{}", b.addr.port())
}

fn gateway_text(server: SocketAddr, membership: &str) -> String {
    format!(
        "[admin]\nlisten = \"127.0.0.1:0\"\n\n[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\nkey = \"{{path}}?k={{query.k}}\"\nworker_header = \"x-keyroute-worker\"\n\n[pool.membership]\nsource = \"dns\"\nserver = \"{server}\"\nttl_floor_ms = 200\nttl_ceiling_ms = 400\ntimeout_ms = 300\n{membership}\n"
    )
}

async fn members_are(gw: &Gw, want: &[String], what: &str) {
    let mut want = want.to_vec();
    want.sort();
    eventually(Duration::from_secs(10), what, || {
        let want = want.clone();
        let handle = gw.handle.clone();
        async move {
            let mut have = handle.membership("p").expect("pool").workers;
            have.sort();
            have == want
        }
    })
    .await;
}

/// SRV records: the pool follows a join, a weight change and a leave, moving only the keys the
/// change owns; through no such name and a resolver that stops answering it keeps its members
/// and says the source is down; the lowest priority's records are the members.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pool_follows_srv_records_and_keeps_its_members_through_bad_answers() {
    let bs = backends(3).await;
    let (b1, b2, b3) = (&bs[0], &bs[1], &bs[2]);
    // w3 is published at a higher priority value: a fallback, not a member. `ghost` has no address
    // (NXDOMAIN for its target): left out, the others serve.
    let mut first = records(&[srv("w1", b1, 10, 1), srv("w2", b2, 10, 1), srv("w3", b3, 20, 1)]);
    first.push("srv-host=_http._tcp.web.test,ghost.web.test,9,10,1".to_owned());
    let mut dns = Dns::start(&first);
    let server = SocketAddr::from(([127, 0, 0, 1], dns.port));
    let gw = start_gateway(&gateway_text(server, "name = \"_http._tcp.web.test\"")).await;
    members_are(&gw, &[name("w1", b1), name("w2", b2)], "the lowest priority's two workers").await;
    let c = client();
    let (status, h, _) = get(&c, &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!(status, http::StatusCode::OK);
    assert!(h["x-keyroute-worker"].ends_with(".web.test:") || h["x-keyroute-worker"].contains(".web.test:"));

    // A join: only keys that move to the new worker move.
    let keys = keys(300);
    let owner = |k: &String| gw.handle.owner("p", &format!("/thumb?k={k}")).expect("pool").expect("owner");
    let before: Vec<String> = keys.iter().map(owner).collect();
    dns.serve(&records(&[srv("w1", b1, 10, 1), srv("w2", b2, 10, 1), srv("w3", b3, 10, 1)]));
    members_are(&gw, &[name("w1", b1), name("w2", b2), name("w3", b3)], "w3 joined").await;
    let after: Vec<String> = keys.iter().map(owner).collect();
    let moved: Vec<usize> = (0..keys.len()).filter(|&i| before[i] != after[i]).collect();
    assert!(!moved.is_empty(), "a third worker takes some keys");
    assert!(moved.iter().all(|&i| after[i] == name("w3", b3)), "only keys the new worker owns move");

    // A weight change: the record's weight is the worker's.
    dns.serve(&records(&[srv("w1", b1, 10, 5), srv("w2", b2, 10, 1), srv("w3", b3, 10, 1)]));
    let w1 = name("w1", b1);
    eventually(Duration::from_secs(10), "w1's weight is 5", || {
        let (gw, w1) = (&gw, w1.clone());
        async move { worker_info(gw, &w1).await["weight"] == 5 }
    })
    .await;

    // A leave.
    dns.serve(&records(&[srv("w1", b1, 10, 5), srv("w3", b3, 10, 1)]));
    members_are(&gw, &[name("w1", b1), name("w3", b3)], "w2 left").await;
    assert!(gw.handle.membership("p").expect("pool").source_up);

    // No such name: the members stay, the source is down, requests are served.
    dns.serve(&[]);
    eventually(Duration::from_secs(10), "the source is down (NXDOMAIN)", || {
        let handle = gw.handle.clone();
        async move { !handle.membership("p").expect("pool").source_up }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    members_are(&gw, &[name("w1", b1), name("w3", b3)], "members kept through NXDOMAIN").await;
    let (status, _, _) = get(&c, &format!("http://{}/x?k=2", gw.addr)).await;
    assert_eq!(status, http::StatusCode::OK);

    // Back, then a resolver that stops answering (SIGSTOP): timeouts keep the members too.
    dns.serve(&records(&[srv("w1", b1, 10, 5), srv("w2", b2, 10, 1), srv("w3", b3, 10, 1)]));
    members_are(&gw, &[name("w1", b1), name("w2", b2), name("w3", b3)], "records back").await;
    dns.signal("-STOP");
    eventually(Duration::from_secs(10), "the source is down (timeouts)", || {
        let handle = gw.handle.clone();
        async move { !handle.membership("p").expect("pool").source_up }
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    members_are(&gw, &[name("w1", b1), name("w2", b2), name("w3", b3)], "members kept through timeouts").await;
    dns.signal("-CONT");
    eventually(Duration::from_secs(10), "the source answers again", || {
        let handle = gw.handle.clone();
        async move { handle.membership("p").expect("pool").source_up }
    })
    .await;

    // The admin API does not edit a DNS-backed pool's members.
    let (status, _) = admin(&gw, "DELETE", &format!("/workers/{}", name("w2", b2)), "", None).await;
    assert_eq!(status, http::StatusCode::CONFLICT);
    gw.task.abort();
}

/// Address records: one worker per address at the pool's port, named `{ip}:{port}` (or by the
/// template); `srv_priority = "zone"` puts each priority in its own zone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn address_records_and_priority_zones() {
    let bs = backends(2).await;
    let dns = Dns::start(&[
        "host-record=api.test,127.0.0.1".to_owned(),
        srv("z1", &bs[0], 1, 1)[0].clone(),
        srv("z1", &bs[0], 1, 1)[1].clone(),
        srv("z2", &bs[1], 2, 1)[0].clone(),
        srv("z2", &bs[1], 2, 1)[1].clone(),
    ]);
    let server = SocketAddr::from(([127, 0, 0, 1], dns.port));
    let port = bs[0].addr.port();
    let gw = start_gateway(&gateway_text(
        server,
        &format!("name = \"API.Test\"\nport = {port}\nworker_name = \"api-{{ip}}\""),
    ))
    .await;
    members_are(&gw, &["api-127.0.0.1".to_owned()], "one worker per address").await;
    let (status, _, body) = get(&client(), &format!("http://{}/x?k=1", gw.addr)).await;
    assert_eq!((status, body.as_str()), (http::StatusCode::OK, bs[0].name.as_str()));
    gw.task.abort();

    let gw = start_gateway(&gateway_text(server, "name = \"_http._tcp.web.test\"\nsrv_priority = \"zone\"")).await;
    members_are(&gw, &[name("z1", &bs[0]), name("z2", &bs[1])], "both priorities").await;
    assert_eq!(worker_info(&gw, &name("z1", &bs[0])).await["zone"], "priority-1");
    assert_eq!(worker_info(&gw, &name("z2", &bs[1])).await["zone"], "priority-2");
    gw.task.abort();
}

/// `[pool.membership]` DNS mistakes name their field and line.
#[test]
fn dns_sources_are_checked_where_they_are_written() {
    for (section, field, needle) in [
        ("source = \"dns\"", "membership.name", "needs the name"),
        ("source = \"dns\"\nname = \"a..b\"", "membership.name", "not a DNS name"),
        ("source = \"dns\"\nname = \"api.test\"\nserver = \"127.0.0.1:53\"", "membership.port", "no port"),
        (
            "source = \"dns\"\nname = \"_s._tcp.a.test\"\nport = 80\nserver = \"127.0.0.1:53\"",
            "membership.port",
            "SRV records carry",
        ),
        ("source = \"dns\"\nname = \"a.test\"\nport = 80\nserver = \"nope\"", "membership.server", "not an address"),
        (
            "source = \"dns\"\nname = \"a.test\"\nport = 80\nserver = \"127.0.0.1\"\nrecord = \"mx\"",
            "membership.record",
            "not one of",
        ),
        (
            "source = \"dns\"\nname = \"a.test\"\nport = 80\nserver = \"127.0.0.1\"\nworker_name = \"web\"",
            "membership.worker_name",
            "{ip}",
        ),
        (
            "source = \"dns\"\nname = \"a.test\"\nport = 80\nserver = \"127.0.0.1\"\nttl_floor_ms = 5000\nttl_ceiling_ms = 1000",
            "membership.ttl_ceiling_ms",
            "at least",
        ),
        (
            "source = \"dns\"\nname = \"a.test\"\nport = 80\nserver = \"127.0.0.1\"\nsrv_priority = \"zone\"",
            "membership.srv_priority",
            "only SRV",
        ),
        ("source = \"static\"\nname = \"a.test\"", "membership.name", "only a DNS source"),
        (
            "source = \"dns\"\nname = \"a.test\"\nport = 80\nprefix = \"/x/\"",
            "membership.prefix",
            "only an etcd source",
        ),
    ] {
        let text = format!(
            "[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\n\n[pool.membership]\n{section}\n"
        );
        let e = keyroute_server::Config::parse(&text, "dns.toml").expect_err(section).to_string();
        let line = e.strip_prefix("dns.toml:").and_then(|r| r.split(':').next()).and_then(|n| n.parse::<u32>().ok());
        assert!(line.is_some(), "{section}: {e}");
        assert!(e.contains(field) && e.contains(needle), "{section}: {e}");
    }
    let text = "[[listener]]\nlisten = \"127.0.0.1:0\"\n\n[[pool]]\nname = \"p\"\n\n[pool.membership]\nsource = \"dns\"\nname = \"_http._tcp.a.test\"\nserver = \"127.0.0.1:5353\"\n\n[[pool.worker]]\nname = \"w\"\naddress = \"127.0.0.1:1\"\n";
    let e = keyroute_server::Config::parse(text, "dns.toml").expect_err("workers").to_string();
    assert!(e.contains("DNS-backed"), "{e}");
}
