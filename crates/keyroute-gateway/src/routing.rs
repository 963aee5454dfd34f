//! Routes: which pool a request goes to, by listener, host and (normalised) path prefix.

use std::sync::Arc;

use crate::config::RouteConfig;
use crate::pool::Pool;

/// The pools and each listener's routes, swapped whole on reload.
#[derive(Debug)]
pub(crate) struct Routing {
    pub(crate) pools: Vec<Arc<Pool>>,
    pub(crate) routes: Vec<Vec<RouteConfig>>,
}

impl Routing {
    /// The route and its pool for a request on `listener` with this host (without port) and
    /// normalised path.
    pub(crate) fn route(&self, listener: usize, host: Option<&str>, path: &str) -> Option<(&RouteConfig, &Arc<Pool>)> {
        self.routes.get(listener)?.iter().find_map(|r| {
            let host_ok = r.host.as_deref().is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want)));
            (host_ok && path.starts_with(&r.path_prefix)).then(|| (r, &self.pools[r.pool]))
        })
    }

    /// The pool named `name`, or the only one when no name is given.
    ///
    /// # Errors
    ///
    /// No pool has that name, or none is named and there are several.
    pub(crate) fn pool(&self, name: Option<&str>) -> Result<&Arc<Pool>, NoPool> {
        match name {
            Some(n) => self.pools.iter().find(|p| p.name == n).ok_or(NoPool::Unknown),
            None if self.pools.len() == 1 => Ok(&self.pools[0]),
            None => Err(NoPool::Ambiguous(self.pools.iter().map(|p| p.name.clone()).collect())),
        }
    }
}

/// Why [`Routing::pool`] found no pool.
#[derive(Debug, thiserror::Error)]
pub(crate) enum NoPool {
    /// No pool has the name.
    #[error("no such pool")]
    Unknown,
    /// No name, and several pools (their names).
    #[error("several pools ({}): name one with ?pool=", .0.join(", "))]
    Ambiguous(Vec<String>),
}
