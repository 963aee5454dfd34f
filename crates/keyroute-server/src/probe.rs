//! Which active check each pool gets: a pool a memcached or Redis listener serves is checked in
//! its protocol ([`keyroute_cacheproxy::check`]: `version`, or `PING`), any other over HTTP
//! ([`keyroute_gateway::probe::HttpCheck`]: `GET` of its health path). The fleet's prober runs
//! them on the pool's `[pool.health]` schedule.

use std::sync::Arc;

use keyroute_fleet::pool::{Check, Pool};

use crate::config::Config;

/// Sets the check of each pool of `config` (a bind or a reload), by the protocol that serves it.
pub(crate) fn set_checks(config: &Config, pools: &[Arc<Pool>]) {
    for pool in pools {
        // A pool a cache listener sends to, or a shadow of one (its copies are that protocol's).
        let serves = |c: &&keyroute_cacheproxy::CacheListener| {
            c.pools().any(|p| {
                p == pool.name
                    || config
                        .pools
                        .iter()
                        .any(|q| q.name == p && q.shadow.as_ref().is_some_and(|s| s.pool == pool.name))
            })
        };
        let check: Option<Arc<dyn Check>> = match config.cache_listeners().find(serves) {
            Some(c) => Some(keyroute_cacheproxy::check(c, pool)),
            None => config.pools.iter().zip(&config.http).find(|(p, _)| p.name == pool.name).map(|(_, http)| {
                Arc::new(keyroute_gateway::probe::HttpCheck {
                    path: http.health_path.clone(),
                    grpc_service: http.grpc_health.clone(),
                    upstream: Arc::clone(&http.upstream),
                }) as Arc<dyn Check>
            }),
        };
        pool.set_check(check);
    }
}
