//! The gateways of a fleet, as they announce themselves: so that no member record is ever put at
//! a gateway's own listener or admin address (a record there would loop requests back into the
//! fleet, or put an admin API behind a public listener).
//!
//! Every gateway with an etcd-backed pool keeps one record alive under [`PREFIX`] on that etcd,
//! with a lease of [`TTL`] seconds (so a gateway that dies is forgotten within it):
//!
//! ```text
//! /keyroute/gateways/10.0.0.5:9901  ->  {"addresses": ["10.0.0.5:8080", "127.0.0.1:8080", "10.0.0.5:9901"]}
//! ```
//!
//! `addresses` are the listeners' and the admin API's, each as bound, and for one bound to
//! every interface (`0.0.0.0`, `::`) the loopback address and the address the gateway's host
//! reaches etcd from, with the same port (the address the rest of the fleet most likely knows
//! the host by). Newer records also carry `listen`, the listeners as bound (wildcards kept), and
//! `host`, the host's own addresses ([`host_addresses`]) when one is bound to every interface:
//! an address [`reaches`] one of them by the same rule a gateway uses to mark a member at its own
//! address `loop` (any loopback address, `::ffff:`-mapped spellings, and every interface address
//! of a wildcard listener, on its port).
//! `keyroute members add` refuses an address the record covers ([`GatewayRecord::covers`]).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::client::{Client, EtcdError};

/// Where gateways announce themselves, on every etcd a pool of theirs watches.
pub const PREFIX: &str = "/keyroute/gateways/";

/// The lease of a gateway's record, in seconds.
pub const TTL: u64 = 10;

/// A gateway's record (see the [module documentation](self)).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GatewayRecord {
    /// Every address it answers at: listeners and admin API.
    pub addresses: Vec<SocketAddr>,
    /// The listeners and admin API as bound, wildcards kept (absent in older records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub listen: Vec<SocketAddr>,
    /// The host's own addresses, for a listener bound to every interface (absent in older
    /// records).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub host: Vec<IpAddr>,
}

/// Whether a connection to `worker` reaches a listener bound at `listen`, on a host whose own
/// addresses `is_local` tells: the same port, and the same address (`::ffff:a.b.c.d` is
/// `a.b.c.d`) or, for a listener bound to every interface (`0.0.0.0`, `::`, which on Linux takes
/// IPv4 too), any address of the host. The one rule for "this worker is a gateway itself": a
/// gateway marks such a member `loop`, and `keyroute members add` refuses it.
pub fn reaches(worker: SocketAddr, listen: SocketAddr, is_local: impl Fn(IpAddr) -> bool) -> bool {
    let (w, o) = (worker.ip().to_canonical(), listen.ip().to_canonical());
    worker.port() == listen.port() && (w == o || (o.is_unspecified() && is_local(w)))
}

/// This host's own addresses, as Linux lists them: the local host routes of
/// `/proc/net/fib_trie` (IPv4) and `/proc/net/if_inet6`. Empty where those cannot be read (the
/// record then names loopback and the outbound address only).
pub fn host_addresses() -> Vec<IpAddr> {
    let mut ips: Vec<IpAddr> = Vec::new();
    if let Ok(trie) = std::fs::read_to_string("/proc/net/fib_trie") {
        ips.extend(local_v4(&trie));
    }
    if let Ok(v6) = std::fs::read_to_string("/proc/net/if_inet6") {
        ips.extend(v6.lines().filter_map(|l| inet6(l.split_whitespace().next()?)));
    }
    ips.sort_unstable();
    ips.dedup();
    ips
}

/// The addresses of `/proc/net/fib_trie`'s `/32 host LOCAL` entries (each under the
/// `|-- a.b.c.d` line that names it).
fn local_v4(trie: &str) -> Vec<IpAddr> {
    let lines: Vec<&str> = trie.lines().collect();
    lines
        .windows(2)
        .filter(|w| w[1].trim() == "/32 host LOCAL")
        .filter_map(|w| w[0].trim().strip_prefix("|-- ")?.parse().ok())
        .collect()
}

/// An address of `/proc/net/if_inet6` (32 hex digits).
fn inet6(hex: &str) -> Option<IpAddr> {
    if hex.len() != 32 {
        return None;
    }
    let n = u128::from_str_radix(hex, 16).ok()?;
    Some(IpAddr::V6(std::net::Ipv6Addr::from(n)))
}

impl GatewayRecord {
    /// The record of a gateway bound at `bound` (listeners and admin), that reaches etcd from
    /// `outbound` (its host's address towards etcd, if known).
    pub fn new(bound: &[SocketAddr], outbound: Option<IpAddr>) -> GatewayRecord {
        let mut addresses = Vec::new();
        for a in bound {
            if a.ip().is_unspecified() {
                let loopback: IpAddr =
                    if a.is_ipv4() { [127, 0, 0, 1].into() } else { std::net::Ipv6Addr::LOCALHOST.into() };
                addresses.push(SocketAddr::new(loopback, a.port()));
                addresses.extend(outbound.map(|ip| SocketAddr::new(ip, a.port())));
            } else {
                addresses.push(*a);
            }
        }
        addresses.sort();
        addresses.dedup();
        let host =
            if bound.iter().any(|a| a.ip().is_unspecified()) { outbound.into_iter().collect() } else { Vec::new() };
        GatewayRecord { addresses, listen: bound.to_vec(), host }
    }

    /// The record with the host's addresses `ips` too (see [`host_addresses`]), when a listener
    /// is bound to every interface.
    #[must_use]
    pub fn with_host_addresses(mut self, ips: impl IntoIterator<Item = IpAddr>) -> GatewayRecord {
        if self.listen.iter().any(|a| a.ip().is_unspecified()) {
            self.host.extend(ips);
            self.host.sort_unstable();
            self.host.dedup();
        }
        self
    }

    /// Whether a connection to `addr` reaches the gateway, by [`reaches`]: one of its
    /// addresses, or on a listener bound to every interface any loopback address or address of
    /// its host (`::ffff:a.b.c.d` is `a.b.c.d`).
    pub fn covers(&self, addr: SocketAddr) -> bool {
        let local = |ip: IpAddr| ip.is_loopback() || self.host.iter().any(|h| h.to_canonical() == ip);
        self.addresses.iter().chain(&self.listen).any(|a| reaches(addr, *a, local))
    }
}

/// The address this host reaches `endpoint` (`host:port`) from, found without sending anything
/// (a UDP socket's route).
pub fn outbound_ip(endpoint: &str) -> Option<IpAddr> {
    use std::net::ToSocketAddrs;
    let target = endpoint.to_socket_addrs().ok()?.next()?;
    let any: SocketAddr =
        if target.is_ipv4() { ([0, 0, 0, 0], 0).into() } else { (std::net::Ipv6Addr::UNSPECIFIED, 0).into() };
    let socket = std::net::UdpSocket::bind(any).ok()?;
    socket.connect(target).ok()?;
    socket.local_addr().ok().map(|a| a.ip())
}

/// Every gateway announced on this etcd now: its name and record (records that are not one are
/// left out).
///
/// # Errors
///
/// etcd is unreachable.
pub async fn known(client: &Client) -> Result<Vec<(String, GatewayRecord)>, EtcdError> {
    let range = client.range_prefix(PREFIX.as_bytes()).await?;
    Ok(range
        .kvs
        .into_iter()
        .filter_map(|kv| {
            let name = String::from_utf8_lossy(kv.key.strip_prefix(PREFIX.as_bytes())?).into_owned();
            Some((name, serde_json::from_slice(&kv.value).ok()?))
        })
        .collect())
}

/// Keeps a gateway's record alive under [`PREFIX`] until `stop` is set, then revokes it: puts it
/// with a lease of [`TTL`] seconds, renews the lease every third of it, and puts the record
/// again with a new lease whenever the lease was lost (etcd unreachable for longer than the TTL,
/// or restarted). etcd being unreachable is retried every second and logged once.
pub async fn announce(client: Client, name: String, record: GatewayRecord, mut stop: watch::Receiver<bool>) {
    let key = format!("{PREFIX}{name}").into_bytes();
    let value = serde_json::to_vec(&record).unwrap_or_default();
    let mut lease = 0i64;
    let mut failing = false;
    loop {
        let step = async {
            if lease != 0 && client.keep_alive(lease).await?.is_some() {
                return Ok::<_, EtcdError>(());
            }
            let fresh = client.grant(TTL).await?;
            client.put(&key, &value, fresh).await?;
            lease = fresh;
            Ok(())
        };
        let wait = match step.await {
            Ok(()) => {
                if failing {
                    tracing::info!(gateway = %name, "gateway record announced again");
                    failing = false;
                }
                Duration::from_millis(TTL * 1000 / 3)
            }
            Err(e) => {
                if !failing {
                    tracing::warn!(gateway = %name, error = %e, "could not announce this gateway in etcd; retrying");
                    failing = true;
                }
                Duration::from_secs(1)
            }
        };
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = crate::stopped(&mut stop) => break,
        }
    }
    if lease != 0 {
        let _ = client.revoke(lease).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gateway_on_every_interface_covers_loopback_and_its_outbound_address() {
        let bound: Vec<SocketAddr> = vec!["0.0.0.0:8080".parse().expect("a"), "127.0.0.1:9901".parse().expect("a")];
        let r = GatewayRecord::new(&bound, Some([10, 0, 0, 5].into()));
        for yes in ["127.0.0.1:8080", "10.0.0.5:8080", "127.0.0.1:9901", "[::ffff:10.0.0.5]:8080"] {
            assert!(r.covers(yes.parse().expect("a")), "{yes}");
        }
        for no in ["10.0.0.6:8080", "10.0.0.5:8081", "10.0.0.5:9901"] {
            assert!(!r.covers(no.parse().expect("a")), "{no}");
        }
    }

    /// Issue 31, defect 20: `members add` took these for a gateway listening on `0.0.0.0`,
    /// which marks them `loop`.
    #[test]
    fn a_gateway_on_every_interface_covers_every_loopback_and_host_address() {
        let bound: Vec<SocketAddr> = vec!["0.0.0.0:8080".parse().expect("a"), "127.0.0.1:9901".parse().expect("a")];
        let r = GatewayRecord::new(&bound, Some([10, 0, 0, 5].into()))
            .with_host_addresses(["192.0.2.7".parse().expect("ip"), "fd00::2".parse().expect("ip")]);
        for yes in [
            "127.0.0.2:8080",
            "[::ffff:127.0.0.3]:8080",
            "[::1]:8080",
            "192.0.2.7:8080",
            "[fd00::2]:8080",
            "10.0.0.5:8080",
        ] {
            assert!(r.covers(yes.parse().expect("a")), "{yes}");
        }
        // A loopback listener is that address only, as the gateway sees it.
        for no in ["192.0.2.7:8081", "192.0.2.8:8080", "127.0.0.2:9901", "192.0.2.7:9901"] {
            assert!(!r.covers(no.parse().expect("a")), "{no}");
        }
        // The record as etcd holds it reads back the same, and an older one still reads.
        let back: GatewayRecord = serde_json::from_slice(&serde_json::to_vec(&r).expect("json")).expect("record");
        assert_eq!(back, r);
        let old: GatewayRecord = serde_json::from_str(r#"{"addresses":["127.0.0.1:8080"]}"#).expect("old record");
        assert!(old.covers("127.0.0.1:8080".parse().expect("a")));
    }

    #[test]
    fn host_addresses_are_read_from_procfs_text() {
        let trie = "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- 127.0.0.1\n        /32 host LOCAL\n     |-- 192.0.2.2\n        /32 host LOCAL\n     |-- 192.0.2.255\n        /32 link BROADCAST\n";
        assert_eq!(local_v4(trie), ["127.0.0.1".parse::<IpAddr>().expect("ip"), "192.0.2.2".parse().expect("ip")]);
        assert_eq!(inet6("fd000000000000000000000000000002"), Some("fd00::2".parse().expect("ip")));
        assert_eq!(inet6("fd00"), None);
    }
}
