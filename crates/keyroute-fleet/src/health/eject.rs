//! Passive ejection (Envoy's outlier detection): `threshold` consecutive failures (connect
//! errors, timeouts, stalls, 5xx, bodies cut short) eject a worker for `base`, doubling with each
//! ejection in a row up to `max`; a success resets the streak. Pure: fed outcomes, it returns
//! ejection lengths; the caller keeps the clock.

use std::time::Duration;

/// Passive ejection. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct Ejector {
    threshold: u32,
    base: Duration,
    max: Duration,
    failures: u32,
    in_a_row: u32,
}

impl Ejector {
    /// `threshold` consecutive failures eject for `base`, doubling per ejection in a row up to `max`.
    /// A threshold of 0 never ejects.
    pub fn new(threshold: u32, base: Duration, max: Duration) -> Self {
        Ejector { threshold, base, max, failures: 0, in_a_row: 0 }
    }

    /// Feeds one request outcome (`ok` = neither a connect error nor a 5xx). Returns how long to
    /// eject the worker for, if this outcome ejects it.
    pub fn observe(&mut self, ok: bool) -> Option<Duration> {
        if ok {
            self.failures = 0;
            self.in_a_row = 0;
            return None;
        }
        if self.threshold == 0 {
            return None;
        }
        self.failures += 1;
        if self.failures < self.threshold {
            return None;
        }
        self.failures = 0;
        let factor = 1u32.checked_shl(self.in_a_row).unwrap_or(u32::MAX);
        self.in_a_row = self.in_a_row.saturating_add(1);
        Some(self.base.saturating_mul(factor).min(self.max))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ejections_double_and_cap_and_reset() {
        let mut e = Ejector::new(2, Duration::from_secs(1), Duration::from_secs(5));
        assert_eq!(e.observe(false), None);
        assert_eq!(e.observe(false), Some(Duration::from_secs(1)));
        assert_eq!(e.observe(false), None);
        assert_eq!(e.observe(false), Some(Duration::from_secs(2)));
        e.observe(false);
        assert_eq!(e.observe(false), Some(Duration::from_secs(4)));
        e.observe(false);
        assert_eq!(e.observe(false), Some(Duration::from_secs(5)));
        assert_eq!(e.observe(true), None);
        e.observe(false);
        assert_eq!(e.observe(false), Some(Duration::from_secs(1)));
        let mut never = Ejector::new(0, Duration::from_secs(1), Duration::from_secs(1));
        assert!((0..10).all(|_| never.observe(false).is_none()));
    }
}
