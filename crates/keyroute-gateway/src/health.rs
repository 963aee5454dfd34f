//! Health as pure state machines, fed by observations; the probing itself is a separate task
//! (in the gateway's server module) so that these can be table-tested without a network or a clock.
//!
//! - [`HealthMachine`]: active checks with `rise`/`fall` hysteresis (HAProxy's model): a healthy
//!   worker becomes unhealthy after `fall` consecutive failed probes, and healthy again after `rise`
//!   consecutive successes.
//! - [`Ejector`]: passive ejection (Envoy's outlier detection): `threshold` consecutive connect errors
//!   or 5xx responses eject a worker for `base`, doubling with each ejection in a row up to `max`;
//!   a success after an ejection resets the streak.

use std::time::Duration;

/// Active-check health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    /// Taking traffic.
    Healthy,
    /// Failed its checks.
    Unhealthy,
}

/// What an observation changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transition {
    /// Nothing.
    None,
    /// Unhealthy to healthy.
    Up,
    /// Healthy to unhealthy.
    Down,
}

/// The rise/fall state machine. See the [module documentation](self).
#[derive(Clone, Debug)]
pub struct HealthMachine {
    rise: u32,
    fall: u32,
    state: Health,
    streak: u32,
}

impl HealthMachine {
    /// Starts healthy (a new worker takes traffic until its checks say otherwise).
    pub fn new(rise: u32, fall: u32) -> Self {
        HealthMachine { rise: rise.max(1), fall: fall.max(1), state: Health::Healthy, streak: 0 }
    }

    /// The current state.
    pub fn state(&self) -> Health {
        self.state
    }

    /// The same machine with new thresholds (a configuration reload); the state is kept and the
    /// current streak starts over.
    pub fn retuned(&self, rise: u32, fall: u32) -> Self {
        HealthMachine { rise: rise.max(1), fall: fall.max(1), state: self.state, streak: 0 }
    }

    /// Feeds one probe result.
    pub fn observe(&mut self, ok: bool) -> Transition {
        match (self.state, ok) {
            (Health::Healthy, true) | (Health::Unhealthy, false) => {
                self.streak = 0;
                Transition::None
            }
            (Health::Healthy, false) => {
                self.streak += 1;
                if self.streak >= self.fall {
                    self.state = Health::Unhealthy;
                    self.streak = 0;
                    Transition::Down
                } else {
                    Transition::None
                }
            }
            (Health::Unhealthy, true) => {
                self.streak += 1;
                if self.streak >= self.rise {
                    self.state = Health::Healthy;
                    self.streak = 0;
                    Transition::Up
                } else {
                    Transition::None
                }
            }
        }
    }
}

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

    /// The same ejector with new thresholds (a configuration reload); the streaks start over.
    pub fn retuned(threshold: u32, base: Duration, max: Duration) -> Self {
        Ejector::new(threshold, base, max)
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
    fn rise_and_fall_table() {
        // (observations, expected transitions)
        let cases: &[(&[bool], &[Transition])] = &[
            (&[false, false, false], &[Transition::None, Transition::None, Transition::Down]),
            (&[false, true, false, false], &[Transition::None, Transition::None, Transition::None, Transition::None]),
            (
                &[false, false, false, true, true],
                &[Transition::None, Transition::None, Transition::Down, Transition::None, Transition::Up],
            ),
            (
                &[false, false, false, true, false, true, true],
                &[
                    Transition::None,
                    Transition::None,
                    Transition::Down,
                    Transition::None,
                    Transition::None,
                    Transition::None,
                    Transition::Up,
                ],
            ),
        ];
        for (obs, expected) in cases {
            let mut m = HealthMachine::new(2, 3);
            let got: Vec<Transition> = obs.iter().map(|&ok| m.observe(ok)).collect();
            assert_eq!(&got[..], *expected, "{obs:?}");
        }
    }

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
