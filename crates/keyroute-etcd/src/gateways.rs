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
//! the host by; a host with several interfaces has others this list does not name).
//! `keyroute members add` refuses an address on this list.

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
        GatewayRecord { addresses }
    }

    /// Whether `addr` is one of the gateway's (`::ffff:a.b.c.d` is `a.b.c.d`).
    pub fn covers(&self, addr: SocketAddr) -> bool {
        self.addresses.iter().any(|a| a.port() == addr.port() && a.ip().to_canonical() == addr.ip().to_canonical())
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
}
