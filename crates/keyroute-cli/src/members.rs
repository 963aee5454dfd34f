//! `keyroute members`, `keyroute register`, and the registration of `keyroute worker --register`:
//! process glue around the gateway library's etcd registry and registrar.

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use http_body_util::{BodyExt, Empty};
use keyroute_etcd::record::{RecordState, WorkerRecord};
use keyroute_etcd::register::Registrar;
use keyroute_etcd::registry::{ChangeError, Registry};
use keyroute_server::membership::members_of;

use crate::Usage;
use crate::cli::{MembersAction, MembersArgs, RegisterArgs, RegistrationArgs};
use crate::process::{init_logging, runtime, shutdown_signal};

fn registry(url: &str) -> Result<Registry> {
    if url.is_empty() {
        return Err(Usage("--registry etcd://HOST:PORT/PREFIX/ is required".into()).into());
    }
    Registry::from_url(url).map_err(|e| Usage(format!("--registry: {e}")).into())
}

fn resolve(text: &str) -> Option<SocketAddr> {
    text.to_socket_addrs().ok()?.next()
}

/// Validates a record the way every gateway will, so that a command never writes one the
/// gateways would ignore.
fn check_record(registry: &Registry, name: &str, record: &WorkerRecord) -> Result<()> {
    let key = registry.key(name);
    let (_, rejected) = members_of(registry.prefix().as_bytes(), &[(key, record.to_json())], &[], resolve);
    if let Some(r) = rejected.first() {
        return Err(Usage(format!("worker '{name}': {}", r.reason)).into());
    }
    Ok(())
}

fn record(address: String, r: &RegistrationArgs) -> WorkerRecord {
    WorkerRecord { address, weight: i64::from(r.weight), zone: r.zone.clone(), id: r.id, state: RecordState::Active }
}

fn change(result: Result<i64, ChangeError>, what: String) -> Result<()> {
    match result {
        Ok(revision) => {
            println!("{what} (revision {revision})");
            Ok(())
        }
        Err(e @ (ChangeError::Unknown(_) | ChangeError::Exists(_) | ChangeError::Invalid { .. })) => {
            Err(Usage(e.to_string()).into())
        }
        Err(e) => Err(e.into()),
    }
}

/// Refuses an address at which a gateway of the fleet listens (a listener or its admin API): a
/// member there would send requests back into the fleet, or put an admin API behind a public
/// listener. The gateways are those announced on the registry's etcd.
async fn not_a_gateway(registry: &Registry, name: &str, address: &str) -> Result<()> {
    let Some(addr) = resolve(address) else { return Ok(()) };
    let known = keyroute_etcd::gateways::known(registry.client()).await?;
    if let Some((gateway, _)) = known.iter().find(|(_, g)| g.covers(addr)) {
        return Err(Usage(format!(
            "worker '{name}': {address} is an address of gateway {gateway} (a listener or its admin API); a worker there would send requests back into the fleet"
        ))
        .into());
    }
    Ok(())
}

/// The members of a pool in etcd, as a gateway applies them: `(name, weight)` in the gateway's
/// order (by name, numbers as numbers), a draining member at weight 0 (its keys go on along their
/// rankings), invalid records left out.
///
/// # Errors
///
/// A bad URL, or etcd unreachable.
pub fn etcd_members(url: &str) -> Result<Vec<(String, u32)>> {
    let registry = registry(url)?;
    let rt = runtime(Some(1))?;
    let (_, listed) = rt.block_on(registry.list())?;
    let mut members: Vec<(String, u32)> = listed
        .into_iter()
        .filter_map(|l| {
            let r = l.record.ok()?;
            let weight = u32::try_from(r.weight).ok().filter(|&w| w > 0)?;
            Some((l.name, if r.state == RecordState::Draining { 0 } else { weight }))
        })
        .collect();
    members.sort_by(|a, b| keyroute::node::canonical_cmp(&a.0, &b.0));
    Ok(members)
}

/// `keyroute members ...`.
pub fn members(args: &MembersArgs) -> Result<()> {
    let registry = registry(&args.registry)?;
    let rt = runtime(Some(1))?;
    rt.block_on(async {
        match &args.action {
            MembersAction::List { json } => {
                let (revision, listed) = registry.list().await?;
                if *json {
                    let items: Vec<serde_json::Value> = listed
                        .iter()
                        .map(|l| match &l.record {
                            Ok(r) => serde_json::json!({ "name": l.name, "record": r, "lease": l.lease != 0 }),
                            Err(e) => serde_json::json!({ "name": l.name, "invalid": e.to_string() }),
                        })
                        .collect();
                    println!("{}", serde_json::json!({ "revision": revision, "workers": items }));
                } else {
                    println!("{:<20} {:<24} {:>6}  {:<10} {:<9} KEPT BY", "NAME", "ADDRESS", "WEIGHT", "ZONE", "STATE");
                    for l in &listed {
                        match &l.record {
                            Ok(r) => println!(
                                "{:<20} {:<24} {:>6}  {:<10} {:<9} {}",
                                l.name,
                                r.address,
                                r.weight,
                                r.zone.as_deref().unwrap_or("-"),
                                if r.state == RecordState::Draining { "draining" } else { "active" },
                                if l.lease != 0 { "lease" } else { "operator" }
                            ),
                            Err(e) => println!("{:<20} invalid record: {e}", l.name),
                        }
                    }
                    println!("{} record(s) at revision {revision}", listed.len());
                }
                Ok(())
            }
            MembersAction::Add { name, address, weight, zone, id } => {
                let record = WorkerRecord {
                    address: address.clone(),
                    weight: i64::from(*weight),
                    zone: zone.clone(),
                    id: *id,
                    state: RecordState::Active,
                };
                check_record(&registry, name, &record)?;
                not_a_gateway(&registry, name, &record.address).await?;
                change(registry.add(name, &record, 0).await, format!("added {name}"))
            }
            MembersAction::Drain { name } => change(registry.drain(name).await, format!("{name} is draining")),
            MembersAction::Remove { name } => change(registry.remove(name).await, format!("removed {name}")),
            MembersAction::Weight { name, weight } => {
                if *weight == 0 {
                    return Err(Usage("weight: must be at least 1 (drain a worker instead)".into()).into());
                }
                change(registry.set_weight(name, *weight).await, format!("{name} has weight {weight}"))
            }
        }
    })
}

/// The registrar of `keyroute worker --register URL`, for a worker listening at `listen`.
pub fn worker_registrar(url: &str, name: &str, listen: SocketAddr, r: &RegistrationArgs) -> Result<Registrar> {
    let registry = registry(url)?;
    let address = match &r.advertise {
        Some(a) => a.clone(),
        None if listen.ip().is_unspecified() => {
            return Err(Usage(format!(
                "--advertise: the worker listens on {listen}; say which address gateways should connect to"
            ))
            .into());
        }
        None => listen.to_string(),
    };
    let record = record(address, r);
    check_record(&registry, name, &record)?;
    Ok(Registrar::new(registry, name, record, r.ttl))
}

/// `keyroute register`: a sidecar that keeps an HTTP worker registered while it is healthy.
pub fn register(args: &RegisterArgs) -> Result<()> {
    init_logging(&args.log)?;
    let registry = registry(&args.registry)?;
    let health: hyper::Uri = args.health.parse().map_err(|e| Usage(format!("--health: {e}")))?;
    if health.scheme_str() != Some("http") {
        return Err(Usage("--health: an http:// URL".into()).into());
    }
    let record = record(args.address.clone(), &args.registration);
    check_record(&registry, &args.name, &record)?;
    let registrar = Arc::new(Registrar::new(registry, args.name.clone(), record, args.registration.ttl));
    let rt = runtime(Some(1))?;
    let interval = Duration::from_millis(args.interval_ms.max(100));
    let (grace, limit) = (
        Duration::from_millis(args.registration.drain_grace_ms),
        Duration::from_millis(args.registration.drain_timeout_ms),
    );
    rt.block_on(async move {
        let client = hyper_util::client::legacy::Client::builder(hyper_util::rt::TokioExecutor::new())
            .build_http::<Empty<bytes::Bytes>>();
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        let keeper = {
            let registrar = Arc::clone(&registrar);
            tokio::spawn(async move {
                let check = || {
                    let (client, uri) = (client.clone(), health.clone());
                    async move {
                        let probe = async {
                            let resp = client.get(uri).await.ok()?;
                            let ok = resp.status().is_success();
                            let _ = resp.into_body().collect().await;
                            Some(ok)
                        };
                        matches!(tokio::time::timeout(Duration::from_secs(2), probe).await, Ok(Some(true)))
                    }
                };
                registrar.keep(check, interval, stop_rx).await;
            })
        };
        shutdown_signal().await;
        let _ = stop_tx.send(true);
        let _ = keeper.await;
        // The sidecar cannot count the worker's requests: it waits out the grace period once.
        registrar.leave(|| 0, grace, limit).await.context("leaving the registry")?;
        Ok(())
    })
}
