//! Pool members from a membership source other than the configuration file: etcd, or DNS
//! ([`dns`]).
//!
//! Every source gives whole member sets, and the pool applies them by one function
//! ([`crate::pool`]'s `carry`: the same worker keeps its state): the configuration file (at
//! start and on every reload), the admin API of a static pool (an edit of the current set), and
//! etcd, here. The records' layout, the etcd client, writing records and a worker's
//! self-registration are the `keyroute-etcd` crate's; this module reads them into members.
//!
//! - [`record`]: the members a prefix's records give ([`members_of`]), and the records rejected.
//! - `source`: the task that reads and watches a pool's prefix and applies every change as one
//!   snapshot swap.
//! - `saved`: the last applied members on local disk, for a start while etcd is down.

pub mod dns;
pub mod record;
pub mod saved;
pub mod source;
mod task;

pub use self::record::{Rejected, members_of};
