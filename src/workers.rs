//! The serving threads: one single-threaded runtime per core, each serving the agent
//! connections handed to it, from the first byte to the close.
//!
//! A call wakes its task several times: the agent's request arrives, the tool answers, the
//! store replies. On a multi-threaded runtime such a wake often lands on a parked worker (the
//! scheduler wakes one to share the work): a futex wake, a thread switch, the task moving to
//! another core, and back. Here a connection stays on one thread: its socket, the connections
//! to tools and to Redis its calls use (kept per thread, see [`PerThread`]) and its timers all
//! belong to that thread's runtime, so no wake crosses threads. Load is spread by connection:
//! each new one goes to the worker serving the fewest.
//!
//! Everything else (the admin and telemetry listeners, the config watcher, the trace export)
//! stays on the main runtime.

use std::cell::Cell;
use std::future::Future;
use std::num::NonZeroUsize;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use tokio::runtime::Handle;
use tokio::sync::oneshot;
use tokio::task::{AbortHandle, JoinSet};

/// The most workers started, whatever the core count. A sidecar serves one agent: past a few
/// cores more threads add no throughput it needs, while each thread keeps connections of its
/// own to every tool and every Redis primary.
pub const MAX_WORKERS: usize = 8;

thread_local! {
    /// 1 + the worker's index on a worker thread; 0 on any other.
    static SHARD: Cell<usize> = const { Cell::new(0) };
}

/// How many workers serve: the cores this process may use (its CPU affinity, its cgroup's
/// quota), at most [`MAX_WORKERS`].
pub fn count() -> usize {
    static COUNT: OnceLock<usize> = OnceLock::new();
    *COUNT.get_or_init(|| {
        std::thread::available_parallelism()
            .map_or(1, NonZeroUsize::get)
            .min(MAX_WORKERS)
    })
}

/// This thread's shard: 1 + its worker's index, or 0 off the workers.
pub fn shard() -> usize {
    SHARD.with(Cell::get)
}

/// A value kept per thread: one for each worker, and one shared by every other thread. A call
/// on a serving thread uses the value of its own thread, so the connections it holds wake that
/// thread and no lock it takes is contended.
pub struct PerThread<T> {
    values: Box<[T]>,
}

impl<T> PerThread<T> {
    /// One value from `make` for each worker [`count`] allows, and one for the other threads.
    pub fn new(make: impl FnMut() -> T) -> PerThread<T> {
        PerThread {
            values: std::iter::repeat_with(make).take(count() + 1).collect(),
        }
    }

    /// This thread's value.
    pub fn get(&self) -> &T {
        &self.values[shard() % self.values.len()]
    }

    /// Every thread's value.
    pub fn iter(&self) -> impl Iterator<Item = &T> {
        self.values.iter()
    }
}

/// The running workers. Dropping this stops them: each drops the tasks it still has.
pub struct Workers {
    workers: Vec<Worker>,
}

struct Worker {
    handle: Handle,
    /// Connections it serves now.
    open: Arc<AtomicUsize>,
    /// Dropped with the worker: its thread's runtime then returns and is dropped there.
    _stop: oneshot::Sender<()>,
}

impl Workers {
    /// Starts `n` workers (at least one), each a thread running a single-threaded runtime.
    pub fn start(n: usize) -> std::io::Result<Workers> {
        let mut workers = Vec::with_capacity(n.max(1));
        for index in 0..n.clamp(1, MAX_WORKERS) {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()?;
            let handle = runtime.handle().clone();
            let (stop, stopped) = oneshot::channel::<()>();
            std::thread::Builder::new()
                .name(format!("toolgate-worker-{index}"))
                .spawn(move || {
                    SHARD.with(|s| s.set(index + 1));
                    runtime.block_on(async {
                        let _ = stopped.await;
                    });
                })?;
            workers.push(Worker {
                handle,
                open: Arc::default(),
                _stop: stop,
            });
        }
        Ok(Workers { workers })
    }

    /// Runs `task` on the worker serving the fewest connections, as part of `set`.
    pub fn spawn<F>(&self, set: &mut JoinSet<()>, task: F) -> AbortHandle
    where
        F: Future<Output = ()> + Send + 'static,
    {
        let worker = self
            .workers
            .iter()
            .min_by_key(|w| w.open.load(Ordering::Relaxed))
            .unwrap_or(&self.workers[0]);
        let open = worker.open.clone();
        open.fetch_add(1, Ordering::Relaxed);
        set.spawn_on(
            async move {
                let _done = Done(open);
                task.await;
            },
            &worker.handle,
        )
    }
}

/// Counts a connection out of its worker when its task ends or is dropped.
struct Done(Arc<AtomicUsize>);

impl Drop for Done {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn tasks_run_on_worker_threads_and_spread_by_load() {
        let workers = Workers::start(2).unwrap();
        let mut set = JoinSet::new();
        let (release, wait) = tokio::sync::watch::channel(false);
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..4 {
            let seen_tx = seen_tx.clone();
            let mut wait = wait.clone();
            workers.spawn(&mut set, async move {
                seen_tx.send(shard()).unwrap();
                let _ = wait.wait_for(|r| *r).await;
            });
        }
        let mut shards = Vec::new();
        for _ in 0..4 {
            shards.push(seen.recv().await.unwrap());
        }
        shards.sort_unstable();
        // Two on each worker: the least loaded takes the next one.
        assert_eq!(shards, [1, 1, 2, 2]);
        assert_eq!(shard(), 0, "the test's own thread is no worker");
        release.send_replace(true);
        while let Some(r) = set.join_next().await {
            r.unwrap();
        }
        for w in &workers.workers {
            assert_eq!(w.open.load(Ordering::Relaxed), 0);
        }
    }

    #[tokio::test]
    async fn per_thread_values_are_the_threads_own() {
        let workers = Workers::start(2).unwrap();
        let mut made = 0;
        let values = Arc::new(PerThread::new(|| {
            made += 1;
            made
        }));
        assert_eq!(values.iter().count(), count() + 1);
        assert_eq!(*values.get(), 1, "off the workers: the first value");
        let mut set = JoinSet::new();
        let (seen_tx, mut seen) = tokio::sync::mpsc::unbounded_channel();
        for _ in 0..2 {
            let (values, seen_tx) = (values.clone(), seen_tx.clone());
            workers.spawn(&mut set, async move {
                seen_tx.send((shard(), *values.get())).unwrap();
                std::future::pending::<()>().await;
            });
        }
        for _ in 0..2 {
            let (shard, value) = seen.recv().await.unwrap();
            assert_eq!(value, shard % (count() + 1) + 1, "worker {shard}");
        }
    }

    #[tokio::test]
    async fn dropping_the_workers_drops_their_tasks() {
        let workers = Workers::start(1).unwrap();
        let mut set = JoinSet::new();
        workers.spawn(&mut set, std::future::pending());
        drop(workers);
        let ended = set.join_next().await.unwrap();
        assert!(ended.unwrap_err().is_cancelled());
    }
}
