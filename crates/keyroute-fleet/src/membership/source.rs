//! The etcd membership source: one task per etcd-backed pool keeps the pool's members equal to
//! the records under its prefix.
//!
//! 1. **Read** every key under the prefix, and apply them as one snapshot swap.
//! 2. **Watch** the prefix from the read's revision + 1. Changes that arrive within the debounce
//!    (50 ms by default) of the first are applied together: a burst of joins is one new table.
//! 3. On a **compacted** start revision, read again and apply the difference (the snapshot swap
//!    keeps every unchanged worker's state).
//! 4. On **losing etcd** (a failed read, a broken watch, a failed liveness check every 2 s), keep
//!    serving the last applied members, say so (a log line, `keyroute_membership_source_up` 0,
//!    `/readyz`), and reconnect with backoff (100 ms doubling to 1 s); the watch resumes from the
//!    last applied revision + 1, so nothing is missed.
//!
//! After each apply the members are saved to the pool's state file; a gateway started while etcd
//! is down starts from it (see [`super::saved`]).

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::time::Instant;

use super::record::{RecordError, Rejected, members_of};
use super::saved;
use super::task::Running;
use crate::Fleet;
use crate::config::{EtcdConfig, MembershipConfig, resolve};
use crate::pool::{MembershipError, Pool};
use keyroute_etcd::client::{Client, EtcdError, Event, WatchMessage};

/// Between liveness checks of the etcd connection while the watch is quiet.
const LIVENESS: Duration = Duration::from_secs(2);
/// The first and the longest wait before reconnecting.
const BACKOFF: (Duration, Duration) = (Duration::from_millis(100), Duration::from_secs(1));

/// Starts the source task of every etcd-backed pool that has none.
pub(crate) fn spawn_sources(fleet: &Arc<Fleet>) {
    let pools = fleet.pools();
    let mut running = fleet.sources.lock();
    for pool in pools.iter() {
        if running.contains(&pool.name) || !matches!(pool.snapshot().config().membership, MembershipConfig::Etcd(_)) {
            continue;
        }
        running.push(pool.name.clone());
        tokio::spawn(run(Arc::downgrade(pool), Arc::downgrade(fleet)));
    }
}

/// Announces this gateway (its listeners and admin API) on every etcd that one of its pools
/// watches at start-up, so that `keyroute members add` refuses a record at one of its addresses
/// (see [`keyroute_etcd::gateways`]). The record is revoked at shutdown and expires with its
/// lease if the gateway dies.
pub fn announce(fleet: &Fleet) {
    let pools = fleet.pools();
    let mut seen: Vec<Vec<String>> = Vec::new();
    for pool in pools.iter() {
        let snap = pool.snapshot();
        let MembershipConfig::Etcd(cfg) = &snap.config().membership else { continue };
        if seen.contains(&cfg.endpoints) {
            continue;
        }
        seen.push(cfg.endpoints.clone());
        let Ok(client) = Client::new(&cfg.endpoints) else { continue };
        let outbound = client.endpoints().first().and_then(|e| keyroute_etcd::gateways::outbound_ip(e));
        let record = keyroute_etcd::gateways::GatewayRecord::new(fleet.own_addrs(), outbound)
            .with_host_addresses(keyroute_etcd::gateways::host_addresses());
        let admin = fleet.admin_addr();
        let name = std::net::SocketAddr::new(
            outbound.filter(|_| admin.ip().is_unspecified()).unwrap_or(admin.ip()),
            admin.port(),
        );
        tokio::spawn(keyroute_etcd::gateways::announce(client, name.to_string(), record, fleet.shutdown()));
    }
}

/// Applies a pool's saved membership, if it has a state file: what a gateway serves until its
/// first read of etcd, and all it has while etcd is down at start-up.
pub fn start_from_saved(pool: &Pool, own: &[std::net::SocketAddr]) {
    let snap = pool.snapshot();
    let MembershipConfig::Etcd(cfg) = &snap.config().membership else { return };
    let Some(path) = &cfg.state_file else { return };
    match saved::load(path, &cfg.prefix) {
        Ok(None) => {}
        Ok(Some((revision, records))) => {
            let (members, rejected) = members_of(cfg.prefix.as_bytes(), &records, own, resolve);
            let (members, refused) = pool.admissible(members);
            let rejected = rejected.len() + refused.len();
            match pool.set_members(&members) {
                Ok(_) => tracing::info!(
                    pool = %pool.name,
                    file = %path.display(),
                    revision,
                    workers = members.len(),
                    ignored = rejected,
                    "starting from the saved membership"
                ),
                Err(e) => tracing::warn!(pool = %pool.name, error = %e, "the saved membership was refused"),
            }
        }
        Err(e) => {
            tracing::warn!(pool = %pool.name, file = %path.display(), error = %e, "could not read the saved membership")
        }
    }
}

/// The records as last read and watched.
#[derive(Debug, Default)]
struct Records {
    /// Key -> value, for the current prefix.
    kvs: BTreeMap<Vec<u8>, Vec<u8>>,
    /// The revision they are current at (0: never read).
    revision: i64,
    /// Rejections already logged (key and reason), so that a change logs only new ones.
    logged: HashSet<(String, RecordError)>,
}

/// How a session with etcd ended.
enum Ended {
    /// The watch's start revision was compacted: read again, now.
    Compacted,
    /// The store's revision is behind the one applied (a new cluster): read again, now.
    Behind,
    /// The pool's source changed (a reload): start over with the new settings.
    Reconfigured,
    /// etcd was lost.
    Lost(EtcdError),
    /// The pool or the gateway is gone.
    Gone,
}

async fn run(pool: Weak<Pool>, fleet: Weak<Fleet>) {
    let mut records = Records::default();
    let mut current: Option<EtcdConfig> = None;
    let mut backoff = BACKOFF.0;
    let mut down_since: Option<Instant> = None;
    let Some(name) = pool.upgrade().map(|p| p.name.clone()) else { return };
    // However this task ends, a pool of the same name may get a task of its own again.
    let mut running = Running::new(fleet.clone(), name.clone());
    loop {
        let Some(p) = pool.upgrade() else { return };
        let Some(cfg) = running.current(&p, |m| m.etcd().cloned()) else { return };
        if current.as_ref().is_none_or(|c| c.prefix != cfg.prefix) {
            // A new prefix: nothing read so far counts.
            records = Records::default();
        }
        current = Some(cfg.clone());
        let client = match Client::new(&cfg.endpoints) {
            Ok(c) => c,
            Err(e) => {
                // Validated configurations never get here.
                tracing::error!(pool = %name, error = %e, "membership source: bad endpoints");
                return;
            }
        };
        let ended = session(&p, &fleet, &cfg, &client, &mut records, &mut down_since, &mut backoff).await;
        match ended {
            Ended::Gone => return,
            // The pool's members may be another source's now (a switch to static and back):
            // read the prefix again and apply it, rather than wait for a change to apply.
            Ended::Reconfigured => records.revision = 0,
            Ended::Compacted => {
                p.source.compactions.fetch_add(1, Relaxed);
                tracing::info!(pool = %name, "membership source: watch revision compacted; reading the prefix again");
                records.revision = 0;
            }
            Ended::Behind => records.revision = 0,
            Ended::Lost(e) => {
                p.source.up.store(0, Relaxed);
                if down_since.is_none() {
                    p.source.lost.fetch_add(1, Relaxed);
                    down_since = Some(Instant::now());
                    tracing::warn!(
                        pool = %name,
                        error = %e,
                        workers = p.snapshot().workers().len(),
                        revision = records.revision,
                        "membership source lost: serving the last known members; reconnecting"
                    );
                }
                let mut rx = match fleet.upgrade() {
                    Some(f) => f.shutdown(),
                    None => return,
                };
                drop(p);
                tokio::select! {
                    _ = tokio::time::sleep(backoff) => {}
                    _ = stopped(&mut rx) => return,
                }
                backoff = (backoff * 2).min(BACKOFF.1);
            }
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn session(
    pool: &Arc<Pool>,
    fleet: &Weak<Fleet>,
    cfg: &EtcdConfig,
    client: &Client,
    records: &mut Records,
    down_since: &mut Option<Instant>,
    backoff: &mut Duration,
) -> Ended {
    let prefix = cfg.prefix.as_bytes();
    let Some(mut shutdown) = fleet.upgrade().map(|f| f.shutdown()) else { return Ended::Gone };
    if records.revision == 0 {
        let range = match client.range_prefix(prefix).await {
            Ok(r) => r,
            Err(e) => return Ended::Lost(e),
        };
        records.kvs = range.kvs.into_iter().map(|kv| (kv.key, kv.value)).collect();
        records.revision = range.revision;
        apply(pool, fleet, cfg, records).await;
    }
    let mut watch = match client.watch(prefix, records.revision + 1).await {
        Ok(w) => w,
        Err(EtcdError::Compacted(_)) => return Ended::Compacted,
        Err(e) => return Ended::Lost(e),
    };
    mark_up(pool, down_since, backoff, records.revision);
    let mut pending: Option<Instant> = None;
    let mut liveness = tokio::time::interval_at(Instant::now() + LIVENESS, LIVENESS);
    loop {
        tokio::select! {
            msg = watch.next() => match msg {
                Ok(WatchMessage::Created { .. } | WatchMessage::Progress { .. }) => touch(pool),
                Ok(WatchMessage::Events(events)) => {
                    touch(pool);
                    for e in events {
                        records.revision = records.revision.max(e.revision());
                        match e {
                            Event::Put(kv) => {
                                records.kvs.insert(kv.key, kv.value);
                            }
                            Event::Delete { key, .. } => {
                                records.kvs.remove(&key);
                            }
                        }
                    }
                    // The first change of a burst starts the debounce; later ones join it.
                    pending.get_or_insert_with(|| Instant::now() + cfg.debounce);
                }
                Ok(WatchMessage::Compacted { .. }) => return Ended::Compacted,
                Err(e) => {
                    // Apply what arrived before the stream broke: it is committed in etcd.
                    if pending.is_some() {
                        apply(pool, fleet, cfg, records).await;
                    }
                    return Ended::Lost(e);
                }
            },
            _ = sleep_until(pending) => {
                pending = None;
                apply(pool, fleet, cfg, records).await;
            }
            _ = liveness.tick() => {
                // A watch on a quiet prefix says nothing; a connection to an etcd that vanished
                // (a partition, a host gone) would say nothing either. Ask.
                match client.revision(prefix).await {
                    // Behind what was applied: a new etcd cluster (restored or rebuilt), whose
                    // revisions start again. Nothing watched from here would ever arrive.
                    Ok(r) if r < records.revision => {
                        tracing::warn!(pool = %pool.name, store = r, applied = records.revision, "etcd's revision went back; reading the prefix again");
                        return Ended::Behind;
                    }
                    Ok(_) => touch(pool),
                    Err(e) => return Ended::Lost(e),
                }
            }
            _ = pool.reconfigured.notified() => return Ended::Reconfigured,
            _ = stopped(&mut shutdown) => return Ended::Gone,
        }
    }
}

/// The table's reason for a refused member, without the pool's name (the log line has it).
fn table_reason(e: &MembershipError) -> String {
    match e {
        MembershipError::TooLarge { source, .. } => source.to_string(),
        MembershipError::Placement { source, .. } => source.to_string(),
        other => other.to_string(),
    }
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

fn touch(pool: &Pool) {
    pool.source.current_at_ms.store(pool.epoch().elapsed().as_millis() as u64, Relaxed);
}

fn mark_up(pool: &Pool, down_since: &mut Option<Instant>, backoff: &mut Duration, revision: i64) {
    pool.source.up.store(1, Relaxed);
    touch(pool);
    *backoff = BACKOFF.0;
    if let Some(since) = down_since.take() {
        tracing::info!(
            pool = %pool.name,
            revision,
            down_ms = since.elapsed().as_millis() as u64,
            "membership source back"
        );
    }
}

/// Applies the records to the pool as one snapshot swap (built on the blocking pool), logs the
/// records rejected for the first time, and saves the members.
async fn apply(pool: &Arc<Pool>, fleet: &Weak<Fleet>, cfg: &EtcdConfig, records: &mut Records) {
    let own = match fleet.upgrade() {
        Some(f) => f.own_addrs().to_vec(),
        None => return,
    };
    let kvs: Vec<(Vec<u8>, Vec<u8>)> = records.kvs.iter().map(|(k, v)| (k.clone(), v.clone())).collect();
    let (p, prefix, state_file, revision) =
        (Arc::clone(pool), cfg.prefix.clone(), cfg.state_file.clone(), records.revision);
    let done = tokio::task::spawn_blocking(move || {
        let (members, mut rejected) = members_of(prefix.as_bytes(), &kvs, &own, resolve);
        // Before the swap: whoever sees the new members sees their rejections too.
        p.source.rejected.store(rejected.len() as u64, Relaxed);
        let mut count = members.len();
        let applied = match p.set_members(&members) {
            // A record the table cannot take is refused alone, and the rest applies (the set is
            // built whole first: the common case builds one table).
            Err(MembershipError::TooLarge { .. } | MembershipError::Placement { .. }) => {
                let (members, refused) = p.admissible(members);
                rejected.extend(refused.into_iter().map(|r| Rejected {
                    key: format!("{prefix}{}", r.name),
                    reason: RecordError::Table { with_others: r.with_others, reason: table_reason(&r.error) },
                }));
                rejected.sort_by(|a, b| a.key.cmp(&b.key));
                p.source.rejected.store(rejected.len() as u64, Relaxed);
                count = members.len();
                p.set_members(&members).map(|g| (g, members))
            }
            r => r.map(|g| (g, members)),
        };
        let applied = match applied {
            Ok((generation, members)) => {
                if let Some(path) = &state_file
                    && let Err(e) = saved::save(path, &p.name, &prefix, revision, &members)
                {
                    tracing::warn!(pool = %p.name, file = %path.display(), error = %e, "could not save the membership");
                }
                Ok(generation)
            }
            Err(e) => Err(e),
        };
        (applied, rejected, count)
    })
    .await;
    let Ok((applied, rejected, count)) = done else { return };
    let logged: HashSet<(String, RecordError)> = rejected.iter().map(|r| (r.key.clone(), r.reason.clone())).collect();
    for r in &rejected {
        if !records.logged.contains(&(r.key.clone(), r.reason.clone())) {
            tracing::warn!(pool = %pool.name, key = %r.key, reason = %r.reason, "membership record ignored");
        }
    }
    records.logged = logged;
    match applied {
        Ok(generation) => {
            pool.source.revision.store(revision.max(0) as u64, Relaxed);
            pool.applied.notify_waiters();
            pool.source.applied.fetch_add(1, Relaxed);
            tracing::debug!(pool = %pool.name, revision, generation, workers = count, "membership applied");
        }
        Err(e) => {
            tracing::warn!(pool = %pool.name, revision, error = %e, "membership from etcd refused; keeping the current members")
        }
    }
}

/// Until `rx` says stop.
async fn stopped(rx: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|stop| *stop).await;
}
