//! Failed admin token attempts, counted per client address, and the key clients are counted
//! under (token failures, feed subscriptions).

use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::time::Instant;

/// Failed admin token attempts, per client address: more than [`AUTH_FAILURES`] in
/// [`AUTH_WINDOW`] and the address gets 429 until the window ends.
#[derive(Debug, Default)]
pub(crate) struct AuthThrottle {
    by_ip: Mutex<std::collections::HashMap<IpAddr, (u32, Instant)>>,
    pub(crate) failures: AtomicU64,
}

/// Failed token attempts allowed per address and window.
pub(crate) const AUTH_FAILURES: u32 = 10;
/// The window.
pub(crate) const AUTH_WINDOW: Duration = Duration::from_secs(60);

/// The key a client is counted under (token failures, feed subscriptions): the address, or its
/// /64 for IPv6 (one host usually has a whole /64 to send from).
pub(crate) fn client_key(ip: IpAddr) -> IpAddr {
    match ip.to_canonical() {
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(std::net::Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
        v4 => v4,
    }
}

/// The most addresses the throttle remembers. Past it, expired entries are dropped first, then
/// the oldest of those not blocked; a blocked address is never forgotten to make room (failures
/// from other addresses must not lift its block). When every entry is blocked, failures from
/// addresses not in the table are counted together under [`OVERFLOW`], which blocks them all
/// after [`AUTH_FAILURES`]: an attacker with more addresses than the table is throttled as one.
/// A valid token is still never learnt this way: a throttled address gets 429 for a wrong token
/// whatever it sends.
const THROTTLE_ENTRIES: usize = 10_000;

/// The key of the shared bucket of addresses the full table has no room for.
const OVERFLOW: IpAddr = IpAddr::V6(std::net::Ipv6Addr::UNSPECIFIED);

impl AuthThrottle {
    /// Whether `ip` is over its failures now (or the shared bucket is, when `ip` has no entry of
    /// its own in a full table).
    pub(crate) fn blocked(&self, ip: IpAddr, now: Instant) -> bool {
        let map = self.by_ip.lock();
        let over = |key: &IpAddr| {
            map.get(key).is_some_and(|(n, since)| *n >= AUTH_FAILURES && now.duration_since(*since) < AUTH_WINDOW)
        };
        let key = client_key(ip);
        over(&key) || (!map.contains_key(&key) && map.len() >= THROTTLE_ENTRIES && over(&OVERFLOW))
    }

    /// Counts a failure from `ip`.
    pub(crate) fn fail(&self, ip: IpAddr, now: Instant) {
        self.failures.fetch_add(1, Relaxed);
        let mut map = self.by_ip.lock();
        let mut key = client_key(ip);
        if !map.contains_key(&key) && map.len() >= THROTTLE_ENTRIES {
            make_room(&mut map, now);
            if map.len() >= THROTTLE_ENTRIES {
                key = OVERFLOW;
            }
        }
        let e = map.entry(key).or_insert((0, now));
        if now.duration_since(e.1) >= AUTH_WINDOW {
            *e = (0, now);
        }
        e.0 += 1;
    }
}

/// Frees entries of a full throttle table: the expired ones, then the older half of those not
/// blocked. Blocked entries stay, and so does the [`OVERFLOW`] bucket while it counts.
fn make_room(map: &mut std::collections::HashMap<IpAddr, (u32, Instant)>, now: Instant) {
    map.retain(|_, (_, since)| now.duration_since(*since) < AUTH_WINDOW);
    if map.len() < THROTTLE_ENTRIES {
        return;
    }
    let evictable = |ip: &IpAddr, n: u32| n < AUTH_FAILURES && *ip != OVERFLOW;
    let mut open: Vec<Instant> =
        map.iter().filter(|(ip, (n, _))| evictable(ip, *n)).map(|(_, (_, since))| *since).collect();
    if open.is_empty() {
        return;
    }
    open.sort_unstable();
    let cut = open[open.len() / 2];
    map.retain(|ip, (n, since)| !evictable(ip, *n) || *since > cut);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn failed_tokens_are_throttled_per_address_and_window() {
        let t = AuthThrottle::default();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().expect("ip"), "10.0.0.2".parse().expect("ip"));
        for _ in 0..AUTH_FAILURES {
            assert!(!t.blocked(a, Instant::now()));
            t.fail(a, Instant::now());
        }
        assert!(t.blocked(a, Instant::now()));
        assert!(!t.blocked(b, Instant::now()));
        // IPv6 addresses of one /64 count together; an IPv4-mapped address is its IPv4 one.
        let v6: IpAddr = "2001:db8:1:2::1".parse().expect("ip");
        for _ in 0..AUTH_FAILURES {
            t.fail(v6, Instant::now());
        }
        assert!(t.blocked("2001:db8:1:2:ffff::9".parse().expect("ip"), Instant::now()));
        assert!(!t.blocked("2001:db8:1:3::1".parse().expect("ip"), Instant::now()));
        assert!(t.blocked("::ffff:10.0.0.1".parse().expect("ip"), Instant::now()));
        tokio::time::advance(AUTH_WINDOW).await;
        assert!(!t.blocked(a, Instant::now()));
        assert_eq!(t.failures.load(Relaxed), u64::from(2 * AUTH_FAILURES));
    }

    /// Issue 31, defect 15: 10,000 failures from other addresses lifted an address's block.
    #[tokio::test(start_paused = true)]
    async fn failures_from_other_addresses_do_not_lift_a_block() {
        let t = AuthThrottle::default();
        let a: IpAddr = "10.0.0.1".parse().expect("ip");
        for _ in 0..AUTH_FAILURES {
            t.fail(a, Instant::now());
        }
        for i in 0..3 * THROTTLE_ENTRIES as u32 {
            t.fail(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i)), Instant::now());
        }
        assert!(t.blocked(a, Instant::now()), "the flood lifted the block");
        assert!(t.by_ip.lock().len() <= THROTTLE_ENTRIES + 1);
        // A table full of blocked addresses: the rest are throttled together.
        let t = AuthThrottle::default();
        for i in 0..THROTTLE_ENTRIES as u32 {
            for _ in 0..AUTH_FAILURES {
                t.fail(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000 + i)), Instant::now());
            }
        }
        let (x, y): (IpAddr, IpAddr) = ("10.9.9.9".parse().expect("ip"), "10.9.9.8".parse().expect("ip"));
        for _ in 0..AUTH_FAILURES {
            assert!(!t.blocked(x, Instant::now()));
            t.fail(x, Instant::now());
        }
        assert!(t.blocked(x, Instant::now()) && t.blocked(y, Instant::now()));
        assert!(t.blocked(IpAddr::V4(std::net::Ipv4Addr::from(0x0b00_0000)), Instant::now()));
    }
}
