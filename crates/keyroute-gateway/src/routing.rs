//! Routes: which pool a request goes to, by listener, host and (normalised) path prefix; and each
//! pool as the HTTP listeners see it ([`HttpPool`]): the fleet's pool with its HTTP settings and
//! its response cache.

use std::sync::Arc;

use crate::cache::HotCache;
use crate::config::{HttpPoolConfig, RouteConfig};
use keyroute_fleet::pool::Pool;

/// A pool as the HTTP listeners see it.
#[derive(Debug)]
pub struct HttpPool {
    /// The fleet's pool: members, placement, health.
    pub pool: Arc<Pool>,
    /// Its HTTP settings: the key template, the worker header, the read timeout.
    pub http: Arc<HttpPoolConfig>,
    /// Its response cache for hot keys, if on.
    pub cache: Option<Arc<HotCache>>,
}

/// The pools and each listener's routes, swapped whole on reload.
#[derive(Debug)]
pub struct Routing {
    /// Every pool with its HTTP side, in the fleet's order.
    pub pools: Vec<HttpPool>,
    /// Each HTTP listener's routes, in its order: the first that matches wins.
    pub routes: Vec<Vec<RouteConfig>>,
}

impl Routing {
    /// The pools with their HTTP settings (in the same order), keeping `old`'s response cache of a
    /// pool whose cache settings are the same.
    pub fn new(
        pools: &[Arc<Pool>],
        http: &[HttpPoolConfig],
        routes: Vec<Vec<RouteConfig>>,
        old: Option<&Routing>,
    ) -> Routing {
        let pools = pools
            .iter()
            .zip(http)
            .map(|(pool, http)| {
                let kept = old
                    .and_then(|o| o.pools.iter().find(|p| p.pool.name == pool.name))
                    .and_then(|p| p.cache.as_ref())
                    .filter(|c| Some(&c.settings) == http.cache.as_ref());
                let cache = match (kept, &http.cache) {
                    (Some(c), _) => Some(Arc::clone(c)),
                    (None, Some(settings)) => Some(Arc::new(HotCache::new(settings.clone()))),
                    (None, None) => None,
                };
                HttpPool { pool: Arc::clone(pool), http: Arc::new(http.clone()), cache }
            })
            .collect();
        Routing { pools, routes }
    }

    /// The route and its pool for a request on `listener` with this host (without port) and
    /// normalised path.
    pub fn route(&self, listener: usize, host: Option<&str>, path: &str) -> Option<(&RouteConfig, &HttpPool)> {
        self.routes.get(listener)?.iter().find_map(|r| {
            let host_ok = r.host.as_deref().is_none_or(|want| host.is_some_and(|h| h.eq_ignore_ascii_case(want)));
            (host_ok && path.starts_with(&r.path_prefix)).then(|| (r, &self.pools[r.pool]))
        })
    }

    /// The HTTP side of the pool named `name`.
    pub fn http_pool(&self, name: &str) -> Option<&HttpPool> {
        self.pools.iter().find(|p| p.pool.name == name)
    }

    /// Ends what expired in every pool's response cache (the server's ticker).
    pub fn tick(&self) {
        let now = std::time::SystemTime::now();
        for c in self.pools.iter().filter_map(|p| p.cache.as_ref()) {
            c.store.purge_expired(now);
        }
    }
}
