//! Active checks with `rise`/`fall` hysteresis (HAProxy's model): a healthy worker becomes
//! unhealthy after `fall` consecutive failed probes, and healthy again after `rise` consecutive
//! successes. Pure: fed probe results, it returns transitions; no socket, no clock.

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
///
/// It keeps the streak only: whether the worker is healthy now is the worker's own state (one
/// owner), passed in with each observation.
#[derive(Clone, Debug)]
pub struct HealthMachine {
    rise: u32,
    fall: u32,
    streak: u32,
}

impl HealthMachine {
    /// A machine with these thresholds (at least 1 each).
    pub fn new(rise: u32, fall: u32) -> Self {
        HealthMachine { rise: rise.max(1), fall: fall.max(1), streak: 0 }
    }

    /// Feeds one probe result of a worker that is `healthy` now.
    pub fn observe(&mut self, healthy: bool, ok: bool) -> Transition {
        if healthy == ok {
            // A healthy worker passing, or an unhealthy one failing: the streak starts over.
            self.streak = 0;
            return Transition::None;
        }
        self.streak += 1;
        match healthy {
            true if self.streak >= self.fall => {
                self.streak = 0;
                Transition::Down
            }
            false if self.streak >= self.rise => {
                self.streak = 0;
                Transition::Up
            }
            _ => Transition::None,
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
            let mut healthy = true;
            let got: Vec<Transition> = obs
                .iter()
                .map(|&ok| {
                    let t = m.observe(healthy, ok);
                    healthy = match t {
                        Transition::Down => false,
                        Transition::Up => true,
                        Transition::None => healthy,
                    };
                    t
                })
                .collect();
            assert_eq!(&got[..], *expected, "{obs:?}");
            let downs = got.iter().filter(|t| **t == Transition::Down).count();
            let ups = got.iter().filter(|t| **t == Transition::Up).count();
            assert_eq!(healthy, downs <= ups, "{obs:?}");
        }
    }
}
