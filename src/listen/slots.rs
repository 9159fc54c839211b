//! A listener's connection slots. A listener holds at most `max_connections` connections; at
//! the cap the one idle longest (no request in progress) is closed to admit the new one, and
//! only when every connection has a request in progress is the new one refused. A connection
//! idle for longer than the idle timeout is closed as well.
//!
//! A connection's request count and idle stamp are atomics of its own, so a request touches
//! its own connection and one shared counter, and reads no clock; the set of slots is locked
//! only to admit, to end a connection, and for the sweep of idle ones. Idle order is a counter
//! of requests ended (exact); idle time is counted in sweeps (the sweep runs every quarter of
//! the timeout, so a connection closes between one timeout and a quarter more after its last
//! answer).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::metrics::{ConnectionCounts, Shed};

/// The slots of one listener.
pub struct Slots {
    cap: usize,
    idle_timeout: Duration,
    /// Idle stamps: shared by the slots' connections, so any two compare.
    clock: Arc<IdleClock>,
    open: Mutex<Open>,
    counts: ConnectionCounts,
}

/// When a connection became idle, as two counters: `order` counts the requests ended (and the
/// connections admitted), `sweeps` counts the sweeps.
#[derive(Default)]
struct IdleClock {
    order: AtomicU64,
    sweeps: AtomicU64,
}

impl IdleClock {
    /// Stamps `conn` idle from now.
    fn stamp(&self, conn: &Conn) {
        let order = self.order.fetch_add(1, Ordering::Relaxed);
        conn.idle_order.store(order, Ordering::Release);
        conn.idle_sweep
            .store(self.sweeps.load(Ordering::Relaxed), Ordering::Release);
    }
}

#[derive(Default)]
struct Open {
    next_id: u64,
    conns: HashMap<u64, Arc<Conn>>,
}

/// What a connection shares with its slots: whether it is busy, since when it is idle, and the
/// signal that closes it.
#[derive(Default)]
pub struct Conn {
    /// Requests in progress.
    busy: AtomicU32,
    /// When the last request ended (or the connection was admitted), on the [`IdleClock`].
    idle_order: AtomicU64,
    idle_sweep: AtomicU64,
    close: Notify,
}

impl Conn {
    /// Resolves once the listener wants this connection closed (it was shed). The connection
    /// then stops taking requests and ends when the one in progress, if any, is answered.
    pub async fn closing(&self) {
        self.close.notified().await;
    }
}

/// A connection's place among the slots; dropping it frees the slot.
pub struct Slot {
    slots: Arc<Slots>,
    id: u64,
    pub conn: Arc<Conn>,
}

impl Slot {
    /// What a request holds while it is in progress on this connection.
    pub fn requests(&self) -> Requests {
        Requests {
            conn: self.conn.clone(),
            clock: self.slots.clock.clone(),
        }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut open = self.slots.lock();
        // A shed connection's slot was handed to a new one already.
        if open.conns.remove(&self.id).is_some() {
            self.slots.counts.open(-1);
        }
    }
}

/// Marks the requests of one connection in progress; cheap to clone into each request.
#[derive(Clone)]
pub struct Requests {
    conn: Arc<Conn>,
    clock: Arc<IdleClock>,
}

impl Requests {
    /// Marks a request in progress until the returned guard drops.
    pub fn begin(&self) -> Busy {
        self.conn.busy.fetch_add(1, Ordering::AcqRel);
        Busy(self.clone())
    }
}

/// A request in progress on a connection.
pub struct Busy(Requests);

impl Drop for Busy {
    fn drop(&mut self) {
        self.0.clock.stamp(&self.0.conn);
        self.0.conn.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slots {
    pub fn new(cap: usize, idle_timeout: Duration, counts: ConnectionCounts) -> Arc<Slots> {
        Arc::new(Slots {
            cap,
            idle_timeout,
            clock: Arc::default(),
            open: Mutex::new(Open::default()),
            counts,
        })
    }

    /// A slot for a new connection: a free one, or the slot of the connection idle longest,
    /// which is told to close. `None` when every connection has a request in progress: the new
    /// one is refused (and counted so).
    pub fn admit(self: &Arc<Slots>) -> Option<Slot> {
        let mut open = self.lock();
        if open.conns.len() >= self.cap {
            let idlest = open
                .conns
                .iter()
                .filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, c)| c.idle_order.load(Ordering::Acquire))
                .map(|(id, _)| *id);
            let Some(id) = idlest else {
                drop(open);
                self.counts.refused();
                return None;
            };
            if let Some(shed) = open.conns.remove(&id) {
                shed.close.notify_one();
                self.counts.shed(Shed::Cap);
                self.counts.open(-1);
            }
        }
        let id = open.next_id;
        open.next_id += 1;
        let conn = Arc::new(Conn::default());
        self.clock.stamp(&conn);
        open.conns.insert(id, conn.clone());
        drop(open);
        self.counts.open(1);
        Some(Slot {
            slots: self.clone(),
            id,
            conn,
        })
    }

    /// One sweep, run every [`Slots::sweep_every`]: closes every connection idle for the idle
    /// timeout, that is stamped more sweeps ago than the timeout holds (a connection stamped
    /// between two sweeps has been idle for at least that many whole intervals); returns how
    /// many.
    pub fn sweep(&self) -> usize {
        let now = self.clock.sweeps.fetch_add(1, Ordering::Relaxed) + 1;
        let every = self.sweep_every().as_nanos().max(1);
        let timeout = self.idle_timeout.as_nanos().div_ceil(every) as u64;
        let mut open = self.lock();
        let expired: Vec<u64> = open
            .conns
            .iter()
            .filter(|(_, c)| {
                c.busy.load(Ordering::Acquire) == 0
                    && now.saturating_sub(c.idle_sweep.load(Ordering::Acquire)) > timeout
            })
            .map(|(id, _)| *id)
            .collect();
        for id in &expired {
            if let Some(shed) = open.conns.remove(id) {
                shed.close.notify_one();
                self.counts.shed(Shed::IdleTimeout);
                self.counts.open(-1);
            }
        }
        expired.len()
    }

    /// How often [`Slots::sweep`] runs: a quarter of the idle timeout, at least every second
    /// and at most every 10 ms, so a connection closes at most a quarter late.
    pub fn sweep_every(&self) -> Duration {
        (self.idle_timeout / 4).clamp(Duration::from_millis(10), Duration::from_secs(1))
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.open.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn slots(cap: usize, idle_timeout: Duration) -> Arc<Slots> {
        Slots::new(cap, idle_timeout, ConnectionCounts::default())
    }

    #[tokio::test]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let slots = slots(3, Duration::from_secs(60));
        let first = slots.admit().expect("free slot");
        let second = slots.admit().expect("free slot");
        let third = slots.admit().expect("free slot");
        // The first is busy; of the two idle ones, the second has been idle longer than the
        // third, whose request just ended.
        let _busy = first.requests().begin();
        drop(third.requests().begin());
        let fourth = slots.admit().expect("an idle connection makes room");
        assert_eq!(slots.lock().conns.len(), 3);
        assert!(
            !slots.lock().conns.contains_key(&second.id),
            "the idlest was shed"
        );
        assert!(slots.lock().conns.contains_key(&third.id));
        assert!(slots.lock().conns.contains_key(&fourth.id));
        // The shed connection was told to close (the permit is stored for its next wait).
        tokio::time::timeout(Duration::from_secs(5), second.conn.closing())
            .await
            .expect("the shed connection is told to close");
        // Its slot is not freed twice when it ends.
        drop(second);
        assert_eq!(slots.lock().conns.len(), 3);
    }

    #[test]
    fn with_every_connection_busy_a_new_one_is_refused() {
        let slots = slots(2, Duration::from_secs(60));
        let a = slots.admit().unwrap();
        let b = slots.admit().unwrap();
        let (_a, _b) = (a.requests().begin(), b.requests().begin());
        assert!(slots.admit().is_none());
        drop(_a);
        assert!(
            slots.admit().is_some(),
            "a connection whose request ended is idle"
        );
    }

    #[test]
    fn the_sweep_closes_idle_connections_and_not_busy_ones() {
        // Swept every 100 ms, the timeout is 4 intervals: a connection stamped between two
        // sweeps is idle for the timeout at the fifth sweep after its stamp, never before.
        let slots = slots(8, Duration::from_millis(400));
        assert_eq!(slots.sweep_every(), Duration::from_millis(100));
        let idle = slots.admit().unwrap();
        let busy = slots.admit().unwrap();
        let _request = busy.requests().begin();
        for _ in 0..4 {
            assert_eq!(slots.sweep(), 0, "not idle for the timeout yet");
        }
        assert_eq!(slots.sweep(), 1);
        assert!(!slots.lock().conns.contains_key(&idle.id));
        assert!(slots.lock().conns.contains_key(&busy.id));
        assert_eq!(slots.sweep(), 0, "nothing else expired");
    }
}
