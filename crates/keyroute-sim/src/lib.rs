//! # keyroute-sim: what moves, what overloads, what hit rate, before a fleet changes
//!
//! Deterministic simulations over the [`keyroute`] placement library, answering the questions the
//! source documents raise, on the user's own keys and traffic:
//!
//! - [`remap()`]: which keys move when nodes join, leave or change weight, and where to;
//! - [`balance()`]: how evenly a strategy spreads keys, relative to weights;
//! - [`choices()`]: balls into bins with `d` random choices (Mitzenmacher's result);
//! - [`fleet::run`]: the first document's thumbnail service as a discrete-event model: gateways,
//!   workers with LRU caches, Zipf traffic, slow workers, hot keys, membership changes, stale load
//!   views. It routes with the same [`keyroute::Policy`] the real gateway uses.
//!
//! Everything is seeded: no clock and no operating-system randomness; the same inputs give the
//! same report on every machine and at any thread count ([`fleet::run_all`] runs strategies in
//! parallel, each run itself sequential). A request log replays the user's own traffic
//! ([`trace`]).

#![deny(missing_docs)]

mod balance;
mod choices;
pub mod fleet;
mod hist;
mod keys;
mod lru;
mod remap;
pub mod report;
pub mod scenario;
pub mod trace;
mod zipf;

pub use balance::{BalanceReport, NodeShare, balance};
pub use choices::{ChoicesReport, ChoicesRow, choices};
pub use fleet::{FleetConfig, FleetReport};
pub use hist::{Histogram, LatencySummary};
pub use keys::KeySet;
pub use lru::Lru;
pub use remap::{Move, NodeCount, RemapReport, TrafficMoved, remap, remap_between};
pub use zipf::Zipf;

use std::fmt;

use keyroute::Strategy;

/// Why a simulation could not run.
#[derive(Debug)]
#[non_exhaustive]
pub enum SimError {
    /// The placement library refused the nodes or options.
    Placement(keyroute::Error),
    /// The analysis needs a strategy that places by key.
    NotByKey(Strategy),
    /// A parameter is out of range.
    Invalid(String),
}

impl fmt::Display for SimError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SimError::Placement(e) => write!(f, "{e}"),
            SimError::NotByKey(s) => {
                let keyed: Vec<&str> = Strategy::ALL.iter().filter(|s| s.uses_key()).map(|s| s.name()).collect();
                write!(
                    f,
                    "strategy '{s}' does not place by key (choose one of: {}, or a compatibility mode)",
                    keyed.join(", ")
                )
            }
            SimError::Invalid(why) => write!(f, "invalid parameter: {why}"),
        }
    }
}

impl std::error::Error for SimError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            SimError::Placement(e) => Some(e),
            _ => None,
        }
    }
}

impl From<keyroute::Error> for SimError {
    fn from(e: keyroute::Error) -> Self {
        SimError::Placement(e)
    }
}
