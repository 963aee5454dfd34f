//! Self-registration: a worker (or a sidecar for one) keeps its own record alive in etcd, so that
//! it joins and leaves a fleet with no operator.
//!
//! - **Join**: a lease of `ttl` seconds (10 by default) is granted and the record is put with it;
//!   the lease is renewed every `ttl / 3`. A worker killed with `kill -9` stops renewing, and
//!   etcd deletes its record when the lease expires: every gateway drops it within `ttl`.
//! - **Health** (the sidecar, `keyroute register`): while the health check fails, the record is
//!   withdrawn (the lease revoked); when it passes again, the worker registers again.
//! - **Leave** ([`Registrar::leave`], on SIGTERM): the record is marked `draining` first, so
//!   every gateway stops sending new requests (the worker's keys go on along their rankings);
//!   once no request has arrived for a grace period (or a time limit passed), the lease is
//!   revoked, which deletes the record; then the worker may stop.
//!
//! etcd being unreachable is survived: the registrar retries every second, and a record whose
//! lease expired meanwhile is put again with a new lease.

use parking_lot::Mutex;
use std::sync::atomic::{AtomicI64, Ordering::Relaxed};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

use crate::client::EtcdError;
use crate::record::{RecordState, WorkerRecord};
use crate::registry::Registry;

/// The default lease: a dead worker is dropped within this many seconds.
pub const DEFAULT_TTL: u64 = 10;

/// Keeps one worker's record alive. See the [module documentation](self).
#[derive(Debug)]
pub struct Registrar {
    registry: Registry,
    name: String,
    record: Mutex<WorkerRecord>,
    ttl: u64,
    /// The lease the record is put with (0: not registered now).
    lease: AtomicI64,
}

impl Registrar {
    /// A registrar for `name` with this record and lease TTL (seconds, at least 2).
    pub fn new(registry: Registry, name: impl Into<String>, record: WorkerRecord, ttl: u64) -> Registrar {
        Registrar { registry, name: name.into(), record: Mutex::new(record), ttl: ttl.max(2), lease: AtomicI64::new(0) }
    }

    /// The worker's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Whether the record is registered now (as far as this registrar knows).
    pub fn registered(&self) -> bool {
        self.lease.load(Relaxed) != 0
    }

    fn record(&self) -> WorkerRecord {
        self.record.lock().clone()
    }

    async fn register(&self) -> Result<(), EtcdError> {
        let lease = self.registry.client().grant(self.ttl).await?;
        // A put, not an add: a record left by this worker's previous run (killed before its lease
        // expired) is this worker's, and is replaced.
        let key = self.registry.key(&self.name);
        if let Err(e) = self.registry.client().put(&key, &self.record().to_json(), lease).await {
            let _ = self.registry.client().revoke(lease).await;
            return Err(e);
        }
        self.lease.store(lease, Relaxed);
        tracing::info!(worker = %self.name, prefix = %self.registry.prefix(), lease, ttl = self.ttl, "registered");
        Ok(())
    }

    async fn withdraw(&self) -> Result<(), EtcdError> {
        let lease = self.lease.swap(0, Relaxed);
        if lease != 0 {
            self.registry.client().revoke(lease).await?;
            tracing::info!(worker = %self.name, "withdrawn");
        }
        Ok(())
    }

    /// Keeps the record registered while `healthy` says so, until `stop` is set: registers,
    /// renews the lease every `ttl / 3`, registers again when the lease was lost, withdraws
    /// while unhealthy. `healthy` is asked every `check_every` (at most every `ttl / 3`).
    pub async fn keep<F, Fut>(&self, mut healthy: F, check_every: Duration, mut stop: watch::Receiver<bool>)
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let period = Duration::from_millis(self.ttl * 1000 / 3);
        let check_every = check_every.min(period);
        let mut failing = false;
        let mut renewed = Instant::now();
        loop {
            let ok = healthy().await;
            let step = async {
                match (ok, self.lease.load(Relaxed)) {
                    (true, 0) => {
                        self.register().await?;
                        renewed = Instant::now();
                        Ok(())
                    }
                    (true, _) if renewed.elapsed() + check_every / 2 < period => Ok(()),
                    (true, lease) => {
                        match self.registry.client().keep_alive(lease).await? {
                            Some(_) => {}
                            None => {
                                tracing::warn!(worker = %self.name, lease, "lease expired; registering again");
                                self.lease.store(0, Relaxed);
                                self.register().await?;
                            }
                        }
                        renewed = Instant::now();
                        Ok(())
                    }
                    (false, 0) => Ok(()),
                    (false, _) => {
                        tracing::warn!(worker = %self.name, "health check failing; withdrawing the record");
                        self.withdraw().await
                    }
                }
            };
            let wait = match step.await {
                Ok(()) => {
                    if failing {
                        tracing::info!(worker = %self.name, "etcd reachable again");
                        failing = false;
                    }
                    check_every
                }
                Err(e) => {
                    if !failing {
                        tracing::warn!(worker = %self.name, error = %e, "registration: etcd unreachable; retrying");
                        failing = true;
                    }
                    Duration::from_secs(1).min(check_every)
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                _ = crate::stopped(&mut stop) => return,
            }
        }
    }

    /// Leaves the fleet gracefully: marks the record draining, waits until `requests` (a count
    /// of requests served so far) has not moved for `grace`, or `limit` passed, then revokes the
    /// lease (deleting the record). Call it after [`Registrar::keep`] has returned.
    ///
    /// # Errors
    ///
    /// etcd is unreachable when the record is marked or revoked (the lease then expires by
    /// itself within its TTL).
    pub async fn leave(&self, requests: impl Fn() -> u64, grace: Duration, limit: Duration) -> Result<(), EtcdError> {
        self.record.lock().state = RecordState::Draining;
        let lease = self.lease.load(Relaxed);
        if lease == 0 {
            return Ok(());
        }
        let key = self.registry.key(&self.name);
        self.registry.client().put(&key, &self.record().to_json(), lease).await?;
        tracing::info!(worker = %self.name, "draining: waiting for the gateways to stop sending");
        let start = Instant::now();
        let (mut seen, mut since) = (requests(), Instant::now());
        // Keep the lease alive while waiting (a long drain must not expire it).
        let mut renewed = Instant::now();
        while since.elapsed() < grace && start.elapsed() < limit {
            tokio::time::sleep(Duration::from_millis(50)).await;
            let now = requests();
            if now != seen {
                (seen, since) = (now, Instant::now());
            }
            if renewed.elapsed() >= Duration::from_millis(self.ttl * 1000 / 3) {
                let _ = self.registry.client().keep_alive(lease).await;
                renewed = Instant::now();
            }
        }
        tracing::info!(
            worker = %self.name,
            waited_ms = start.elapsed().as_millis() as u64,
            quiet = since.elapsed() >= grace,
            "drained; leaving"
        );
        self.withdraw().await
    }
}
