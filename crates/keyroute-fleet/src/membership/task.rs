//! What every source task shares: its place on the fleet's list of running tasks, and the
//! pool's current source, read so that a task ends exactly when its pool stops using it.

use std::sync::{Arc, Weak};

use crate::Fleet;
use crate::config::MembershipConfig;
use crate::pool::Pool;

/// A source task's name on the fleet's running list, taken off when the task ends (however it
/// ends), so that a pool of the same name may get a task again.
pub(crate) struct Running {
    fleet: Weak<Fleet>,
    name: String,
    /// Cleared when the task took its name off itself (a task of the same name may be running
    /// by the time this one is dropped).
    armed: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.armed
            && let Some(f) = self.fleet.upgrade()
        {
            f.sources.lock().retain(|n| *n != self.name);
        }
    }
}

impl Running {
    /// The task called `name` (already on the list).
    pub(crate) fn new(fleet: Weak<Fleet>, name: String) -> Running {
        Running { fleet, name, armed: true }
    }

    /// The pool's source settings if they are still this task's (`mine` picks them out), or
    /// `None` when the task must end: the pool left service or uses another source now. Ending,
    /// the name comes off the list under its lock after one more look: a reload that made the
    /// pool use this source again between the first look and the lock found the name still
    /// running and started no task, so this one goes on instead.
    pub(crate) fn current<T>(&mut self, pool: &Arc<Pool>, mine: impl Fn(&MembershipConfig) -> Option<T>) -> Option<T> {
        let source = || {
            let in_service = self.fleet.upgrade().is_some_and(|f| f.pools().iter().any(|q| Arc::ptr_eq(q, pool)));
            if in_service { mine(&pool.snapshot().config().membership) } else { None }
        };
        if let Some(cfg) = source() {
            return Some(cfg);
        }
        let f = self.fleet.upgrade()?;
        let mut running = f.sources.lock();
        match source() {
            Some(cfg) => Some(cfg),
            None => {
                running.retain(|n| *n != self.name);
                self.armed = false;
                None
            }
        }
    }
}
