//! Active checks with `rise`/`fall` hysteresis (HAProxy's model): a healthy worker becomes
//! unhealthy after `fall` consecutive failed probes, and healthy again after `rise` consecutive
//! successes. Pure: fed probe results, it returns transitions; no socket, no clock.

/// Active-check health.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Health {
    /// Taking traffic.
    Healthy,
    /// Failed its checks.
    Unhealthy,
}

/// What an observation changed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Transition {
    /// Nothing.
    None,
    /// Unhealthy to healthy.
    Up,
    /// Healthy to unhealthy.
    Down,
}

/// The rise/fall state machine. See the [module documentation](self).
#[derive(Clone, Debug)]
pub(crate) struct HealthMachine {
    rise: u32,
    fall: u32,
    state: Health,
    streak: u32,
}

impl HealthMachine {
    /// Starts healthy (a new worker takes traffic until its checks say otherwise).
    pub(crate) fn new(rise: u32, fall: u32) -> Self {
        HealthMachine { rise: rise.max(1), fall: fall.max(1), state: Health::Healthy, streak: 0 }
    }

    /// The same machine with new thresholds (a configuration reload); the state is kept and the
    /// current streak starts over.
    pub(crate) fn retuned(&self, rise: u32, fall: u32) -> Self {
        HealthMachine { rise: rise.max(1), fall: fall.max(1), state: self.state, streak: 0 }
    }

    /// Feeds one probe result.
    pub(crate) fn observe(&mut self, ok: bool) -> Transition {
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
            let downs = got.iter().filter(|t| **t == Transition::Down).count();
            let ups = got.iter().filter(|t| **t == Transition::Up).count();
            let want = if downs > ups { Health::Unhealthy } else { Health::Healthy };
            assert_eq!(m.state, want, "{obs:?}");
        }
    }
}
