//! The DNS membership source (`[pool.membership] source = "dns"`): a pool's members are what a
//! name resolves to, as Kubernetes headless services, Consul and Nomad publish them, and as
//! HAProxy's `server-template` with `resolvers` and Envoy's `STRICT_DNS` clusters follow them.
//!
//! - **SRV** (`record = "srv"`, the default for a name that starts with `_`): each record is a
//!   worker at its target's address and the record's port, with the record's weight as keyroute's
//!   weight (an SRV weight of 0, "rarely", is 1). Priorities: by default only the records of the
//!   lowest priority value are members (the others are RFC 2782's fallbacks, used when no
//!   record of a lower value is published); with `srv_priority = "zone"` every record is a member,
//!   in zone `priority-N`, so that zone-aware placement keeps replicas across priorities.
//!   Targets are resolved from the answer's additional records, else with their own A (then
//!   AAAA) query.
//! - **A/AAAA** (`record = "a"`): one worker per address, at the pool's `port`.
//!
//! A worker's **name** is its identity for placement, so it must not change when nothing about
//! the worker did: `worker_name` is a template over `{host}` (the SRV target, or the name asked),
//! `{ip}` and `{port}`; by default `{host}:{port}` for SRV and `{ip}:{port}` for A records. A name
//! that two records give is one worker, the first in address order.
//!
//! The name is resolved again when the shortest TTL of the answer runs out, within the
//! `ttl_floor_ms` and `ttl_ceiling_ms` bounds (1 s and 60 s by default), and at once after a
//! reload. As with etcd, the table is a function of the answer alone (applied as one snapshot
//! swap, the same worker keeping its state), and **a bad answer never empties the pool**: no such
//! name, an empty answer, a server failure or a timeout keeps the members as they are, says so
//! (a log line, `keyroute_membership_source_up` 0), and asks again at the floor.

pub mod resolve;
pub mod wire;

use std::collections::HashSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use crate::Fleet;
use crate::config::{DnsConfig, DnsRecord, MembershipConfig, SrvPriority};
use crate::pool::{Member, MembershipError, Pool};
use wire::{Data, Record};

/// What the running list calls a pool's DNS task (apart from its etcd task, should a reload
/// switch sources while the other still ends).
fn task_name(pool: &str) -> String {
    format!("dns:{pool}")
}

/// Starts the DNS source task of every DNS-backed pool that has none.
pub(crate) fn spawn_sources(fleet: &Arc<Fleet>) {
    let pools = fleet.pools();
    let mut running = fleet.sources.lock();
    for pool in pools.iter() {
        let name = task_name(&pool.name);
        if running.contains(&name) || !matches!(pool.snapshot().config().membership, MembershipConfig::Dns(_)) {
            continue;
        }
        running.push(name);
        tokio::spawn(run(Arc::downgrade(pool), Arc::downgrade(fleet)));
    }
}

/// A worker an answer gives, before it is named.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// The SRV target, or the name asked.
    pub host: String,
    /// Its address.
    pub ip: IpAddr,
    /// Its port.
    pub port: u16,
    /// Its weight.
    pub weight: u32,
    /// Its zone (`priority-N`, under `srv_priority = "zone"`).
    pub zone: Option<String>,
}

/// An answer: the workers, and how long it holds (the shortest TTL).
#[derive(Debug)]
pub struct Answer {
    /// The workers found.
    pub found: Vec<Found>,
    /// The shortest TTL among the records used.
    pub ttl: Duration,
    /// SRV targets whose addresses could not be had, and why (the others still serve).
    pub unresolved: Vec<String>,
}

/// Why a resolution gave no members; the pool keeps those it has.
#[derive(Debug, thiserror::Error)]
pub enum DnsError {
    /// The resolver did not answer, or its answer could not be read.
    #[error(transparent)]
    Lookup(#[from] resolve::LookupError),
    /// An answer with a failure code.
    #[error("{name}: {}", rcode_text(*.rcode))]
    Code {
        /// The name asked.
        name: String,
        /// The code.
        rcode: u8,
    },
    /// An answer without records of the type asked.
    #[error("{0}: no records")]
    Empty(String),
}

fn rcode_text(rcode: u8) -> &'static str {
    match rcode {
        1 => "the resolver refused the query as malformed (FORMERR)",
        2 => "server failure (SERVFAIL)",
        3 => "no such name (NXDOMAIN)",
        4 => "not implemented (NOTIMP)",
        5 => "refused (REFUSED)",
        _ => "an error code",
    }
}

/// Resolves the pool's name into workers.
///
/// # Errors
///
/// No answer, a failure code, or no usable records: see [`DnsError`].
pub async fn resolve_workers(cfg: &DnsConfig) -> Result<Answer, DnsError> {
    match cfg.record {
        DnsRecord::Address => {
            let port = cfg.port.unwrap_or(80);
            let (ips, ttl) = addresses(cfg, &cfg.name, &[]).await?;
            let found = ips.into_iter().map(|ip| Found { host: cfg.name.clone(), ip, port, weight: 1, zone: None });
            Ok(Answer { found: found.collect(), ttl, unresolved: Vec::new() })
        }
        DnsRecord::Srv => {
            let r = resolve::lookup(cfg.server, &cfg.name, wire::SRV, cfg.timeout).await?;
            if r.rcode != 0 {
                return Err(DnsError::Code { name: cfg.name.clone(), rcode: r.rcode });
            }
            let mut srvs: Vec<(u16, u16, u16, String, u32)> = r
                .records
                .iter()
                .filter_map(|rec| match &rec.data {
                    Data::Srv { priority, weight, port, target } if !target.is_empty() => {
                        Some((*priority, *weight, *port, target.clone(), rec.ttl))
                    }
                    _ => None,
                })
                .collect();
            if srvs.is_empty() {
                return Err(DnsError::Empty(cfg.name.clone()));
            }
            if cfg.priority == SrvPriority::Lowest {
                let lowest = srvs.iter().map(|s| s.0).min().unwrap_or(0);
                srvs.retain(|s| s.0 == lowest);
            }
            let mut ttl = srvs.iter().map(|s| s.4).min().unwrap_or(0);
            let mut found = Vec::new();
            let mut unresolved = Vec::new();
            let mut last_error = None;
            for (priority, weight, port, target, _) in srvs {
                // A target that does not resolve is left out; the others still serve.
                let (ips, t) = match addresses(cfg, &target, &r.records).await {
                    Ok(a) => a,
                    Err(e) => {
                        unresolved.push(format!("{target}: {e}"));
                        last_error = Some(e);
                        continue;
                    }
                };
                ttl = ttl.min(t.as_secs() as u32);
                let zone = (cfg.priority == SrvPriority::Zone).then(|| format!("priority-{priority}"));
                for ip in ips {
                    let weight = u32::from(weight.max(1));
                    found.push(Found { host: target.clone(), ip, port, weight, zone: zone.clone() });
                }
            }
            if found.is_empty()
                && let Some(e) = last_error
            {
                return Err(e);
            }
            Ok(Answer { found, ttl: Duration::from_secs(u64::from(ttl)), unresolved })
        }
    }
}

/// `host`'s addresses: from `known` records (an SRV answer's additional section) if it has
/// them, else an A query, then an AAAA query if that found none.
async fn addresses(cfg: &DnsConfig, host: &str, known: &[Record]) -> Result<(Vec<IpAddr>, Duration), DnsError> {
    let of = |records: &[Record]| -> (Vec<IpAddr>, u32) {
        // The owner may be the host or an alias of it (CNAME chains end in the addresses).
        let mut names: HashSet<&str> = HashSet::from([host]);
        for r in records {
            if let Data::Cname(to) = &r.data
                && names.contains(r.name.as_str())
            {
                names.insert(to.as_str());
            }
        }
        let ips: Vec<(IpAddr, u32)> = records
            .iter()
            .filter(|r| names.contains(r.name.as_str()))
            .filter_map(|r| match r.data {
                Data::Address(ip) => Some((ip, r.ttl)),
                _ => None,
            })
            .collect();
        let ttl = ips.iter().map(|x| x.1).min().unwrap_or(u32::MAX);
        (ips.into_iter().map(|x| x.0).collect(), ttl)
    };
    let (ips, ttl) = of(known);
    if !ips.is_empty() {
        return Ok((ips, Duration::from_secs(u64::from(ttl))));
    }
    let mut last_code = 0;
    for qtype in [wire::A, wire::AAAA] {
        let r = resolve::lookup(cfg.server, host, qtype, cfg.timeout).await?;
        if r.rcode != 0 {
            last_code = r.rcode;
            continue;
        }
        let (ips, ttl) = of(&r.records);
        if !ips.is_empty() {
            return Ok((ips, Duration::from_secs(u64::from(ttl))));
        }
    }
    if last_code != 0 {
        return Err(DnsError::Code { name: host.to_owned(), rcode: last_code });
    }
    Err(DnsError::Empty(host.to_owned()))
}

/// The members an answer gives: named by the template, checked as any worker's name is (no
/// spaces, control or invisible characters, at most 256 bytes: a DNS label may hold any byte),
/// one per name and one per address (the first in address order keeps each), and marked when
/// the address is this gateway's own. The records refused, with why.
pub fn members_of(cfg: &DnsConfig, found: &[Found], own: &[SocketAddr]) -> (Vec<Member>, Vec<String>) {
    let mut found = found.to_vec();
    found.sort_by(|a, b| (a.ip, a.port, &a.host).cmp(&(b.ip, b.port, &b.host)));
    let mut seen = HashSet::new();
    let mut addresses = HashSet::new();
    let mut members = Vec::new();
    let mut refused = Vec::new();
    for f in found {
        let address = SocketAddr::new(f.ip, f.port);
        let name = cfg
            .worker_name
            .replace("{host}", &f.host)
            .replace("{ip}", &f.ip.to_string())
            .replace("{port}", &f.port.to_string());
        let shown = name.escape_debug().to_string();
        let worker = match crate::config::validate_worker_with(
            &name,
            &address.to_string(),
            f.weight,
            f.zone.as_deref(),
            &[],
            |s| s.parse().ok(),
        ) {
            Ok(w) => w,
            Err(e) => {
                refused.push(format!("'{shown}' ({address}): {} {}", e.field, e.message));
                continue;
            }
        };
        if !seen.insert(name) {
            refused.push(format!("'{shown}' ({address}): the name is another record's (add {{ip}} to worker_name)"));
            continue;
        }
        if !addresses.insert(address) {
            refused.push(format!("'{shown}' ({address}): the address is another record's"));
            continue;
        }
        let at_this_gateway = own.iter().any(|o| crate::config::points_at(address, *o));
        members.push(Member { worker, draining: false, at_this_gateway });
    }
    (members, refused)
}

async fn run(pool: Weak<Pool>, fleet: Weak<Fleet>) {
    let Some(pool_name) = pool.upgrade().map(|p| p.name.clone()) else { return };
    let name = task_name(&pool_name);
    let mut running = super::task::Running::new(fleet.clone(), name);
    let mut down_since: Option<Instant> = None;
    let mut refused_before: Vec<String> = Vec::new();
    loop {
        let Some(p) = pool.upgrade() else { return };
        let Some(cfg) = running.current(&p, |m| m.dns().cloned()) else { return };
        let wait = match resolve_workers(&cfg).await {
            Ok(answer) => {
                let own = fleet.upgrade().map(|f| f.own_addrs().to_vec()).unwrap_or_default();
                let (members, mut refused) = members_of(&cfg, &answer.found, &own);
                refused.extend(answer.unresolved.iter().cloned());
                for r in refused.iter().filter(|r| !refused_before.contains(r)) {
                    tracing::warn!(pool = %p.name, record = %r, "DNS record ignored");
                }
                refused_before = refused;
                p.source.rejected.store(refused_before.len() as u64, Relaxed);
                if apply(&p, members).await {
                    p.source.up.store(1, Relaxed);
                    p.source.current_at_ms.store(p.epoch().elapsed().as_millis() as u64, Relaxed);
                    if let Some(since) = down_since.take() {
                        let down_ms = since.elapsed().as_millis() as u64;
                        tracing::info!(pool = %p.name, name = %cfg.name, down_ms, "DNS membership source answers again");
                    }
                }
                answer.ttl.clamp(cfg.ttl_floor, cfg.ttl_ceiling)
            }
            Err(e) => {
                p.source.up.store(0, Relaxed);
                if down_since.is_none() {
                    down_since = Some(Instant::now());
                    p.source.lost.fetch_add(1, Relaxed);
                    tracing::warn!(
                        pool = %p.name,
                        error = %e,
                        workers = p.snapshot().workers().len(),
                        "DNS membership source gave no members: serving the last known ones; asking again"
                    );
                }
                cfg.ttl_floor
            }
        };
        let Some(mut stop) = fleet.upgrade().map(|f| f.shutdown()) else { return };
        let p2 = Arc::clone(&p);
        drop(p);
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            // A reload: ask again at once (the name or the server may be new).
            _ = p2.reconfigured.notified() => {}
            _ = stop.wait_for(|s| *s) => return,
        }
    }
}

/// Applies an answer's members as one snapshot swap (built on the blocking pool); members the
/// table cannot take are refused alone. Whether it applied.
async fn apply(pool: &Arc<Pool>, members: Vec<Member>) -> bool {
    let p = Arc::clone(pool);
    let done = tokio::task::spawn_blocking(move || match p.set_members(&members) {
        Err(MembershipError::TooLarge { .. } | MembershipError::Placement { .. }) => {
            let (members, refused) = p.admissible(members);
            for r in &refused {
                tracing::warn!(pool = %p.name, worker = %r.name, "DNS record refused by the table");
            }
            p.set_members(&members)
        }
        r => r,
    })
    .await;
    match done {
        Ok(Ok(_)) => {
            pool.source.applied.fetch_add(1, Relaxed);
            pool.applied.notify_waiters();
            true
        }
        Ok(Err(e)) => {
            tracing::warn!(pool = %pool.name, error = %e, "membership from DNS refused; keeping the current members");
            false
        }
        Err(_) => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(record: DnsRecord, template: &str) -> DnsConfig {
        DnsConfig {
            name: "_http._tcp.web.test".into(),
            record,
            port: Some(80),
            server: "127.0.0.1:53".parse().expect("addr"),
            ttl_floor: Duration::from_secs(1),
            ttl_ceiling: Duration::from_secs(60),
            timeout: Duration::from_secs(1),
            worker_name: template.into(),
            priority: SrvPriority::Lowest,
        }
    }

    fn found(host: &str, ip: &str, port: u16) -> Found {
        Found { host: host.into(), ip: ip.parse().expect("ip"), port, weight: 1, zone: None }
    }

    #[test]
    fn members_are_named_by_the_template_whatever_the_answer_s_order() {
        let c = cfg(DnsRecord::Srv, "{host}:{port}");
        let a = [found("w2.web.test", "10.0.0.2", 80), found("w1.web.test", "10.0.0.1", 81)];
        let b = [a[1].clone(), a[0].clone()];
        let (ma, ra) = members_of(&c, &a, &[]);
        let (mb, _) = members_of(&c, &b, &[]);
        assert!(ra.is_empty());
        let names = |m: &[Member]| m.iter().map(|m| m.worker.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(&ma), ["w1.web.test:81", "w2.web.test:80"]);
        assert_eq!(names(&ma), names(&mb), "the members are a function of the answer's set");
    }

    #[test]
    fn names_from_dns_are_checked_and_an_address_serves_once() {
        let c = cfg(DnsRecord::Srv, "{host}:{port}");
        let (m, refused) = members_of(
            &c,
            &[
                found("bad\nname.test", "10.0.0.1", 80),
                found("a.test", "10.0.0.2", 80),
                found("b.test", "10.0.0.2", 80),
                found(&"x".repeat(300), "10.0.0.3", 80),
            ],
            &[],
        );
        assert_eq!(m.iter().map(|m| m.worker.name.as_str()).collect::<Vec<_>>(), ["a.test:80"]);
        assert_eq!(refused.len(), 3, "{refused:?}");
        assert!(refused.iter().any(|r| r.contains("another record's")), "{refused:?}");
        assert!(refused.iter().all(|r| !r.contains('\n')), "refusals are logged escaped: {refused:?}");
    }

    #[test]
    fn a_name_two_records_give_is_one_worker_and_the_other_is_said() {
        let c = cfg(DnsRecord::Srv, "{host}");
        let (m, refused) =
            members_of(&c, &[found("w.web.test", "10.0.0.2", 80), found("w.web.test", "10.0.0.1", 80)], &[]);
        assert_eq!(m.len(), 1);
        assert_eq!(m[0].worker.address, "10.0.0.1:80".parse().expect("addr"), "the first in address order");
        assert_eq!(refused.len(), 1);
        assert!(refused[0].contains("{ip}"), "{refused:?}");
    }
}
