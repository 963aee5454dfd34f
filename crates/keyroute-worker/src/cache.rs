//! The thumbnail cache on local disk: one file per thumbnail, an in-memory LRU index by size.
//!
//! The index maps a file name to its size and a "tick", a counter bumped on every use; a second
//! map from tick to name gives the least recently used entry in `O(log n)`. Inserting renames a
//! finished temporary file into place and then evicts from the old end until the total fits. The
//! index, the renames and the deletions happen under one lock, so the index and the directory
//! agree whenever the lock is free; reads of a hit happen outside it, and a hit whose file was
//! evicted in between is treated as a miss.
//!
//! Every method that touches the file system blocks: call them from `spawn_blocking`, except
//! [`DiskCache::lookup`] and [`DiskCache::forget`], which only touch memory.

use std::collections::{BTreeMap, HashMap};
use std::fs;
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::SystemTime;

use crate::WorkerStats;
use crate::thumb::Format;

/// Temporary files start with this; [`DiskCache::open`] deletes them.
pub(crate) const TEMP_PREFIX: &str = ".tmp-";

/// The stable 64-bit FNV-1a hash (Fowler, Noll, Vo): offset basis `0xcbf29ce484222325`, prime
/// `0x100000001b3`. Chosen because it is tiny, fixed forever and needs no seed; the cache key is
/// not attacker-chosen in a way that matters (a collision only serves another thumbnail of a valid
/// image, and needs 2^32 names to find).
pub(crate) fn fnv1a64(parts: &[&[u8]]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for part in parts {
        for &byte in *part {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    hash
}

/// The cache file name of a thumbnail; see [`crate::WorkerConfig::cache_dir`] for the encoding.
pub(crate) fn cache_file_name(image: &str, w: u32, h: u32, format: Format, jpeg_quality: u8) -> String {
    let (tag, quality) = match format {
        Format::Jpeg => (1u8, jpeg_quality),
        Format::Png => (2u8, 0),
    };
    let hash = fnv1a64(&[
        b"keyroute-thumb-v1\0",
        image.as_bytes(),
        b"\0",
        &w.to_le_bytes(),
        &h.to_le_bytes(),
        &[tag, quality],
    ]);
    format!("{hash:016x}.{}", format.extension())
}

/// Whether `name` is a cache file name this module produced: 16 lowercase hex digits, then
/// `.jpg` or `.png`.
fn is_cache_file_name(name: &str) -> bool {
    let Some((stem, ext)) = name.split_once('.') else {
        return false;
    };
    stem.len() == 16
        && stem.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        && (ext == "jpg" || ext == "png")
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    tick: u64,
}

/// The LRU index: pure bookkeeping, no I/O. Kept apart from the gateway's response cache index
/// (which orders Vary variants in memory): this one is rebuilt from the files on disk at start,
/// oldest first, and evicts files by size.
#[derive(Debug, Default)]
struct Index {
    entries: HashMap<String, Entry>,
    /// Tick of last use -> file name; the first entry is the least recently used.
    order: BTreeMap<u64, String>,
    clock: u64,
    total: u64,
}

impl Index {
    fn next_tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Marks `name` as just used; false when it is not in the index.
    fn touch(&mut self, name: &str) -> bool {
        let tick = self.next_tick();
        let Some(entry) = self.entries.get_mut(name) else {
            return false;
        };
        if let Some(owned) = self.order.remove(&entry.tick) {
            self.order.insert(tick, owned);
        }
        entry.tick = tick;
        true
    }

    /// Inserts or replaces `name` as the most recently used entry.
    fn insert(&mut self, name: &str, size: u64) {
        self.remove(name);
        let tick = self.next_tick();
        self.entries.insert(name.to_owned(), Entry { size, tick });
        self.order.insert(tick, name.to_owned());
        self.total += size;
    }

    fn remove(&mut self, name: &str) -> Option<u64> {
        let entry = self.entries.remove(name)?;
        self.order.remove(&entry.tick);
        self.total -= entry.size;
        Some(entry.size)
    }

    /// Removes and returns the least recently used entry.
    fn pop_lru(&mut self) -> Option<(String, u64)> {
        let (_, name) = self.order.pop_first()?;
        let size = self.entries.remove(&name).map_or(0, |e| e.size);
        self.total -= size;
        Some((name, size))
    }
}

/// The disk cache of one worker.
#[derive(Debug)]
pub(crate) struct DiskCache {
    dir: PathBuf,
    capacity: u64,
    index: Mutex<Index>,
    stats: Arc<WorkerStats>,
    temp_counter: AtomicU64,
}

impl DiskCache {
    /// Opens `dir` (which must exist), deletes stray temporary files and empty cache files, and
    /// rebuilds the index from the cache files there, oldest modification time first; then evicts
    /// down to `capacity`. Files that are not cache files are left alone and not counted.
    pub(crate) fn open(dir: PathBuf, capacity: u64, stats: Arc<WorkerStats>) -> io::Result<DiskCache> {
        let mut found = Vec::new();
        for item in fs::read_dir(&dir)? {
            let item = item?;
            let Ok(name) = item.file_name().into_string() else {
                continue;
            };
            let meta = match item.metadata() {
                Ok(meta) => meta,
                Err(err) if err.kind() == io::ErrorKind::NotFound => continue,
                Err(err) => return Err(err),
            };
            if !meta.is_file() {
                continue;
            }
            if name.starts_with(TEMP_PREFIX) || (is_cache_file_name(&name) && meta.len() == 0) {
                // A write that never finished (or a rename that a crash left empty).
                tracing::debug!(file = %name, "deleting stray cache file");
                remove_if_present(&item.path())?;
                continue;
            }
            if is_cache_file_name(&name) {
                let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                found.push((mtime, name, meta.len()));
            }
        }
        found.sort();
        let mut index = Index::default();
        for (_, name, size) in found {
            index.insert(&name, size);
        }
        let cache = DiskCache { dir, capacity, index: Mutex::new(index), stats, temp_counter: AtomicU64::new(0) };
        {
            let mut index = cache.lock();
            cache.evict(&mut index);
            cache.publish(&index);
            tracing::debug!(dir = %cache.dir.display(), entries = index.entries.len(), bytes = index.total, "cache opened");
        }
        Ok(cache)
    }

    fn lock(&self) -> MutexGuard<'_, Index> {
        // The index is consistent after every statement that can panic, so a poisoned lock is safe.
        self.index.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The path of the cached file `name`, marked as just used; `None` on a miss. Memory only.
    pub(crate) fn lookup(&self, name: &str) -> Option<PathBuf> {
        if self.lock().touch(name) { Some(self.dir.join(name)) } else { None }
    }

    /// Drops `name` from the index (its file was found missing or unreadable). Memory only.
    pub(crate) fn forget(&self, name: &str) {
        let mut index = self.lock();
        index.remove(name);
        self.publish(&index);
    }

    /// Stores `bytes` as the cached file `name`: writes a temporary file, renames it into place,
    /// then evicts least recently used files until the total fits the capacity (which may evict
    /// `name` itself when it alone is larger). Blocks.
    pub(crate) fn store(&self, name: &str, bytes: &[u8]) -> io::Result<()> {
        let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        let temp = self.dir.join(format!("{TEMP_PREFIX}{name}.{}.{n}", std::process::id()));
        let written = fs::File::create_new(&temp).and_then(|mut file| file.write_all(bytes));
        if let Err(err) = written {
            let _ = fs::remove_file(&temp);
            return Err(err);
        }
        let mut index = self.lock();
        if let Err(err) = fs::rename(&temp, self.dir.join(name)) {
            drop(index);
            let _ = fs::remove_file(&temp);
            return Err(err);
        }
        index.insert(name, bytes.len() as u64);
        self.evict(&mut index);
        self.publish(&index);
        Ok(())
    }

    /// Deletes least recently used files until the total fits. Called with the lock held.
    fn evict(&self, index: &mut Index) {
        while index.total > self.capacity {
            let Some((victim, size)) = index.pop_lru() else {
                break;
            };
            tracing::debug!(file = %victim, size, "evicting thumbnail");
            if let Err(err) = remove_if_present(&self.dir.join(&victim)) {
                tracing::warn!(file = %victim, error = %err, "cannot delete evicted thumbnail");
            }
        }
    }

    fn publish(&self, index: &Index) {
        self.stats.cache_bytes.store(index.total, Ordering::Relaxed);
        self.stats.cache_entries.store(index.entries.len() as u64, Ordering::Relaxed);
    }
}

/// Sets the modification time of `path` to now, so that a restart ranks it as recently used.
/// Best effort: the file may have been evicted meanwhile. Blocks.
pub(crate) fn touch_file(path: &Path) {
    let _ = fs::File::open(path).and_then(|file| file.set_modified(SystemTime::now()));
}

fn remove_if_present(path: &Path) -> io::Result<()> {
    match fs::remove_file(path) {
        Err(err) if err.kind() != io::ErrorKind::NotFound => Err(err),
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_the_published_vectors() {
        // From the FNV reference test suite (Noll): "" and "a" and "foobar".
        assert_eq!(fnv1a64(&[b""]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(&[b"a"]), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(&[b"foo", b"bar"]), 0x8594_4171_f739_67e8);
    }

    #[test]
    fn cache_file_names_are_stable_and_distinct() {
        let a = cache_file_name("img-000.jpg", 100, 100, Format::Jpeg, 80);
        assert_eq!(a, cache_file_name("img-000.jpg", 100, 100, Format::Jpeg, 80));
        assert!(is_cache_file_name(&a), "{a}");
        assert!(a.ends_with(".jpg"));
        let png = cache_file_name("img-000.jpg", 100, 100, Format::Png, 80);
        assert!(png.ends_with(".png"));
        let others = [
            png,
            cache_file_name("img-000.jpg", 100, 101, Format::Jpeg, 80),
            cache_file_name("img-000.jpg", 101, 100, Format::Jpeg, 80),
            cache_file_name("img-001.jpg", 100, 100, Format::Jpeg, 80),
            cache_file_name("img-000.jpg", 100, 100, Format::Jpeg, 90),
        ];
        for other in &others {
            assert_ne!(&a[..16], &other[..16]);
        }
        // PNG ignores the JPEG quality.
        assert_eq!(
            cache_file_name("x.png", 10, 10, Format::Png, 80),
            cache_file_name("x.png", 10, 10, Format::Png, 95)
        );
    }

    #[test]
    fn cache_file_name_recognition() {
        assert!(is_cache_file_name("0123456789abcdef.png"));
        assert!(!is_cache_file_name("0123456789ABCDEF.png"));
        assert!(!is_cache_file_name("0123456789abcde.png"));
        assert!(!is_cache_file_name("0123456789abcdef.gif"));
        assert!(!is_cache_file_name(".tmp-0123456789abcdef.png.1.2"));
        assert!(!is_cache_file_name("notes.txt"));
    }

    #[test]
    fn index_evicts_least_recently_used_first() {
        let mut index = Index::default();
        index.insert("a", 10);
        index.insert("b", 20);
        index.insert("c", 30);
        assert_eq!(index.total, 60);
        assert!(index.touch("a"));
        assert!(!index.touch("zzz"));
        assert_eq!(index.pop_lru(), Some(("b".to_owned(), 20)));
        assert_eq!(index.pop_lru(), Some(("c".to_owned(), 30)));
        assert_eq!(index.total, 10);
        index.insert("a", 5); // replace: size updated, not duplicated
        assert_eq!((index.total, index.entries.len(), index.order.len()), (5, 1, 1));
        assert_eq!(index.remove("a"), Some(5));
        assert_eq!(index.pop_lru(), None);
        assert_eq!(index.total, 0);
    }
}
