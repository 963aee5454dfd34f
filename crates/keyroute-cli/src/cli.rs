//! The command line: raw flags as clap parses them, validated into the library's types before use.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use keyroute::hash::KeyHasher;
use keyroute::{NodeSet, Options, RingScheme, Strategy};

use crate::Usage;

/// Which of N nodes gets this key: placement, simulation, a gateway, thumbnail workers, a demo.
#[derive(Debug, Parser)]
#[command(name = "keyroute", version, about, long_about = None, propagate_version = true)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Where each key goes: one line per key, `KEY<TAB>NODE` (then a tab and each further replica).
    Place(PlaceArgs),
    /// The slot moves between two node sets: one line per slot, `SLOT<TAB>FROM<TAB>TO`.
    SlotPlan(SlotPlanArgs),
    /// Redis Cluster keyslots, exactly as Redis computes them: `KEY<TAB>SLOT`, and with --masters
    /// the master `redis-cli --cluster create` gave the slot.
    Slot(SlotArgs),
    /// Simulations: what moves, what balances, what a fleet does under each strategy.
    #[command(subcommand)]
    Sim(SimCommand),
    /// Run the gateway: an HTTP reverse proxy that places requests on workers by key.
    Serve(ServeArgs),
    /// Run a thumbnail worker: resizes images and caches them on local disk.
    Worker(WorkerArgs),
    /// Members of an etcd-backed pool: list, add, drain, remove, reweight (every gateway applies it).
    Members(MembersArgs),
    /// Keep an HTTP worker registered in etcd while its health URL answers 2xx (a sidecar).
    Register(RegisterArgs),
    /// The thumbnail service on this machine: 8 workers and the gateway, each strategy in turn.
    Demo(DemoArgs),
    /// Convert a nutcracker (twemproxy) configuration to keyroute's: each pool becomes a memcached
    /// (or, with redis: true, Redis) listener and a pool placed as nutcracker places it (no key
    /// moves). TOML on stdout.
    FromNutcracker(FromNutcrackerArgs),
    /// Move a store's keys after a membership change: every key on an old server whose owner in
    /// the new member set is another server goes there (Redis: MIGRATE; memcached: mg, ms, md).
    /// --dry-run prints the plan (keys and bytes per pair of servers).
    Move(MoveArgs),
}

#[derive(Debug, Args)]
pub struct MoveArgs {
    /// The configuration before the change (its pool's [[pool.worker]] list is the old member set).
    #[arg(long)]
    pub from: PathBuf,
    /// The configuration after the change (the new member set; the same pool and strategy).
    #[arg(long)]
    pub to: PathBuf,
    /// The pool (may be omitted when the file has one).
    #[arg(long)]
    pub pool: Option<String>,
    /// Print the plan and write nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// At most this many keys moved per second.
    #[arg(long)]
    pub rate: Option<u32>,
    /// Keys per scan step and per MIGRATE.
    #[arg(long, default_value_t = 500)]
    pub batch: usize,
    /// Stop after moving this many keys (run again, with the same --state, to go on).
    #[arg(long)]
    pub max_keys: Option<u64>,
    /// Keep the progress in this file after each batch; a run given the same file resumes.
    #[arg(long)]
    pub state: Option<PathBuf>,
    /// A proxy's admin API (host:port; repeat for each proxy): the move starts only when each
    /// uses the new member set for the pool.
    #[arg(long = "admin", value_name = "ADDRESS")]
    pub admins: Vec<String>,
    /// The admin APIs' bearer token.
    #[arg(long)]
    pub admin_token: Option<String>,
    /// Start without asking the proxies (you have checked that every one uses the new members).
    #[arg(long, conflicts_with = "admins")]
    pub proxies_switched: bool,
    /// Seconds each exchange with a server may take.
    #[arg(long, default_value_t = 10.0)]
    pub timeout: f64,
    /// JSON on stdout (the plan, or the report).
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FromNutcrackerArgs {
    /// The nutcracker YAML file.
    pub file: PathBuf,
    /// The admin API's address in the configuration made.
    #[arg(long, default_value = "127.0.0.1:9901")]
    pub admin: std::net::SocketAddr,
}

#[derive(Debug, Args)]
pub struct DemoArgs {
    /// A short run (about 20 s): the steady scenario for every strategy and the killed worker for two.
    #[arg(long)]
    pub quick: bool,
    /// Seconds of load per strategy and scenario (default 4, or 1.5 with --quick; the hot scenarios
    /// 9 and double-fleet 10).
    #[arg(long)]
    pub seconds: Option<f64>,
    /// Requests per second (open loop).
    #[arg(long)]
    pub rate: Option<f64>,
    /// Strategies, comma separated (default: round-robin, modulo, ring, rendezvous,
    /// bounded-rendezvous, p2c, affinity).
    #[arg(long, value_delimiter = ',')]
    pub strategies: Vec<String>,
    /// Scenarios, comma separated (default: steady, scale-out, slow-worker, hot-image, hot-baseline,
    /// killed-worker, double-fleet). Strategies may carry +replicas or +handoff.
    #[arg(long, value_delimiter = ',')]
    pub scenarios: Vec<String>,
    /// Write the HTML report here.
    #[arg(long, default_value = "keyroute-demo.html")]
    pub report: Option<PathBuf>,
    /// JSON on stdout instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Keep the generated images and caches (their directory is printed).
    #[arg(long)]
    pub keep: bool,
    /// Instead of the runs, keep one fleet up (8 workers, the gateway, keyed traffic with a hot
    /// image, a worker killed and one added) and serve the operator's dashboard at this address
    /// (default 127.0.0.1:9901): open http://ADDRESS/dashboard. Ctrl-C stops it.
    #[arg(long, num_args = 0..=1, default_missing_value = "127.0.0.1:9901", value_name = "ADDRESS")]
    pub dashboard: Option<std::net::SocketAddr>,
    /// With --dashboard: stop after this many seconds (default: run until Ctrl-C).
    #[arg(long, requires = "dashboard")]
    pub dashboard_seconds: Option<f64>,
}

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// The configuration file (TOML; see examples/keyroute.toml).
    #[arg(long, short = 'c')]
    pub config: PathBuf,
    /// Validate the configuration and exit (0 if valid, 64 if not).
    #[arg(long)]
    pub check: bool,
    /// Reload the configuration when the file changes (SIGHUP always reloads).
    #[arg(long)]
    pub watch: bool,
    /// Threads (default: one per core), each a runtime of its own with its own listening sockets
    /// (SO_REUSEPORT) and upstream connections, like NGINX worker processes.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Log filter (RUST_LOG syntax), e.g. info or keyroute_gateway=debug.
    #[arg(long, default_value = "info")]
    pub log: String,
}

#[derive(Debug, Args)]
pub struct WorkerArgs {
    /// Where to listen.
    #[arg(long, default_value = "127.0.0.1:9001")]
    pub listen: std::net::SocketAddr,
    /// The directory of source images.
    #[arg(long)]
    pub images: PathBuf,
    /// The directory for cached thumbnails (created if missing).
    #[arg(long)]
    pub cache_dir: PathBuf,
    /// The cache's size limit in bytes (least recently used thumbnails are evicted).
    #[arg(long, default_value_t = keyroute_worker::DEFAULT_CACHE_BYTES)]
    pub cache_bytes: u64,
    /// The worker's name (sent as X-Worker).
    #[arg(long, default_value = "worker")]
    pub name: String,
    /// Make every cache miss this many times slower (experiments).
    #[arg(long, default_value_t = 1.0)]
    pub slowdown: f64,
    /// A fixed capacity (experiments): at most this many thumbnail requests at once, each holding
    /// its slot for at least --cost-ms, cache hits included (0: no limit).
    #[arg(long, default_value_t = 0)]
    pub slots: usize,
    /// See --slots.
    #[arg(long, default_value_t = 0)]
    pub cost_ms: u64,
    /// First generate this many procedural source images into --images.
    #[arg(long)]
    pub generate: Option<usize>,
    /// Log filter.
    #[arg(long, default_value = "info")]
    pub log: String,
    /// Register in etcd while running: etcd://HOST:PORT/PREFIX/ (the pool's prefix).
    #[arg(long, value_name = "URL")]
    pub register: Option<String>,
    #[command(flatten)]
    pub registration: RegistrationArgs,
}

/// How a worker's record looks and lives in etcd.
#[derive(Debug, Args, Clone)]
pub struct RegistrationArgs {
    /// The address gateways connect to (default: --listen, which must then be a specific address).
    #[arg(long)]
    pub advertise: Option<String>,
    /// The worker's weight in the pool.
    #[arg(long, default_value_t = 1)]
    pub weight: u32,
    /// The worker's zone.
    #[arg(long)]
    pub zone: Option<String>,
    /// The worker's numeric id, for the haproxy placement (HAProxy's server id).
    #[arg(long)]
    pub id: Option<u32>,
    /// The lease's TTL in seconds: a worker that dies is dropped within this long.
    #[arg(long, default_value_t = keyroute_etcd::register::DEFAULT_TTL)]
    pub ttl: u64,
    /// On SIGTERM, after marking itself draining, leave once no request came for this long (ms).
    #[arg(long, default_value_t = 1000)]
    pub drain_grace_ms: u64,
    /// ...or after this long at most (ms).
    #[arg(long, default_value_t = 30_000)]
    pub drain_timeout_ms: u64,
}

#[derive(Debug, Args)]
pub struct RegisterArgs {
    /// Where to register: etcd://HOST:PORT/PREFIX/ (the pool's prefix).
    pub registry: String,
    /// The worker's name (its identity for placement).
    #[arg(long)]
    pub name: String,
    /// The worker's address (host:port), which gateways connect to.
    #[arg(long)]
    pub address: String,
    /// The health URL (http://...): registered while it answers 2xx, withdrawn while it does not.
    #[arg(long)]
    pub health: String,
    /// Between health checks (ms).
    #[arg(long, default_value_t = 1000)]
    pub interval_ms: u64,
    #[command(flatten)]
    pub registration: RegistrationArgs,
    /// Log filter.
    #[arg(long, default_value = "info")]
    pub log: String,
}

#[derive(Debug, Args)]
pub struct MembersArgs {
    /// The pool's prefix in etcd: etcd://HOST:PORT/PREFIX/.
    #[arg(long, global = true, default_value = "")]
    pub registry: String,
    #[command(subcommand)]
    pub action: MembersAction,
}

#[derive(Debug, Subcommand)]
pub enum MembersAction {
    /// Every record: name, address, weight, zone, state, and whether a lease keeps it.
    List {
        /// JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Add a worker (an operator's record, without a lease: it stays until removed).
    Add {
        /// Its name.
        name: String,
        /// Its address, host:port.
        #[arg(long)]
        address: String,
        /// Its weight.
        #[arg(long, default_value_t = 1)]
        weight: u32,
        /// Its zone.
        #[arg(long)]
        zone: Option<String>,
        /// Its numeric id, for the haproxy placement (HAProxy's server id).
        #[arg(long)]
        id: Option<u32>,
    },
    /// Mark a worker draining: no new requests; its keys go on along their rankings.
    Drain {
        /// Its name.
        name: String,
    },
    /// Remove a worker's record now.
    Remove {
        /// Its name.
        name: String,
    },
    /// Set a worker's weight.
    Weight {
        /// Its name.
        name: String,
        /// The new weight (at least 1; drain instead of 0).
        weight: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum SimCommand {
    /// Keys moved by a membership change, the from->to matrix, and (with --traffic) the requests lost.
    Remap(RemapArgs),
    /// Keys per node, peak/mean, min/mean and spread.
    Balance(BalanceArgs),
    /// Balls into bins with d random choices (Mitzenmacher's power of two choices).
    Choices(ChoicesArgs),
    /// The thumbnail fleet: gateways, workers with caches, Zipf traffic or a request log, one scenario per run.
    Fleet(Box<FleetArgs>),
    /// Before a change, over your own traffic: the keys and requests that move, per worker, and the
    /// hit rate and peak load with and without it.
    Whatif(Box<WhatifArgs>),
    /// Write a synthetic request log (TIME KEY lines: Poisson arrivals, Zipf keys) to try --trace on.
    Trace(TraceArgs),
}

/// The strategy and its knobs, shared by every command that places keys.
#[derive(Debug, Args, Clone)]
pub struct StrategyArgs {
    /// The strategy: modulo, ring, rendezvous, jump, maglev, slots, bounded-ring, bounded-rendezvous,
    /// round-robin, weighted-round-robin, p2c, least-loaded, affinity.
    #[arg(long, short = 's', default_value = "rendezvous")]
    pub strategy: String,
    /// Ring points per unit of weight.
    #[arg(long, default_value_t = keyroute::ring::DEFAULT_VNODES)]
    pub vnodes: u32,
    /// Ring point scheme: xxh3 (default) or java-md5 (the consistent-hashing note's Java sketch).
    #[arg(long, default_value = "xxh3")]
    pub scheme: String,
    /// Key hash: xxh3, xxh3:SEED or md5.
    #[arg(long, default_value = "xxh3")]
    pub hash: String,
    /// Maglev table size (a prime).
    #[arg(long, default_value_t = keyroute::maglev::DEFAULT_TABLE_SIZE)]
    pub maglev_size: u32,
    /// Bounded loads: capacity is (1 + epsilon) times the mean load.
    #[arg(long, default_value_t = 0.25)]
    pub epsilon: f64,
    /// Choices for p2c, and owners considered by affinity.
    #[arg(long, default_value_t = 2)]
    pub choices: usize,
    /// groupcache: points per node (its HTTPPool uses 50).
    #[arg(long, default_value_t = 50)]
    pub groupcache_replicas: u32,
    /// guava: what `consistentHash` is given: murmur3 (`murmur3_128().hashBytes(key)`), md5, or
    /// (with `place`) long: the key is a signed 64-bit integer, passed as is.
    #[arg(long, default_value = "murmur3")]
    pub guava_input: String,
    /// haproxy: the words after `hash-type consistent` ("" = sdbm with avalanche, "sdbm",
    /// "djb2", "wt6", "crc32", each optionally followed by "avalanche").
    #[arg(long, default_value = "")]
    pub haproxy_hash: String,
    /// twemproxy: `hash_tag`, two characters such as "{}" (none by default).
    #[arg(long)]
    pub hash_tag: Option<String>,
    /// envoy-ring-hash: `minimum_ring_size`.
    #[arg(long, default_value_t = keyroute::compat::envoy::DEFAULT_MIN_RING_SIZE)]
    pub envoy_min_ring_size: u64,
    /// envoy-ring-hash: `maximum_ring_size`.
    #[arg(long, default_value_t = keyroute::compat::envoy::DEFAULT_MAX_RING_SIZE)]
    pub envoy_max_ring_size: u64,
    /// envoy-maglev: `table_size` (a prime).
    #[arg(long, default_value_t = keyroute::compat::envoy::DEFAULT_TABLE_SIZE)]
    pub envoy_table_size: u64,
}

impl StrategyArgs {
    pub fn strategy(&self) -> Result<Strategy, Usage> {
        self.strategy.parse().map_err(|e: keyroute::Error| Usage(format!("--strategy: {e}")))
    }

    pub fn options(&self) -> Result<Options, Usage> {
        let hasher: KeyHasher = self.hash.parse().map_err(|e: keyroute::Error| Usage(format!("--hash: {e}")))?;
        let scheme: RingScheme = self.scheme.parse().map_err(|e: keyroute::Error| Usage(format!("--scheme: {e}")))?;
        if self.vnodes == 0 {
            return Err(Usage("--vnodes: must be at least 1".into()));
        }
        if !(self.epsilon.is_finite() && self.epsilon >= 0.0) {
            return Err(Usage(format!("--epsilon: must be finite and >= 0, got {}", self.epsilon)));
        }
        if self.choices == 0 {
            return Err(Usage("--choices: must be at least 1".into()));
        }
        Ok(Options {
            hasher,
            vnodes: self.vnodes,
            scheme,
            maglev_size: self.maglev_size,
            epsilon: self.epsilon,
            choices: self.choices,
            compat: self.compat_options()?,
        })
    }

    fn compat_options(&self) -> Result<keyroute::compat::CompatOptions, Usage> {
        use keyroute::compat::guava::GuavaInput;
        let guava_input = match self.guava_input.as_str() {
            "murmur3" => GuavaInput::Murmur3_128,
            "long" => {
                return Err(Usage(
                    "--guava-input long: only with `place --compat guava` (the key is the raw input)".into(),
                ));
            }
            "md5" => GuavaInput::Md5,
            other => return Err(Usage(format!("--guava-input: '{other}' (valid: murmur3, md5, long)"))),
        };
        let haproxy_hash = keyroute::compat::haproxy::HaproxyHash::parse(&self.haproxy_hash)
            .map_err(|e| Usage(format!("--haproxy-hash: {e}")))?;
        let twemproxy_hash_tag = match &self.hash_tag {
            None => None,
            Some(t) => Some(
                <[u8; 2]>::try_from(t.as_bytes())
                    .map_err(|_| Usage(format!("--hash-tag: '{t}' must be two bytes, such as {{}}")))?,
            ),
        };
        Ok(keyroute::compat::CompatOptions {
            groupcache_replicas: self.groupcache_replicas,
            guava_input,
            haproxy_hash,
            twemproxy_hash_tag,
            envoy_min_ring_size: self.envoy_min_ring_size,
            envoy_max_ring_size: self.envoy_max_ring_size,
            envoy_table_size: self.envoy_table_size,
        })
    }
}

pub fn parse_nodes(flag: &str, spec: &str) -> Result<NodeSet, Usage> {
    NodeSet::parse(spec).map_err(|e| Usage(format!("{flag}: {e}")))
}

#[derive(Debug, Args)]
pub struct PlaceArgs {
    #[command(flatten)]
    pub strategy: StrategyArgs,
    /// Nodes: NAME[:weight=W][:zone=Z],... (for example a,b:weight=2,c:zone=eu).
    #[arg(long, short = 'n')]
    pub nodes: String,
    /// How many distinct nodes to list per key (the preference list).
    #[arg(long, short = 'r', default_value_t = 1)]
    pub replicas: usize,
    /// Spread replicas over distinct zones first (nodes without a zone are each their own).
    #[arg(long)]
    pub zone_aware: bool,
    /// One JSON object per line instead of tab-separated text.
    #[arg(long)]
    pub json: bool,
    /// Place exactly as a deployed system does (instead of --strategy): nginx (names are the
    /// `server` texts), twemproxy (names are the servers' names or host:port), libketama,
    /// redis-cluster (the layout of `redis-cli --cluster create` over --nodes in order), guava
    /// (bucket = index in --nodes), haproxy (ids from `:id=N`, else 1, 2, ...), envoy-ring-hash,
    /// envoy-maglev (names are the hosts' hash keys or addresses), groupcache.
    #[arg(long)]
    pub compat: Option<String>,
    /// Keys to place; without any, keys are read from standard input, one per line.
    pub keys: Vec<String>,
}

#[derive(Debug, Args)]
pub struct SlotArgs {
    /// The keys (default: one per line on standard input).
    pub keys: Vec<String>,
    /// The masters as given to `redis-cli --cluster create` (HOST:PORT,..., in that order, at
    /// least 3): each key's master is printed too.
    #[arg(long)]
    pub masters: Option<String>,
}

#[derive(Debug, Args)]
pub struct SlotPlanArgs {
    /// The nodes before the change: NAME[:weight=W][:zone=Z],...
    #[arg(long)]
    pub before: String,
    /// The nodes after the change.
    #[arg(long)]
    pub after: String,
    /// One JSON object per line instead of tab-separated text.
    #[arg(long)]
    pub json: bool,
}

/// Where the keys of an analysis come from.
#[derive(Debug, Args, Clone)]
pub struct KeyArgs {
    /// Generate this many keys from --key-format (default 100000, or the traffic log's keys).
    #[arg(long)]
    pub keys: Option<usize>,
    /// Template of generated keys; `{}` is replaced by 0, 1, 2, ...
    #[arg(long, default_value = "key:{}")]
    pub key_format: String,
    /// Read keys from a file instead, one per line.
    #[arg(long)]
    pub keys_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct RemapArgs {
    #[command(flatten)]
    pub strategy: StrategyArgs,
    /// The strategy or compatibility mode placing keys before the change (default: --strategy).
    #[arg(long)]
    pub from: Option<String>,
    /// The strategy or compatibility mode placing keys after the change (default: --from).
    #[arg(long)]
    pub to: Option<String>,
    /// The nodes before the change.
    #[arg(long)]
    pub before: String,
    /// The nodes after the change (default: --before, for a change of strategy alone).
    #[arg(long)]
    pub after: Option<String>,
    #[command(flatten)]
    pub keys: KeyArgs,
    /// A traffic log, one key per request: also report the share of requests whose key moved.
    #[arg(long)]
    pub traffic: Option<PathBuf>,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct BalanceArgs {
    #[command(flatten)]
    pub strategy: StrategyArgs,
    /// The nodes.
    #[arg(long, short = 'n')]
    pub nodes: String,
    #[command(flatten)]
    pub keys: KeyArgs,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct ChoicesArgs {
    /// Bins (workers).
    #[arg(long, default_value_t = 1_000_000)]
    pub bins: u64,
    /// Balls (requests).
    #[arg(long, default_value_t = 1_000_000)]
    pub balls: u64,
    /// Numbers of choices to compare, comma separated.
    #[arg(long, default_value = "1,2,3", value_delimiter = ',')]
    pub choices: Vec<u32>,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
    /// Runs per choice count.
    #[arg(long, default_value_t = 1)]
    pub runs: u32,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

#[derive(Debug, Args)]
pub struct FleetArgs {
    /// Scenario: steady, scale-out, slow-worker, hot-key, flash-crowd, stale-gateways, or all.
    #[arg(long, default_value = "steady")]
    pub scenario: String,
    /// Strategies to compare, comma separated; each may carry variants: +replicas (hot-key
    /// replication), +cache (the gateway cache for hot keys), +handoff, +slow-start
    /// (default: the eight the first document discusses, plus the variants for hot-key,
    /// flash-crowd and scale-out).
    #[arg(long, value_delimiter = ',', alias = "strategy")]
    pub strategies: Option<Vec<String>>,
    #[command(flatten)]
    pub knobs: FleetKnobs,
    /// Bounded loads: capacity is (1 + epsilon) times the mean load.
    #[arg(long, default_value_t = 0.25)]
    pub epsilon: f64,
    /// Ring points per node.
    #[arg(long, default_value_t = keyroute::ring::DEFAULT_VNODES)]
    pub vnodes: u32,
    /// Print each worker's share, hit rate and queue.
    #[arg(long, short = 'v')]
    pub verbose: bool,
    /// Write an HTML report with charts to this file.
    #[arg(long)]
    pub report: Option<PathBuf>,
    /// JSON output (every report, without the time series).
    #[arg(long)]
    pub json: bool,
    #[command(flatten)]
    pub traffic: TrafficArgs,
    /// Runs at once (default: the cores). The numbers do not depend on it.
    #[arg(long)]
    pub threads: Option<usize>,
}

/// The user's own traffic and members, for `sim fleet` and `sim whatif`.
#[derive(Debug, Args, Clone, Default)]
pub struct TrafficArgs {
    /// Replay this request log instead of synthetic arrivals: `TIME KEY [SERVICE_MS]` lines
    /// (TIME in seconds), or with --trace-format combined, an nginx combined access log; gzip or not.
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// plain (TIME KEY [SERVICE_MS]) or combined (nginx's combined log).
    #[arg(long, default_value = "plain")]
    pub trace_format: String,
    /// The key of a combined-log request: {path}, {uri}, {query.NAME}, {method}, {client_ip} and text.
    #[arg(long, default_value = "{uri}")]
    pub key_template: String,
    /// Start from these workers: a file with one NAME[:weight=W] per line (or comma separated, #
    /// comments), or a pool in etcd, etcd://HOST:PORT/PREFIX/ (its active members).
    #[arg(long)]
    pub workers_from: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct TraceArgs {
    /// Requests.
    #[arg(long, default_value_t = 100_000)]
    pub requests: u64,
    /// Distinct keys (`thumb/0.jpg` ..).
    #[arg(long, default_value_t = 100_000)]
    pub keys: usize,
    /// Zipf exponent of key popularity.
    #[arg(long, default_value_t = 0.9)]
    pub zipf: f64,
    /// Arrivals per second.
    #[arg(long, default_value_t = 450.0)]
    pub rate: f64,
    /// Seed.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,
}

#[derive(Debug, Args)]
pub struct WhatifArgs {
    #[command(flatten)]
    pub traffic: TrafficArgs,
    /// The workers now (as --workers-from): a file of NAME[:weight=W] lines, or etcd://HOST:PORT/PREFIX/.
    #[arg(long)]
    pub members: PathBuf,
    /// The strategy now.
    #[arg(long, default_value = "rendezvous")]
    pub current: String,
    /// Add a worker: NAME[:weight=W] (repeatable).
    #[arg(long)]
    pub add: Vec<String>,
    /// Remove a worker by name (repeatable).
    #[arg(long)]
    pub remove: Vec<String>,
    /// Change a worker's weight: NAME=W (repeatable).
    #[arg(long)]
    pub reweight: Vec<String>,
    /// Switch to this strategy.
    #[arg(long)]
    pub strategy: Option<String>,
    /// When the change happens in the fleet run: a fraction of the requests (0.5) or seconds into the trace (30s).
    #[arg(long, default_value = "0.5")]
    pub at: String,
    #[command(flatten)]
    pub knobs: FleetKnobs,
    /// JSON output.
    #[arg(long)]
    pub json: bool,
}

/// Overrides of a scenario's defaults (see `keyroute_sim::scenario`).
#[derive(Debug, Args, Clone, Default)]
pub struct FleetKnobs {
    /// Workers at the start.
    #[arg(long)]
    pub workers: Option<usize>,
    /// Gateways.
    #[arg(long)]
    pub gateways: Option<usize>,
    /// How stale each gateway's view of the loads is, in ms (0 = exact).
    #[arg(long)]
    pub refresh_ms: Option<f64>,
    /// Requests each worker serves at once.
    #[arg(long)]
    pub concurrency: Option<u32>,
    /// Service time of a cache hit, ms.
    #[arg(long)]
    pub hit_ms: Option<f64>,
    /// Service time of a cache miss (a resize), ms.
    #[arg(long)]
    pub miss_ms: Option<f64>,
    /// Thumbnails each worker caches.
    #[arg(long)]
    pub cache_entries: Option<usize>,
    /// Distinct thumbnails.
    #[arg(long)]
    pub keys: Option<usize>,
    /// Zipf exponent of popularity.
    #[arg(long)]
    pub zipf: Option<f64>,
    /// Arrivals per second.
    #[arg(long)]
    pub rate: Option<f64>,
    /// Requests to simulate.
    #[arg(long)]
    pub requests: Option<u64>,
    /// Seed.
    #[arg(long)]
    pub seed: Option<u64>,
    /// hot-key: the hot image's share of all requests.
    #[arg(long)]
    pub hot_share: Option<f64>,
    /// slow-worker: how many times slower worker 1 is.
    #[arg(long)]
    pub slow_factor: Option<f64>,
    /// An extra timed change, repeatable: AT:add, AT:remove, AT:slow:WORKER:FACTOR or AT:hot:SHARE,
    /// where AT is the fraction of the run's requests (0.5 = halfway) and WORKER counts from 1.
    #[arg(long = "change", value_name = "AT:KIND[:ARGS]")]
    pub changes: Vec<String>,
}
