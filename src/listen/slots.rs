//! A listener's connection slots. A listener holds at most `max_connections` connections; at
//! the cap the one idle longest (no request in progress) is closed to admit the new one, and
//! only when every connection has a request in progress is the new one refused. A connection
//! idle for longer than the idle timeout is closed as well.
//!
//! A connection's request count and idle time are atomics of its own, so a request only
//! touches its own connection; the set of slots is locked only to admit, to end a connection,
//! and for the sweep of idle ones.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::metrics::{ConnectionCounts, Shed};

/// The slots of one listener.
pub struct Slots {
    cap: usize,
    idle_timeout: Duration,
    /// Idle times are kept as milliseconds since this instant (tokio's clock, so tests can
    /// move it).
    epoch: Instant,
    open: Mutex<Open>,
    counts: ConnectionCounts,
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
    /// When the last request ended (or the connection was admitted), in ms since `epoch`.
    idle_since_ms: AtomicU64,
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
            epoch: self.slots.epoch,
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
    epoch: Instant,
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
        let conn = &self.0.conn;
        let now = self.0.epoch.elapsed().as_millis() as u64;
        conn.idle_since_ms.store(now, Ordering::Release);
        conn.busy.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Slots {
    pub fn new(cap: usize, idle_timeout: Duration, counts: ConnectionCounts) -> Arc<Slots> {
        Arc::new(Slots {
            cap,
            idle_timeout,
            epoch: Instant::now(),
            open: Mutex::new(Open::default()),
            counts,
        })
    }

    /// A slot for a new connection: a free one, or the slot of the connection idle longest,
    /// which is told to close. `None` when every connection has a request in progress: the new
    /// one is refused (and counted so).
    pub fn admit(self: &Arc<Slots>) -> Option<Slot> {
        let now = self.now_ms();
        let mut open = self.lock();
        if open.conns.len() >= self.cap {
            let idlest = open
                .conns
                .iter()
                .filter(|(_, c)| c.busy.load(Ordering::Acquire) == 0)
                .min_by_key(|(_, c)| c.idle_since_ms.load(Ordering::Acquire))
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
        let conn = Arc::new(Conn {
            idle_since_ms: AtomicU64::new(now),
            ..Conn::default()
        });
        open.conns.insert(id, conn.clone());
        drop(open);
        self.counts.open(1);
        Some(Slot {
            slots: self.clone(),
            id,
            conn,
        })
    }

    /// Closes every connection idle for longer than the idle timeout; returns how many.
    pub fn sweep(&self) -> usize {
        let now = self.now_ms();
        let timeout = self.idle_timeout.as_millis() as u64;
        let mut open = self.lock();
        let expired: Vec<u64> = open
            .conns
            .iter()
            .filter(|(_, c)| {
                c.busy.load(Ordering::Acquire) == 0
                    && now.saturating_sub(c.idle_since_ms.load(Ordering::Acquire)) >= timeout
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

    fn now_ms(&self) -> u64 {
        self.epoch.elapsed().as_millis() as u64
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

    #[tokio::test(start_paused = true)]
    async fn at_the_cap_the_longest_idle_connection_makes_room() {
        let slots = slots(3, Duration::from_secs(60));
        let first = slots.admit().expect("free slot");
        let second = slots.admit().expect("free slot");
        let third = slots.admit().expect("free slot");
        // The first is busy; of the two idle ones, the second has been idle longer than the
        // third, whose request just ended.
        let _busy = first.requests().begin();
        tokio::time::advance(Duration::from_millis(5)).await;
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

    #[tokio::test(start_paused = true)]
    async fn with_every_connection_busy_a_new_one_is_refused() {
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

    #[tokio::test(start_paused = true)]
    async fn the_sweep_closes_idle_connections_and_not_busy_ones() {
        let slots = slots(8, Duration::from_millis(20));
        let idle = slots.admit().unwrap();
        let busy = slots.admit().unwrap();
        let _request = busy.requests().begin();
        tokio::time::advance(Duration::from_millis(30)).await;
        assert_eq!(slots.sweep(), 1);
        assert!(!slots.lock().conns.contains_key(&idle.id));
        assert!(slots.lock().conns.contains_key(&busy.id));
        assert_eq!(slots.sweep(), 0, "nothing else expired");
    }
}
