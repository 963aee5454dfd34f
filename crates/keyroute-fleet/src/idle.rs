//! What a client connection waits for besides its next bytes: a deadline (an HTTP/1.1
//! connection's head timer) and the server's stop, held by its thread for all of its connections.
//!
//! An idle connection should cost its socket and its registration and little else (issue 33). A
//! tokio `Sleep` is 112 bytes inside each connection's task and a wait on a `watch` channel 160
//! more; here a connection holds an [`IdleTimer`] (a registry handle and a slot number, 16 bytes)
//! and its thread's registry holds one slot per connection: a deadline, a waker and whether the
//! deadline has passed. One driver task per registry sleeps until the earliest deadline (no
//! sooner than [`GRAIN`] after its last pass, so that connections whose deadlines are spread out
//! cost one pass per grain, not one wake-up each), marks and wakes the connections whose
//! deadline has passed, and wakes every connection when the gateway stops.
//!
//! So a head timeout fires up to [`GRAIN`] late, and resetting a timer (after each response) is
//! a store, not a reinsertion in a timer wheel; a wait reads no clock. A pass looks at every slot: about a nanosecond a
//! connection, at most one pass a grain, and none while no connection waits.
//!
//! A registry serves one stop channel (one gateway); a thread running several gateways (tests)
//! has one registry per gateway. The registry is reached from the connection through an `Arc`,
//! so a task that moves to another thread (a multi-threaded runtime) keeps its slot.

use std::cell::RefCell;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use tokio::sync::watch;
use tokio::time::Instant;

/// The shortest time between two passes of a registry's driver: how late a timer may fire.
pub const GRAIN: Duration = Duration::from_millis(50);

/// Why an idle wait ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// The timer's deadline passed.
    Deadline,
    /// The gateway stops.
    Stop,
}

/// A connection's place in its registry.
struct Slot {
    /// `None`: the stop only.
    deadline: Option<Instant>,
    /// Set while the connection waits.
    waker: Option<Waker>,
    /// The driver found the deadline passed (cleared when it is moved).
    fired: bool,
}

#[derive(Default)]
struct Slots {
    slots: Vec<Option<Slot>>,
    free: Vec<u32>,
    /// Slots in use.
    used: usize,
    /// The stop channel said stop (or its sender is gone).
    stopped: bool,
    /// The driver runs; it passes next at `planned`, or when `poked` (through `driver`).
    running: bool,
    planned: Option<Instant>,
    poked: bool,
    driver: Option<Waker>,
}

/// One gateway's idle connections on one thread (see the [module documentation](self)).
struct Registry {
    slots: Mutex<Slots>,
    stop: watch::Receiver<bool>,
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry").finish_non_exhaustive()
    }
}

thread_local! {
    /// This thread's registries, one per stop channel.
    static REGISTRIES: RefCell<Vec<Arc<Registry>>> = const { RefCell::new(Vec::new()) };
}

impl Registry {
    fn lock(&self) -> MutexGuard<'_, Slots> {
        self.slots.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// This thread's registry for `stop`, made on first use.
    fn of(stop: &watch::Receiver<bool>) -> Arc<Registry> {
        let made = || Arc::new(Registry { slots: Mutex::new(Slots::default()), stop: stop.clone() });
        REGISTRIES
            .try_with(|r| {
                let mut r = r.borrow_mut();
                // A gateway that is gone (its channel closed) and whose connections are all gone
                // leaves its registry here: dropped on the next lookup.
                r.retain(|g| g.stop.has_changed().is_ok() || g.lock().used > 0);
                if let Some(g) = r.iter().find(|g| g.stop.same_channel(stop)) {
                    return Arc::clone(g);
                }
                let g = made();
                r.push(Arc::clone(&g));
                g
            })
            .unwrap_or_else(|_| made())
    }
}

/// A connection's head timer and stop signal (see the [module documentation](self)).
#[derive(Debug)]
pub struct IdleTimer {
    registry: Arc<Registry>,
    slot: u32,
}

impl IdleTimer {
    /// A timer that fires at `deadline` (never, if `None`: a wait for the stop only), in this
    /// thread's registry for the server whose stop channel is `stop`.
    pub fn new(deadline: Option<Instant>, stop: &watch::Receiver<bool>) -> IdleTimer {
        let registry = Registry::of(stop);
        let slot = {
            let mut s = registry.lock();
            s.used += 1;
            wake_driver_before(&mut s, deadline);
            let entry = Some(Slot { deadline, waker: None, fired: false });
            match s.free.pop() {
                Some(i) => {
                    s.slots[i as usize] = entry;
                    i
                }
                None => {
                    s.slots.push(entry);
                    (s.slots.len() - 1) as u32
                }
            }
        };
        let timer = IdleTimer { registry, slot };
        timer.start_driver();
        timer
    }

    /// Moves the deadline.
    pub fn reset(&mut self, deadline: Option<Instant>) {
        let mut s = self.registry.lock();
        if let Some(Some(slot)) = s.slots.get_mut(self.slot as usize) {
            slot.deadline = deadline;
            slot.fired = false;
        }
        wake_driver_before(&mut s, deadline);
    }

    /// Whether the server stops (as its driver last saw the stop channel).
    pub fn stopping(&self) -> bool {
        self.registry.lock().stopped
    }

    /// Waits for the deadline, or for the server's stop when `stop_ends` (a connection with a
    /// request half-read waits for its deadline only).
    pub async fn wait(&mut self, stop_ends: bool) -> Woke {
        std::future::poll_fn(|cx| self.poll_wait(cx, stop_ends)).await
    }

    /// [`IdleTimer::wait`] as a poll, for a wait that is one `poll_fn` with a socket's readiness.
    pub fn poll_wait(&mut self, cx: &mut Context<'_>, stop_ends: bool) -> Poll<Woke> {
        let mut s = self.registry.lock();
        if stop_ends && s.stopped {
            return Poll::Ready(Woke::Stop);
        }
        let Some(Some(slot)) = s.slots.get_mut(self.slot as usize) else { return Poll::Ready(Woke::Deadline) };
        if slot.fired {
            slot.waker = None;
            return Poll::Ready(Woke::Deadline);
        }
        match &mut slot.waker {
            Some(w) => w.clone_from(cx.waker()),
            None => slot.waker = Some(cx.waker().clone()),
        }
        Poll::Pending
    }

    /// Spawns the registry's driver if it is not running (it ends when no connection is left).
    fn start_driver(&self) {
        let mut s = self.registry.lock();
        if s.running {
            return;
        }
        // Outside a runtime there is nothing to drive (and nothing to wake).
        let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
        s.running = true;
        s.planned = None;
        s.poked = false;
        drop(s);
        let registry = Arc::clone(&self.registry);
        handle.spawn(drive(registry));
    }
}

impl Drop for IdleTimer {
    fn drop(&mut self) {
        let mut s = self.registry.lock();
        if let Some(entry) = s.slots.get_mut(self.slot as usize)
            && entry.take().is_some()
        {
            s.used -= 1;
            s.free.push(self.slot);
            if s.used == 0 {
                // The driver ends rather than sleep on for nobody.
                poke(&mut s);
            }
        }
    }
}

/// Wakes the driver if it sleeps past `deadline` (a shorter timeout than the others', or the
/// first deadline after all had passed).
fn wake_driver_before(s: &mut Slots, deadline: Option<Instant>) {
    let Some(deadline) = deadline else { return };
    if s.planned.is_none_or(|p| deadline < p) {
        poke(s);
    }
}

/// Makes the driver pass again now.
fn poke(s: &mut Slots) {
    s.poked = true;
    if let Some(w) = s.driver.take() {
        w.wake();
    }
}

/// Marks the registry's driver stopped when the runtime drops its task (a later connection on
/// this thread then starts another). A driver that ends by itself says so under the lock it
/// found no connection under, so that a connection registered right after starts a new one.
struct Running {
    registry: Arc<Registry>,
    ended: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        if !self.ended {
            end(&mut self.registry.lock());
        }
    }
}

/// The registry has no driver now.
fn end(s: &mut Slots) {
    s.running = false;
    s.planned = None;
    s.driver = None;
}

/// A registry's driver: a pass (waking the connections whose deadline passed, and all of them
/// when the stop comes), then a sleep until the earliest deadline left (at least [`GRAIN`] on),
/// the stop, or a poke (a shorter deadline, the last connection gone); until no connection is
/// left.
async fn drive(registry: Arc<Registry>) {
    let mut running = Running { registry: Arc::clone(&registry), ended: false };
    let mut stop = registry.stop.clone();
    let mut stop_open = true;
    loop {
        let now = Instant::now();
        // A sender that is gone stops its connections too.
        let stopping = !stop_open || *stop.borrow_and_update();
        let next = {
            let mut s = registry.lock();
            if s.used == 0 {
                end(&mut s);
                running.ended = true;
                break;
            }
            let newly = stopping && !s.stopped;
            s.stopped = stopping;
            s.poked = false;
            let mut next: Option<Instant> = None;
            for slot in s.slots.iter_mut().flatten() {
                let due = slot.deadline.is_some_and(|d| d <= now);
                slot.fired |= due;
                if (due || newly)
                    && let Some(w) = slot.waker.take()
                {
                    w.wake();
                }
                if let Some(d) = slot.deadline.filter(|&d| d > now) {
                    next = Some(next.map_or(d, |n| n.min(d)));
                }
            }
            let next = next.map(|n| n.max(now + GRAIN));
            s.planned = next;
            next
        };
        let sleep = async {
            match next {
                Some(at) => tokio::time::sleep_until(at).await,
                None => std::future::pending().await,
            }
        };
        let poked = std::future::poll_fn(|cx| {
            let mut s = registry.lock();
            if std::mem::take(&mut s.poked) {
                return Poll::Ready(());
            }
            s.driver = Some(cx.waker().clone());
            Poll::Pending
        });
        tokio::select! {
            () = sleep => {}
            () = poked => {}
            changed = stop.changed(), if !stopping => stop_open = changed.is_ok(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn channel() -> (watch::Sender<bool>, watch::Receiver<bool>) {
        watch::channel(false)
    }

    #[tokio::test(start_paused = true)]
    async fn a_timer_fires_at_its_deadline_within_the_grain() {
        let (_tx, rx) = channel();
        let start = Instant::now();
        let mut t = IdleTimer::new(Some(start + Duration::from_secs(2)), &rx);
        assert_eq!(t.wait(true).await, Woke::Deadline);
        let took = start.elapsed();
        assert!(took >= Duration::from_secs(2) && took <= Duration::from_secs(2) + GRAIN, "{took:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn a_reset_moves_the_deadline_both_ways() {
        let (_tx, rx) = channel();
        let start = Instant::now();
        let mut t = IdleTimer::new(Some(start + Duration::from_secs(1)), &rx);
        t.reset(Some(start + Duration::from_secs(5)));
        assert_eq!(t.wait(true).await, Woke::Deadline);
        assert!(start.elapsed() >= Duration::from_secs(5));
        // A shorter deadline than the driver planned for wakes it early.
        let mut long = IdleTimer::new(Some(Instant::now() + Duration::from_secs(60)), &rx);
        let mut short = IdleTimer::new(Some(Instant::now() + Duration::from_secs(60)), &rx);
        let at = Instant::now();
        let waits = tokio::spawn(async move {
            let woke = long.wait(true).await;
            (woke, long)
        });
        tokio::time::sleep(Duration::from_millis(10)).await;
        short.reset(Some(Instant::now() + Duration::from_millis(300)));
        assert_eq!(short.wait(true).await, Woke::Deadline);
        let took = at.elapsed();
        assert!(took < Duration::from_millis(300) + 2 * GRAIN, "{took:?}");
        assert!(!waits.is_finished(), "the other timer is not due");
        waits.abort();
    }

    #[tokio::test(start_paused = true)]
    async fn the_stop_wakes_the_idle_but_not_a_half_read_head() {
        let (tx, rx) = channel();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut idle = IdleTimer::new(Some(deadline), &rx);
        let mut reading = IdleTimer::new(Some(deadline), &rx);
        let a = tokio::spawn(async move { idle.wait(true).await });
        let b = tokio::spawn(async move { (reading.wait(false).await, Instant::now()) });
        tokio::time::sleep(Duration::from_secs(1)).await;
        let stopped_at = Instant::now();
        tx.send_replace(true);
        assert_eq!(a.await.ok(), Some(Woke::Stop));
        assert!(stopped_at.elapsed() < GRAIN);
        let (woke, at) = b.await.expect("the second waiter");
        assert_eq!(woke, Woke::Deadline);
        assert!(at >= deadline);
        // A timer made after the stop sees it at once.
        let mut late = IdleTimer::new(Some(Instant::now() + Duration::from_secs(30)), &rx);
        assert_eq!(late.wait(true).await, Woke::Stop);
    }

    #[tokio::test(start_paused = true)]
    async fn slots_are_reused_and_the_driver_ends_with_the_last_connection() {
        let (_tx, rx) = channel();
        let registry = Registry::of(&rx);
        let timers: Vec<IdleTimer> =
            (0..100).map(|i| IdleTimer::new(Some(Instant::now() + Duration::from_secs(10 + i)), &rx)).collect();
        assert_eq!(registry.lock().used, 100);
        assert!(registry.lock().running);
        drop(timers);
        assert_eq!(registry.lock().used, 0);
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert!(!registry.lock().running, "no connection left: the driver ended");
        let mut again = IdleTimer::new(Some(Instant::now() + Duration::from_secs(1)), &rx);
        assert_eq!(registry.lock().slots.len(), 100, "a freed slot is reused");
        assert_eq!(again.wait(true).await, Woke::Deadline, "a new driver started");
    }

    #[tokio::test(start_paused = true)]
    async fn a_wait_without_a_deadline_ends_at_the_stop_only() {
        let (tx, rx) = channel();
        let mut t = IdleTimer::new(None, &rx);
        let waits = tokio::spawn(async move { t.wait(true).await });
        tokio::time::sleep(Duration::from_secs(3600)).await;
        assert!(!waits.is_finished());
        assert!(!IdleTimer::new(None, &rx).stopping());
        tx.send_replace(true);
        assert_eq!(waits.await.ok(), Some(Woke::Stop));
        assert!(IdleTimer::new(None, &rx).stopping());
    }

    #[tokio::test(start_paused = true)]
    async fn two_gateways_on_one_thread_keep_their_own_stops() {
        let (tx1, rx1) = channel();
        let (_tx2, rx2) = channel();
        let deadline = Instant::now() + Duration::from_secs(30);
        let mut one = IdleTimer::new(Some(deadline), &rx1);
        let mut two = IdleTimer::new(Some(deadline), &rx2);
        tx1.send_replace(true);
        assert_eq!(one.wait(true).await, Woke::Stop);
        assert_eq!(two.wait(true).await, Woke::Deadline);
    }
}
