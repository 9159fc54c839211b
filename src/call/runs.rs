//! What this sidecar keeps about runs between calls: the run-spec cache (so preflight steps 7
//! and 9b cost no store read), the calls in flight (per-run cancellation), and the drain count.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::Notify;

use crate::clock;
use crate::config::RunPaths;
use crate::ids::{RunId, RunMap};
use crate::store::{RunState, RunView};

/// The immutable part of a run that preflight needs, cached per sidecar.
pub struct RunSpec {
    pub tools: Option<Vec<String>>,
    pub deadline_ms: u64,
    /// What the run's path arguments are judged against (preflight step 9b).
    pub paths: RunPaths,
}

/// Caches run specs: tools and deadline never change after creation, so a cached copy is
/// right while the run can still take calls, and saves a store read per call.
///
/// The cache holds at most [`RunCache::MAX`] runs and forgets a run when it ends or is cancelled
/// through this sidecar. Past their deadline, entries are swept whenever the map has doubled
/// since the last sweep, so it stays within about twice the runs that can still take calls, at
/// an amortized constant cost per insert.
pub struct RunCache {
    inner: Mutex<Inner>,
}

struct Inner {
    runs: RunMap<Arc<RunSpec>>,
    /// The size at which the next insert sweeps out the runs past their deadline.
    sweep_at: usize,
}

impl Default for RunCache {
    fn default() -> Self {
        RunCache {
            inner: Mutex::new(Inner {
                runs: RunMap::default(),
                sweep_at: Self::MIN_SWEEP,
            }),
        }
    }
}

impl RunCache {
    const MAX: usize = 10_000;
    const MIN_SWEEP: usize = 64;

    /// A cached spec is trusted only until its deadline: until then the run key cannot expire
    /// (its TTL is the run's timeout plus the record TTL), so no other run can have taken the
    /// id. After it, the store is asked again.
    pub fn get(&self, run_id: &RunId) -> Option<Arc<RunSpec>> {
        let mut inner = self.lock();
        match inner.runs.get(run_id) {
            Some(spec) if spec.deadline_ms > clock::now_ms() => Some(spec.clone()),
            Some(_) => {
                inner.runs.remove(run_id);
                None
            }
            None => None,
        }
    }

    /// Caches the spec of `run`, only while it can take calls.
    pub fn put(&self, run: &RunView) -> Arc<RunSpec> {
        let spec = Arc::new(RunSpec {
            tools: run.tools.clone(),
            deadline_ms: run.deadline_ms,
            paths: RunPaths {
                workspace: run.workspace.clone(),
                home: run.home.clone(),
            },
        });
        if run.state != RunState::Active {
            return spec;
        }
        let mut inner = self.lock();
        if inner.runs.len() >= inner.sweep_at.min(Self::MAX) {
            let now = clock::now_ms();
            inner.runs.retain(|_, r| r.deadline_ms > now);
            if inner.runs.len() >= Self::MAX {
                inner.runs.clear();
            }
            inner.sweep_at = (2 * inner.runs.len()).max(Self::MIN_SWEEP);
        }
        inner.runs.insert(run.run_id.clone(), spec.clone());
        spec
    }

    /// Drops a run that ended or was cancelled: its later calls are refused by the store.
    pub fn forget(&self, run_id: &RunId) {
        self.lock().runs.remove(run_id);
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.lock().runs.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Calls in flight on this sidecar: per-run cancellation and the drain count.
#[derive(Default)]
pub struct Calls {
    /// The runs with calls in flight here, with how many.
    runs: Mutex<RunMap<(Arc<Cancel>, usize)>>,
    total: AtomicUsize,
    idle: Notify,
}

/// The cancellation of one run's calls in flight: set once, never cleared.
#[derive(Default)]
struct Cancel {
    set: AtomicBool,
    woken: Notify,
}

impl Calls {
    /// Registers a call of `run_id`; the guard unregisters it when dropped.
    pub fn enter(self: &Arc<Self>, run_id: &RunId) -> CallGuard {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let entry = runs.entry(run_id.clone()).or_default();
        entry.1 += 1;
        let cancel = entry.0.clone();
        drop(runs);
        self.total.fetch_add(1, Ordering::SeqCst);
        CallGuard {
            calls: self.clone(),
            run_id: run_id.clone(),
            cancel,
        }
    }

    /// Aborts every call of `run_id` in flight here.
    pub fn cancel(&self, run_id: &RunId) {
        let runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((cancel, _)) = runs.get(run_id) {
            cancel.set.store(true, Ordering::SeqCst);
            cancel.woken.notify_waiters();
        }
    }

    /// Waits until no call is in flight.
    pub async fn drained(&self) {
        loop {
            let idle = self.idle.notified();
            if self.total.load(Ordering::SeqCst) == 0 {
                return;
            }
            idle.await;
        }
    }
}

/// One registered call.
pub struct CallGuard {
    calls: Arc<Calls>,
    run_id: RunId,
    cancel: Arc<Cancel>,
}

impl CallGuard {
    /// Resolves once the call's run is cancelled on this sidecar.
    pub async fn cancelled(&self) {
        let cancel = &self.cancel;
        loop {
            // Made before the flag is read: `notify_waiters` wakes every `Notified` made
            // before it, polled or not, so a cancel between the two is not lost.
            let woken = cancel.woken.notified();
            if cancel.set.load(Ordering::SeqCst) {
                return;
            }
            woken.await;
        }
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        let mut runs = self.calls.runs.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(entry) = runs.get_mut(&self.run_id) {
            entry.1 -= 1;
            if entry.1 == 0 {
                runs.remove(&self.run_id);
            }
        }
        drop(runs);
        if self.calls.total.fetch_sub(1, Ordering::SeqCst) == 1 {
            self.calls.idle.notify_waiters();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{Budget, NewRun};

    fn run(id: &str, deadline_ms: u64) -> RunView {
        RunView::new(NewRun {
            run_id: RunId::parse(id).unwrap(),
            created_ms: 0,
            deadline_ms,
            budget: Budget {
                max_calls: 1,
                max_calls_per_tool: Default::default(),
                max_record_bytes: 1,
            },
            tools: None,
            paths: RunPaths::default(),
        })
    }

    #[test]
    fn the_cache_keeps_about_twice_the_live_runs() {
        let cache = RunCache::default();
        let live = clock::now_ms() + 3_600_000;
        for i in 0..20 {
            cache.put(&run(&format!("live-{i}"), live));
        }
        // Runs past their deadline that are never asked for again are swept out.
        let mut most = 0;
        for i in 0..5_000 {
            cache.put(&run(&format!("gone-{i}"), 1));
            most = most.max(cache.len());
        }
        assert!(most <= 2 * 20 + RunCache::MIN_SWEEP, "held {most} runs");
        for i in 0..20 {
            let id = RunId::parse(&format!("live-{i}")).unwrap();
            assert!(cache.get(&id).is_some(), "live-{i} was swept");
        }
    }

    #[test]
    fn closed_runs_are_not_cached() {
        let cache = RunCache::default();
        let live = clock::now_ms() + 3_600_000;
        let mut ended = run("ended", live);
        ended.state = RunState::Ended;
        assert_eq!(
            cache.put(&ended).deadline_ms,
            live,
            "the spec is still answered"
        );
        assert!(cache.get(&ended.run_id).is_none());
        let open = run("open", live);
        cache.put(&open);
        assert!(cache.get(&open.run_id).is_some());
        cache.forget(&open.run_id);
        assert!(cache.get(&open.run_id).is_none());
        assert_eq!(cache.len(), 0);
    }
}
