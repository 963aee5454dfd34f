//! The last applied membership of an etcd-backed pool, on local disk: written after every apply
//! (to a temporary file, then renamed, so a crash never leaves half a file), and read at start-up
//! so that a gateway started while etcd is down serves its last known members instead of none.
//!
//! The file holds the records themselves (`{"revision", "prefix", "workers": {NAME: record}}`),
//! so the members it gives go through the same validation as records read from etcd.

use std::collections::BTreeMap;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::pool::Member;
use keyroute_etcd::record::{RecordState, WorkerRecord};

#[derive(Debug, Serialize, Deserialize)]
struct Saved {
    pool: String,
    prefix: String,
    revision: i64,
    workers: BTreeMap<String, WorkerRecord>,
}

/// Saves the members applied at `revision`.
///
/// # Errors
///
/// The file cannot be written.
pub fn save(path: &Path, pool: &str, prefix: &str, revision: i64, members: &[Member]) -> std::io::Result<()> {
    let workers = members
        .iter()
        .map(|m| {
            let record = WorkerRecord {
                address: m.worker.address.to_string(),
                weight: i64::from(m.worker.weight),
                zone: m.worker.zone.clone(),
                id: m.worker.id,
                state: if m.draining { RecordState::Draining } else { RecordState::Active },
            };
            (m.worker.name.clone(), record)
        })
        .collect();
    let saved = Saved { pool: pool.to_owned(), prefix: prefix.to_owned(), revision, workers };
    let bytes = serde_json::to_vec_pretty(&saved).map_err(std::io::Error::other)?;
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Why a saved membership could not be read.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    /// The file exists and cannot be read.
    #[error("{0}")]
    Read(std::io::Error),
    /// It is not a saved membership.
    #[error("not a saved membership: {0}")]
    Parse(serde_json::Error),
}

/// Records as `(key, value)`.
pub type Records = Vec<(Vec<u8>, Vec<u8>)>;

/// The records saved for `prefix`, as `(key, value)`, and their revision; `None` when there is
/// no file, or it was saved for another prefix.
///
/// # Errors
///
/// The file exists but cannot be read or parsed.
pub fn load(path: &Path, prefix: &str) -> Result<Option<(i64, Records)>, LoadError> {
    let bytes = match std::fs::read(path) {
        Ok(b) => b,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(LoadError::Read(e)),
    };
    let saved: Saved = serde_json::from_slice(&bytes).map_err(LoadError::Parse)?;
    if saved.prefix != prefix {
        return Ok(None);
    }
    let records = saved
        .workers
        .into_iter()
        .map(|(name, record)| (format!("{prefix}{name}").into_bytes(), record.to_json()))
        .collect();
    Ok(Some((saved.revision, records)))
}
