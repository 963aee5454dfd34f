//! `keyroute move`: the moving of data that the ring only describes.
//!
//! A change of a pool's members changes the owner of some keys: with consistent hashing, about
//! the share of the servers that changed (a fifth of the keys when a fifth server joins four). A
//! cache refills by itself; a store loses those keys unless someone copies them. This module
//! copies them: every key on a server of the old member set whose owner in the new set is another
//! server goes to that server, and to no other.
//!
//! # The order of operations, and why writes are not lost
//!
//! The proxies switch first (a reload, an admin call or etcd), then the keys move: *the new owner
//! first, with read-through to the old*.
//!
//! - **Redis.** Each key moves with `MIGRATE` run on its old server, which is atomic there: the
//!   old server sends the key, the new one restores it, and only then does the old one delete it.
//!   `MIGRATE` never replaces (no `REPLACE`): a key the new owner already has was written there
//!   through the proxies after they switched, and is newer; the old copy is then deleted
//!   (`superseded`). With `[pool.handoff]` on the pool, the proxies' Redis listener does the same
//!   for any command on a key that moved to a server that joined within the window: it migrates
//!   the key first, then runs the command on the new owner. So a read never misses a key that
//!   has not moved yet, a partial write (`HSET`, `INCR`, `LPUSH`) never starts from nothing, and
//!   a deleted key cannot come back, since the proxies and this command move each key with the
//!   same atomic operation, whichever comes first. Keep the window longer than the move takes:
//!   the plan gives the time at the chosen rate.
//! - **memcached.** Each key is read with `mg` on its old server (value, flags and remaining
//!   TTL), added on the new one with `ms ... ME` (add mode: a value written since through the
//!   proxies is never overwritten), and deleted on the old one (`md`) once the new one answered.
//!   memcached has no atomic move: a key deleted through the proxies between the read and the
//!   add can come back until its TTL ends, which a cache tolerates (with `[pool.handoff]`, the
//!   memcached listener's writes also delete the old copy, which closes most of that window).
//!
//! The move refuses to start until the proxies use the new table (the CLI asks their admin APIs),
//! so that nothing is written to an old owner after its copy went.
//!
//! # What it guarantees
//!
//! - **Exactly the plan.** The dry run ([`plan`]) scans the same servers with the same tables and
//!   counts keys and bytes per pair of servers; a move over a still keyspace moves those keys.
//! - **Verified.** Each batch is checked on the new owner (`EXISTS`, `mn` after the adds) before
//!   the old copy goes; at the end, every old server is scanned again and the keys still on a
//!   server that does not own them are counted (`misplaced`, 0 on success).
//! - **Rate-limited** (keys per second), **resumable** (a state file records each server's scan
//!   cursor and counts after every batch; a second run with the same file and member sets goes
//!   on where the first stopped; a key moved is gone from its old server, so running again is
//!   always safe).
//!
//! Cost: one scan of every old server (two with the verification), and for each key that moves
//! one batched `MIGRATE` (Redis) or three pipelined commands (memcached).

mod memcached;
mod redis;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use keyroute::{Policy, Strategy};
use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use keyroute_fleet::config::{MembershipConfig, PoolConfig};

use crate::config::{CacheListener, CacheProtocol};

/// Why a move cannot go on.
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    /// The configurations do not describe a move.
    #[error("{0}")]
    Setup(String),
    /// A server could not be reached or answered what it should not.
    #[error("server {server}: {message}")]
    Server {
        /// The server's address.
        server: SocketAddr,
        /// What happened.
        message: String,
    },
    /// The state file cannot be read or written, or is another move's.
    #[error("state file {path}: {message}")]
    State {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        message: String,
    },
}

fn server_error(server: SocketAddr, message: impl Into<String>) -> MoveError {
    MoveError::Server { server, message: message.into() }
}

/// A pool's placement over one member set: its table, and each member's address.
#[derive(Debug)]
pub struct Layout {
    pool: String,
    policy: Policy,
    names: Vec<String>,
    addrs: Vec<SocketAddr>,
}

impl Layout {
    /// The layout of `pool` among `pools` (a configuration's), as the server builds it (the same
    /// canonical order, so the same owner for every key).
    ///
    /// # Errors
    ///
    /// No such pool, a pool whose members come from etcd (give the member set in a file), or a
    /// strategy that does not place by key.
    pub fn of(pools: &[PoolConfig], pool: &str) -> Result<Layout, MoveError> {
        let p = pools
            .iter()
            .find(|p| p.name == pool)
            .ok_or_else(|| MoveError::Setup(format!("no pool named '{}'", pool.escape_debug())))?;
        Layout::of_pool(p)
    }

    fn of_pool(p: &PoolConfig) -> Result<Layout, MoveError> {
        if p.membership != MembershipConfig::Static {
            return Err(MoveError::Setup(format!(
                "pool '{}' takes its members from etcd: write the member sets before and after the change as [[pool.worker]] lists",
                p.name
            )));
        }
        let mut workers: Vec<_> = p.workers.iter().collect();
        if !matches!(p.strategy, Strategy::Compat(_)) {
            workers.sort_by(|a, b| keyroute::node::canonical_cmp(&a.name, &b.name));
        }
        let nodes = keyroute_fleet::table::node_set(
            workers.iter().map(|w| (w.name.as_str(), w.weight, w.zone.as_deref(), w.id)),
        )
        .map_err(|e| MoveError::Setup(format!("pool '{}': {e}", p.name)))?;
        let policy = Policy::build(p.strategy, nodes, &p.options)
            .map_err(|e| MoveError::Setup(format!("pool '{}': {e}", p.name)))?;
        if policy.table().is_none() {
            return Err(MoveError::Setup(format!(
                "pool '{}': strategy '{}' does not place keys on owners, so there is nothing to move",
                p.name,
                p.strategy.name()
            )));
        }
        Ok(Layout {
            pool: p.name.clone(),
            policy,
            names: workers.iter().map(|w| w.name.clone()).collect(),
            addrs: workers.iter().map(|w| w.address).collect(),
        })
    }

    /// The address of `key`'s owner, the key placed as `store`'s listener places it.
    fn owner(&self, store: &Store, key: &[u8]) -> Option<SocketAddr> {
        let placed = match store {
            Store::Redis { .. } => crate::redis::placed_part(self.policy.strategy(), key),
            Store::Memcached => key,
        };
        let i = self.policy.owner(self.policy.key_hash(placed))?;
        self.addrs.get(i).copied()
    }

    /// The servers, each once, in the layout's order.
    fn servers(&self) -> Vec<SocketAddr> {
        let mut out: Vec<SocketAddr> = Vec::new();
        for a in &self.addrs {
            if !out.contains(a) {
                out.push(*a);
            }
        }
        out
    }

    /// The member names (in the table's order).
    pub fn names(&self) -> &[String] {
        &self.names
    }

    /// What identifies this member set in a state file.
    fn fingerprint(&self) -> String {
        let nodes = self.policy.nodes();
        let mut parts: Vec<String> = (0..nodes.len())
            .filter_map(|i| nodes.get(i).map(|n| format!("{}={}*{}", n.name(), self.addrs[i], n.weight())))
            .collect();
        parts.push(format!("strategy={}", self.policy.strategy().name()));
        parts.join(",")
    }
}

/// The store behind a pool, and how to reach its servers.
#[derive(Clone, Debug)]
pub enum Store {
    /// Standalone Redis servers (the password, if they need one).
    Redis {
        /// Given with `AUTH` on every connection, and to `MIGRATE`.
        password: Option<String>,
    },
    /// memcached servers.
    Memcached,
}

impl Store {
    /// The store of the cache listener (among a configuration's `listeners`) that serves `pool`.
    ///
    /// # Errors
    ///
    /// No cache listener serves the pool.
    pub fn of<'a>(listeners: impl IntoIterator<Item = &'a CacheListener>, pool: &str) -> Result<Store, MoveError> {
        let listener = listeners.into_iter().find(|c| c.pool == pool);
        match listener {
            Some(c) if c.protocol == CacheProtocol::Redis => Ok(Store::Redis { password: c.server_password.clone() }),
            Some(_) => Ok(Store::Memcached),
            None => Err(MoveError::Setup(format!(
                "no listener with protocol = \"memcached\" or \"redis\" serves pool '{}': there is no store to move",
                pool.escape_debug()
            ))),
        }
    }
}

/// How a move runs.
#[derive(Clone, Debug)]
pub struct Options {
    /// Keys per scan step and per `MIGRATE`.
    pub batch: usize,
    /// At most this many keys moved per second (none: as fast as the servers go).
    pub rate: Option<u32>,
    /// Stop after moving this many keys (a step of a larger move; run again to go on).
    pub max_keys: Option<u64>,
    /// Where the progress is kept, for a resumed run.
    pub state: Option<PathBuf>,
    /// Each exchange with a server.
    pub timeout: Duration,
}

impl Default for Options {
    fn default() -> Self {
        Options { batch: 500, rate: None, max_keys: None, state: None, timeout: Duration::from_secs(10) }
    }
}

/// The keys (and their bytes) that go from one server to another.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Pair {
    /// The old owner's address.
    pub from: String,
    /// The new owner's address.
    pub to: String,
    /// Keys.
    pub keys: u64,
    /// Bytes (Redis: `MEMORY USAGE`; memcached: the item's size), in the plan only.
    pub bytes: u64,
}

/// What a move would do: the dry run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Plan {
    /// Keys found on the old servers.
    pub scanned: u64,
    /// Of those, keys that stay where they are.
    pub stay: u64,
    /// The keys that move, per pair of servers (sorted).
    pub pairs: Vec<Pair>,
}

impl Plan {
    /// Keys that move.
    pub fn keys(&self) -> u64 {
        self.pairs.iter().map(|p| p.keys).sum()
    }

    /// Bytes that move.
    pub fn bytes(&self) -> u64 {
        self.pairs.iter().map(|p| p.bytes).sum()
    }
}

/// What a move did.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Report {
    /// Keys moved, per pair of servers (sorted; `bytes` is 0).
    pub pairs: Vec<Pair>,
    /// Keys the new owner already had (written there since the switch): the old copy deleted.
    pub superseded: u64,
    /// Keys gone from the old server between the scan and their move (expired or deleted).
    pub vanished: u64,
    /// Keys that could not be moved (left on the old server, counted and named in the log).
    pub failed: u64,
    /// After the move: keys still on a server that does not own them (0 on success; not counted
    /// when the run stopped early).
    pub misplaced: u64,
    /// The run moved everything it found (it was not stopped by `max_keys`).
    pub complete: bool,
    /// Seconds this run took.
    pub seconds: f64,
}

impl Report {
    /// Keys moved.
    pub fn moved(&self) -> u64 {
        self.pairs.iter().map(|p| p.keys).sum()
    }
}

/// The progress kept in the state file.
#[derive(Debug, Default, Serialize, Deserialize)]
struct Progress {
    from: String,
    to: String,
    /// Per old server: where its scan is, and whether it is done.
    servers: BTreeMap<String, ServerProgress>,
    report: Report,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
struct ServerProgress {
    cursor: u64,
    done: bool,
}

impl Progress {
    fn load(path: &PathBuf, from: &str, to: &str) -> Result<Progress, MoveError> {
        let state = |message: String| MoveError::State { path: path.clone(), message };
        match std::fs::read(path) {
            Ok(bytes) => {
                let p: Progress =
                    serde_json::from_slice(&bytes).map_err(|e| state(format!("not a move's state: {e}")))?;
                if p.from != from || p.to != to {
                    return Err(state(
                        "it records a move between other member sets (give another file, or remove it)".into(),
                    ));
                }
                Ok(p)
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Ok(Progress { from: from.to_owned(), to: to.to_owned(), ..Progress::default() })
            }
            Err(e) => Err(state(format!("cannot read: {e}"))),
        }
    }

    /// Written whole, then renamed over the old file: a crash leaves one or the other.
    fn save(&self, path: &PathBuf) -> Result<(), MoveError> {
        let state = |message: String| MoveError::State { path: path.clone(), message };
        let tmp = path.with_extension("tmp");
        let bytes = serde_json::to_vec_pretty(self).map_err(|e| state(e.to_string()))?;
        std::fs::write(&tmp, bytes).map_err(|e| state(format!("cannot write: {e}")))?;
        std::fs::rename(&tmp, path).map_err(|e| state(format!("cannot write: {e}")))
    }
}

/// A key found on a server, with its size when the scan gives one.
pub(crate) struct Found {
    pub(crate) key: Vec<u8>,
    pub(crate) bytes: u64,
}

/// What one batch of keys sent from one server to another came to.
#[derive(Default)]
pub(crate) struct Outcome {
    pub(crate) moved: u64,
    pub(crate) superseded: u64,
    pub(crate) vanished: u64,
    pub(crate) failed: u64,
}

/// Adds `keys` (and `bytes`) to the pair `from -> to`.
fn add_pair(pairs: &mut Vec<Pair>, from: SocketAddr, to: SocketAddr, keys: u64, bytes: u64) {
    let (from, to) = (from.to_string(), to.to_string());
    match pairs.iter_mut().find(|p| p.from == from && p.to == to) {
        Some(p) => {
            p.keys += keys;
            p.bytes += bytes;
        }
        None => pairs.push(Pair { from, to, keys, bytes }),
    }
    pairs.sort_by(|a, b| (&a.from, &a.to).cmp(&(&b.from, &b.to)));
}

/// Checks that the two layouts are of one pool and the same placement.
fn check(from: &Layout, to: &Layout) -> Result<(), MoveError> {
    if from.pool != to.pool {
        return Err(MoveError::Setup(format!("the pools differ: '{}' and '{}'", from.pool, to.pool)));
    }
    if from.policy.strategy() != to.policy.strategy() || from.policy.options() != to.policy.options() {
        return Err(MoveError::Setup(format!(
            "pool '{}': the strategy or its options differ between the two files; a move changes members only",
            from.pool
        )));
    }
    Ok(())
}

/// The dry run: scans every old server and counts, per pair of servers, the keys (and bytes)
/// whose owner in `to` is another server. Nothing is written.
///
/// # Errors
///
/// A server cannot be reached or scanned.
pub async fn plan(store: &Store, from: &Layout, to: &Layout, options: &Options) -> Result<Plan, MoveError> {
    check(from, to)?;
    let mut plan = Plan::default();
    for server in from.servers() {
        let mut scan = Scanner::open(store, server, options, 0, true).await?;
        while let Some(found) = scan.next().await? {
            for f in found {
                plan.scanned += 1;
                match to.owner(store, &f.key) {
                    Some(owner) if owner != server => add_pair(&mut plan.pairs, server, owner, 1, f.bytes),
                    _ => plan.stay += 1,
                }
            }
        }
    }
    Ok(plan)
}

/// Moves every key whose owner in `to` is another server than the one it is on, batch by batch,
/// at the options' rate; `progress` is called after each batch with the report so far.
///
/// # Errors
///
/// A server cannot be reached, or the state file cannot be used. What was moved stays moved, and
/// the state file records it.
pub async fn run(
    store: &Store,
    from: &Layout,
    to: &Layout,
    options: &Options,
    mut progress: impl FnMut(&Report),
) -> Result<Report, MoveError> {
    check(from, to)?;
    let started = Instant::now();
    let mut state = match &options.state {
        Some(path) => Progress::load(path, &from.fingerprint(), &to.fingerprint())?,
        None => Progress::default(),
    };
    let before = state.report.moved();
    let prior_seconds = state.report.seconds;
    'servers: for server in from.servers() {
        let key = server.to_string();
        let at = state.servers.get(&key).cloned().unwrap_or_default();
        if at.done {
            continue;
        }
        let mut scan = Scanner::open(store, server, options, at.cursor, false).await?;
        let mut mover = Mover::open(store, server, options).await?;
        while let Some(found) = scan.next().await? {
            let mut by_owner: BTreeMap<SocketAddr, Vec<Vec<u8>>> = BTreeMap::new();
            for f in found {
                if let Some(owner) = to.owner(store, &f.key)
                    && owner != server
                {
                    by_owner.entry(owner).or_default().push(f.key);
                }
            }
            for (owner, keys) in by_owner {
                let outcome = mover.send(owner, &keys).await?;
                add_pair(&mut state.report.pairs, server, owner, outcome.moved, 0);
                state.report.superseded += outcome.superseded;
                state.report.vanished += outcome.vanished;
                state.report.failed += outcome.failed;
            }
            let moved = state.report.moved() - before;
            state.servers.insert(key.clone(), ServerProgress { cursor: scan.cursor(), done: scan.finished() });
            state.report.seconds = prior_seconds + started.elapsed().as_secs_f64();
            if let Some(path) = &options.state {
                state.save(path)?;
            }
            progress(&state.report);
            if let Some(rate) = options.rate.filter(|&r| r > 0) {
                let due = Duration::from_secs_f64(moved as f64 / f64::from(rate));
                tokio::time::sleep_until(started + due).await;
            }
            if options.max_keys.is_some_and(|m| moved >= m) {
                break 'servers;
            }
        }
        state.servers.insert(key, ServerProgress { cursor: 0, done: true });
    }
    let limited = !from.servers().iter().all(|s| state.servers.get(&s.to_string()).is_some_and(|p| p.done));
    if !limited {
        // Verification: every old server scanned again for keys it does not own.
        let mut misplaced = 0;
        for server in from.servers() {
            let mut scan = Scanner::open(store, server, options, 0, false).await?;
            while let Some(found) = scan.next().await? {
                misplaced +=
                    found.iter().filter(|f| to.owner(store, &f.key).is_some_and(|o| o != server)).count() as u64;
            }
        }
        state.report.misplaced = misplaced;
    }
    state.report.complete = !limited;
    state.report.seconds = prior_seconds + started.elapsed().as_secs_f64();
    if let Some(path) = &options.state {
        state.save(path)?;
    }
    Ok(state.report)
}

/// The keys of one server, a batch at a time.
enum Scanner {
    Redis(redis::Scan),
    Memcached(memcached::Dump),
}

impl Scanner {
    async fn open(
        store: &Store,
        server: SocketAddr,
        options: &Options,
        cursor: u64,
        sizes: bool,
    ) -> Result<Scanner, MoveError> {
        Ok(match store {
            Store::Redis { password } => {
                Scanner::Redis(redis::Scan::open(server, password.as_deref(), options, cursor, sizes).await?)
            }
            Store::Memcached => Scanner::Memcached(memcached::Dump::open(server, options).await?),
        })
    }

    async fn next(&mut self) -> Result<Option<Vec<Found>>, MoveError> {
        match self {
            Scanner::Redis(s) => s.next().await,
            Scanner::Memcached(d) => Ok(d.next()),
        }
    }

    /// Where a resumed scan starts (memcached's dump has no cursor: a resumed run dumps again, and
    /// the keys moved are no longer there).
    fn cursor(&self) -> u64 {
        match self {
            Scanner::Redis(s) => s.cursor(),
            Scanner::Memcached(_) => 0,
        }
    }

    fn finished(&self) -> bool {
        match self {
            Scanner::Redis(s) => s.finished(),
            Scanner::Memcached(d) => d.finished(),
        }
    }
}

/// Sends keys from one server to their new owners.
enum Mover {
    Redis(redis::Migrate),
    Memcached(memcached::Copy),
}

impl Mover {
    async fn open(store: &Store, server: SocketAddr, options: &Options) -> Result<Mover, MoveError> {
        Ok(match store {
            Store::Redis { password } => Mover::Redis(redis::Migrate::open(server, password.clone(), options).await?),
            Store::Memcached => Mover::Memcached(memcached::Copy::open(server, options).await?),
        })
    }

    async fn send(&mut self, to: SocketAddr, keys: &[Vec<u8>]) -> Result<Outcome, MoveError> {
        match self {
            Mover::Redis(m) => m.send(to, keys).await,
            Mover::Memcached(c) => c.send(to, keys).await,
        }
    }
}
