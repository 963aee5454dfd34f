//! Health as pure state machines, fed by observations; the probing itself is a separate task
//! (`prober.rs`) so that these can be table-tested without a network or a clock.
//!
//! - [`HealthMachine`]: active checks with `rise`/`fall` hysteresis (HAProxy's model): a healthy
//!   worker becomes unhealthy after `fall` consecutive failed probes, and healthy again after `rise`
//!   consecutive successes.
//! - [`Ejector`]: passive ejection (Envoy's outlier detection): `threshold` consecutive failures
//!   (connect errors, timeouts, stalls, 5xx, bodies cut short) eject a worker for `base`, doubling
//!   with each ejection in a row up to `max`; a success after an ejection resets the streak.

mod eject;
mod machine;

pub use self::eject::Ejector;
pub use self::machine::{HealthMachine, Transition};
