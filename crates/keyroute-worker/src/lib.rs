//! # keyroute-worker: the thumbnail service that placement is for
//!
//! The project's first source document asks which of N workers should resize a given image. This
//! crate is that worker. A request names a source image and a bounding box; the worker decodes the
//! image, shrinks it to fit the box, encodes it, and answers with the thumbnail.
//!
//! Resizing costs CPU: a decode, a filter pass over every source pixel and an encode take
//! milliseconds to tens of milliseconds, a thousand times more than reading the finished result
//! back from disk. So every worker keeps the thumbnails it has made in a cache on its own local
//! disk, and a second request for the same thumbnail is a file read. That cache is local: a worker
//! that never saw a thumbnail must compute it again. This is why the gateway should send the same
//! thumbnail to the same worker, with a consistent hash of the thumbnail's key (the `keyroute`
//! library): the fleet then computes each thumbnail about once, the caches do not hold N copies of
//! the same files, and adding or removing a worker moves only the keys it gains or loses. The
//! `X-Cache: hit|miss` header on every thumbnail lets the simulator and the demo measure exactly
//! that hit rate.
//!
//! ## Protocol
//!
//! | request | answer |
//! |---|---|
//! | `GET /thumb/{image}?w=W&h=H` | the image resized to fit within `W`x`H`, aspect kept, never enlarged; JPEG, or PNG when `Accept` names `image/png` and not `image/jpeg` |
//! | `HEAD /thumb/{image}?w=W&h=H` | the same headers, no body |
//! | `GET /healthz` | `200 ok` |
//! | `GET /stats` | the [`WorkerStats`] counters as JSON |
//!
//! A thumbnail answer carries `Content-Type`, `Content-Length`, `X-Cache: hit|miss`,
//! `X-Worker: {name}`, `Cache-Control: public, max-age=86400` and `Vary: Accept`. Every answer,
//! errors included, carries `X-Worker`.
//!
//! Errors answer with keyroute's one error shape (the gateway's and the admin API's too),
//! `{"error": message, "reason": kind, "status": code, "worker": name}`: `error` says what went
//! wrong for a person, `reason` is a fixed class for a program (`bad_request`, `not_found`,
//! `method_not_allowed`, `undecodable_source`, `internal`):
//!
//! | status | when |
//! |---|---|
//! | 400 | `w` or `h` missing, not a number, zero or above [`WorkerConfig::max_dimension`]; an image name that is not a plain file name (see below) |
//! | 404 | no such image; no such path |
//! | 405 | a method other than `GET` or `HEAD` on a known path (with `Allow: GET, HEAD`) |
//! | 502 | the source image cannot be decoded (corrupt, truncated, not JPEG or PNG, too large); the worker keeps serving |
//! | 500 | anything else (an I/O error reading the source, an encoder failure) |
//!
//! ## Image names cannot leave the image directory
//!
//! `{image}` is one path segment. It is percent-decoded first, so `%2e%2e%2f` is treated as `../`,
//! and then it must be a plain file name: valid UTF-8, at most 255 bytes, no `/`, `\`, `:`, NUL
//! or other control character, not starting with `.` (which rules out `.` and `..` too), and one
//! normal path component. The name is then joined to the canonicalized image directory,
//! canonicalized again (following symbolic links) and must still be inside the directory; a
//! symbolic link pointing outside is refused.
//!
//! ## The disk cache
//!
//! A thumbnail's file name is a stable hash (64-bit FNV-1a, see [`WorkerConfig::cache_dir`]) of
//! the image name, the box, the format and, for JPEG, the quality: the same request finds the same
//! file in every process. Files are written to a temporary file in the cache directory and then
//! renamed, so a reader sees either no file or a complete one, and two requests computing the same
//! thumbnail at once just replace one complete file with an identical one. An in-memory index
//! keeps each file's size and its last use; after every insert the least recently used files are
//! deleted until the total is at most [`WorkerConfig::cache_bytes`]. At [`Worker::bind`] the index
//! is rebuilt from the files already there (oldest modification time first; a hit refreshes the
//! time), so a restarted worker keeps its warm cache, and stray temporary files are deleted.
//! Source images are treated as immutable: to change one, give it a new name or clear the cache.
//! One cache directory belongs to one worker at a time.
//!
//! Decoding, resizing and encoding run on tokio's blocking pool, at most as many at once as the
//! machine has cores, so a burst of misses queues instead of oversubscribing the CPU.
//! [`WorkerConfig::slowdown`] stretches each miss to simulate a slower machine.
//!
//! ## Example
//!
//! ```
//! use keyroute_worker::{Worker, WorkerConfig, generate_images};
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let dir = std::env::temp_dir().join(format!("keyroute-worker-doc-{}", std::process::id()));
//! let names = generate_images(&dir.join("images"), 2, 320, 240, 7)?;
//! assert_eq!(names, ["img-000.jpg", "img-001.jpg"]);
//!
//! let config = WorkerConfig {
//!     name: "worker-a".into(),
//!     images: dir.join("images"),
//!     cache_dir: dir.join("cache"),
//!     ..WorkerConfig::default()
//! };
//! let runtime = tokio::runtime::Runtime::new()?;
//! runtime.block_on(async {
//!     let worker = Worker::bind("127.0.0.1:0".parse()?, config).await?;
//!     let addr = worker.local_addr(); // GET http://{addr}/thumb/img-000.jpg?w=64&h=64
//!     let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
//!     let server = tokio::spawn(worker.run(async {
//!         let _ = stopped.await;
//!     }));
//!     # let _ = addr;
//!     let _ = stop.send(());
//!     server.await??;
//!     Ok::<_, Box<dyn std::error::Error>>(())
//! })?;
//! # std::fs::remove_dir_all(&dir)?;
//! # Ok(())
//! # }
//! ```

mod cache;
mod error;
mod generate;
mod server;
mod thumb;

use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

pub use error::WorkerError;
pub use generate::generate_images;
pub use server::Worker;

/// The default [`WorkerConfig::cache_bytes`]: 256 MiB.
pub const DEFAULT_CACHE_BYTES: u64 = 256 * 1024 * 1024;

/// The default [`WorkerConfig::max_dimension`]: 4096 pixels, a 4K-wide box. Larger thumbnails are
/// not thumbnails, and the limit bounds the memory of one encode.
pub const DEFAULT_MAX_DIMENSION: u32 = 4096;

/// The default [`WorkerConfig::jpeg_quality`]: 80, where JPEG artefacts are hard to see and the
/// files are about a third of the size at 95.
pub const DEFAULT_JPEG_QUALITY: u8 = 80;

/// How a worker is set up; [`Worker::bind`] validates it.
///
/// Start from [`WorkerConfig::default()`] and set the fields you need.
#[derive(Debug, Clone, PartialEq)]
pub struct WorkerConfig {
    /// The worker's name, shown in the `X-Worker` header of every answer, in `/stats` and in logs.
    /// It must be a valid HTTP header value (visible ASCII and spaces).
    pub name: String,
    /// The directory of source images. It must exist when the worker is bound.
    pub images: PathBuf,
    /// The directory of cached thumbnails, created if missing. Files in it are named
    /// `{hash:016x}.jpg` or `.png`, where `hash` is 64-bit FNV-1a over
    /// `"keyroute-thumb-v1\0" + image name + "\0" + w (u32 LE) + h (u32 LE) + format byte
    /// (1 JPEG, 2 PNG) + JPEG quality (0 for PNG)`. Temporary files start with `.tmp-`.
    pub cache_dir: PathBuf,
    /// The cache's capacity: the total size in bytes of the cached thumbnails. Default
    /// [`DEFAULT_CACHE_BYTES`]. Zero disables caching (every thumbnail is evicted at once).
    pub cache_bytes: u64,
    /// The largest accepted `w` and `h`, in pixels. Default [`DEFAULT_MAX_DIMENSION`].
    pub max_dimension: u32,
    /// A factor of at least 1.0 (and at most 1000) that stretches every cache miss: after
    /// computing a thumbnail in time `t`, the worker sleeps `(slowdown - 1) * t` more before
    /// answering, still holding its compute slot, as a machine `slowdown` times slower would.
    /// Default 1.0 (no slowdown).
    pub slowdown: f64,
    /// The JPEG quality, 1 to 100. Default [`DEFAULT_JPEG_QUALITY`].
    pub jpeg_quality: u8,
    /// A fixed capacity, hits included: at most `slots` thumbnail requests are served at once,
    /// each holding its slot for at least `cost_ms` (a cache hit included), so the worker serves
    /// at most `slots * 1000 / cost_ms` thumbnails a second however warm its cache. Models a worker
    /// whose per-request work (auth, logging, TLS, a database read) is not free. `slots = 0`
    /// (the default) means no limit and no cost.
    pub slots: usize,
    /// See [`WorkerConfig::slots`]; at most 10,000.
    pub cost_ms: u64,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            name: "worker".to_owned(),
            images: PathBuf::from("images"),
            cache_dir: PathBuf::from("thumb-cache"),
            cache_bytes: DEFAULT_CACHE_BYTES,
            max_dimension: DEFAULT_MAX_DIMENSION,
            slowdown: 1.0,
            jpeg_quality: DEFAULT_JPEG_QUALITY,
            slots: 0,
            cost_ms: 0,
        }
    }
}

/// A worker's counters, shared with whoever holds the `Arc` from [`Worker::stats`] and served as
/// JSON at `GET /stats`.
///
/// Every counter is updated with relaxed ordering: each is exact, but a reader may see one counter
/// a moment before another.
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Every HTTP request the worker has answered or is answering, of any kind.
    pub requests: AtomicU64,
    /// Thumbnails answered from the disk cache.
    pub hits: AtomicU64,
    /// Thumbnails computed and answered (a cache miss that succeeded).
    pub misses: AtomicU64,
    /// Answers with a 4xx or 5xx status.
    pub errors: AtomicU64,
    /// Requests being answered right now.
    pub in_flight: AtomicU64,
    /// The total size in bytes of the thumbnails in the disk cache.
    pub cache_bytes: AtomicU64,
    /// The number of thumbnails in the disk cache.
    pub cache_entries: AtomicU64,
}
