//! Writing a pool's members: what the admin API of an etcd-backed pool, `keyroute members` and
//! the registering workers do. Every change goes to etcd, and every gateway watching the prefix
//! applies it; none diverges locally.
//!
//! Changes to an existing record (drain, weight) are compare-and-swap on the record's last
//! revision, retried on a conflict, so two operators (or an operator and a worker) never undo
//! each other's change.

use std::time::Duration;

use crate::client::{Client, EtcdError};
use crate::record::{RecordState, WorkerRecord};

/// A pool's records in etcd: a client and the prefix.
#[derive(Debug)]
pub struct Registry {
    client: Client,
    prefix: String,
}

/// A record as listed.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The worker's name.
    pub name: String,
    /// The record, or why it is not one.
    pub record: Result<WorkerRecord, std::sync::Arc<serde_json::Error>>,
    /// The lease keeping it (0: none, an operator's record).
    pub lease: i64,
    /// The revision of its last change.
    pub mod_revision: i64,
}

/// Why a change was not made.
#[derive(Debug, thiserror::Error)]
pub enum ChangeError {
    /// etcd could not be reached or refused.
    #[error(transparent)]
    Etcd(#[from] EtcdError),
    /// No record by that name.
    #[error("no worker named '{0}'")]
    Unknown(String),
    /// A record by that name exists.
    #[error("a worker named '{0}' exists")]
    Exists(String),
    /// The record is not valid JSON, so it cannot be edited.
    #[error("the record of '{name}' is not valid: {error}")]
    Invalid {
        /// The worker.
        name: String,
        /// Why it is not a record.
        #[source]
        error: serde_json::Error,
    },
    /// Others kept changing it.
    #[error("the record of '{0}' kept changing; try again")]
    Contended(String),
}

/// A pool URL that is not `etcd://HOST:PORT[,HOST:PORT...]/PREFIX/`.
#[derive(Debug, thiserror::Error)]
#[error("'{url}': {why} (expected etcd://HOST:PORT/PREFIX/)")]
pub struct UrlError {
    /// The URL given.
    pub url: String,
    /// What is wrong with it.
    pub why: UrlProblem,
}

/// What is wrong with a pool URL.
#[derive(Debug, thiserror::Error)]
pub enum UrlProblem {
    /// It does not start with `etcd://`.
    #[error("not an etcd:// URL")]
    Scheme,
    /// No `/PREFIX/` after the endpoints.
    #[error("no prefix")]
    NoPrefix,
    /// The prefix does not end with `/`.
    #[error("the prefix must end with '/'")]
    NoSlash,
    /// An endpoint that is not one.
    #[error("{0}")]
    Endpoint(EtcdError),
}

impl Registry {
    /// A registry on these endpoints and this prefix (which must end with `/`).
    ///
    /// # Errors
    ///
    /// An invalid endpoint.
    pub fn new<S: AsRef<str>>(endpoints: &[S], prefix: &str) -> Result<Registry, EtcdError> {
        Ok(Registry { client: Client::new(endpoints)?, prefix: prefix.to_owned() })
    }

    /// A registry from `etcd://HOST:PORT[,HOST:PORT...]/PREFIX/`.
    ///
    /// # Errors
    ///
    /// Not such a URL.
    ///
    /// # Examples
    ///
    /// ```
    /// use keyroute_etcd::registry::Registry;
    /// let r = Registry::from_url("etcd://127.0.0.1:2379/keyroute/pools/thumbs/workers/")?;
    /// assert_eq!(r.prefix(), "/keyroute/pools/thumbs/workers/");
    /// assert!(Registry::from_url("etcd://127.0.0.1:2379/no-trailing-slash").is_err());
    /// # Ok::<(), keyroute_etcd::registry::UrlError>(())
    /// ```
    pub fn from_url(url: &str) -> Result<Registry, UrlError> {
        let bad = |why| UrlError { url: url.to_owned(), why };
        let rest = url.strip_prefix("etcd://").ok_or_else(|| bad(UrlProblem::Scheme))?;
        let (hosts, path) = rest.split_once('/').ok_or_else(|| bad(UrlProblem::NoPrefix))?;
        let prefix = format!("/{path}");
        if prefix.len() < 2 || !prefix.ends_with('/') {
            return Err(bad(UrlProblem::NoSlash));
        }
        let endpoints: Vec<&str> = hosts.split(',').collect();
        Registry::new(&endpoints, &prefix).map_err(|e| bad(UrlProblem::Endpoint(e)))
    }

    /// The prefix.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// The client.
    pub fn client(&self) -> &Client {
        &self.client
    }

    /// The key of a worker.
    pub fn key(&self, name: &str) -> Vec<u8> {
        format!("{}{name}", self.prefix).into_bytes()
    }

    /// Every record under the prefix, by name, and the revision they were read at.
    ///
    /// # Errors
    ///
    /// etcd is unreachable.
    pub async fn list(&self) -> Result<(i64, Vec<Listed>), EtcdError> {
        let range = self.client.range_prefix(self.prefix.as_bytes()).await?;
        let listed = range
            .kvs
            .into_iter()
            .map(|kv| Listed {
                name: String::from_utf8_lossy(&kv.key[self.prefix.len().min(kv.key.len())..]).into_owned(),
                record: serde_json::from_slice(&kv.value).map_err(std::sync::Arc::new),
                lease: kv.lease,
                mod_revision: kv.mod_revision,
            })
            .collect();
        Ok((range.revision, listed))
    }

    /// Adds a worker's record (with a lease, if not 0), only if no record has its name. Returns
    /// the revision written.
    ///
    /// # Errors
    ///
    /// The name exists, or etcd is unreachable.
    pub async fn add(&self, name: &str, record: &WorkerRecord, lease: i64) -> Result<i64, ChangeError> {
        match self.client.put_if_unchanged(&self.key(name), &record.to_json(), 0, lease).await? {
            Some(revision) => Ok(revision),
            None => Err(ChangeError::Exists(name.to_owned())),
        }
    }

    /// Removes a worker's record. Returns the revision of the removal.
    ///
    /// # Errors
    ///
    /// No such record, or etcd is unreachable.
    pub async fn remove(&self, name: &str) -> Result<i64, ChangeError> {
        self.client.delete(&self.key(name)).await?.ok_or_else(|| ChangeError::Unknown(name.to_owned()))
    }

    /// Edits a worker's record (keeping its lease), compare-and-swap on its last revision,
    /// retried a few times if it changes meanwhile. Returns the revision written.
    ///
    /// # Errors
    ///
    /// No such record, one that is not valid JSON, one that keeps changing, or etcd is
    /// unreachable.
    pub async fn update(&self, name: &str, edit: impl Fn(&mut WorkerRecord)) -> Result<i64, ChangeError> {
        let key = self.key(name);
        for _ in 0..5 {
            let Some(kv) = self.client.get(&key).await? else { return Err(ChangeError::Unknown(name.to_owned())) };
            let mut record: WorkerRecord = serde_json::from_slice(&kv.value)
                .map_err(|error| ChangeError::Invalid { name: name.to_owned(), error })?;
            edit(&mut record);
            if let Some(revision) =
                self.client.put_if_unchanged(&key, &record.to_json(), kv.mod_revision, kv.lease).await?
            {
                return Ok(revision);
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        Err(ChangeError::Contended(name.to_owned()))
    }

    /// Marks a worker draining: gateways send it no new request, and its keys go on along their
    /// rankings. Returns the revision written.
    ///
    /// # Errors
    ///
    /// As [`Registry::update`].
    pub async fn drain(&self, name: &str) -> Result<i64, ChangeError> {
        self.update(name, |r| r.state = RecordState::Draining).await
    }

    /// Sets a worker's weight. Returns the revision written.
    ///
    /// # Errors
    ///
    /// As [`Registry::update`].
    pub async fn set_weight(&self, name: &str, weight: u32) -> Result<i64, ChangeError> {
        self.update(name, |r| r.weight = i64::from(weight)).await
    }
}
