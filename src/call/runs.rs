//! What this sidecar keeps about runs between calls: the run-spec cache (so preflight steps 7
//! and 9b cost no store read), the calls in flight (per-run cancellation), and the drain count.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use tokio::sync::{Notify, watch};

use crate::clock;
use crate::config::RunPaths;
use crate::ids::RunId;
use crate::store::RunView;

/// The immutable part of a run that preflight needs, cached per sidecar.
pub struct RunSpec {
    pub tools: Option<Vec<String>>,
    pub deadline_ms: u64,
    /// What the run's path arguments are judged against (preflight step 9b).
    pub paths: RunPaths,
}

/// Caches run specs: tools and deadline never change after creation, so a cached copy is
/// right while the run can still take calls, and saves a store read per call.
#[derive(Default)]
pub struct RunCache {
    runs: Mutex<HashMap<RunId, Arc<RunSpec>>>,
}

impl RunCache {
    const MAX: usize = 10_000;

    /// A cached spec is trusted only until its deadline: until then the run key cannot expire
    /// (its TTL is the run's timeout plus the record TTL), so no other run can have taken the
    /// id. After it, the store is asked again.
    pub fn get(&self, run_id: &RunId) -> Option<Arc<RunSpec>> {
        let mut runs = self.lock();
        match runs.get(run_id) {
            Some(spec) if spec.deadline_ms > clock::now_ms() => Some(spec.clone()),
            Some(_) => {
                runs.remove(run_id);
                None
            }
            None => None,
        }
    }

    pub fn put(&self, run: &RunView) -> Arc<RunSpec> {
        let spec = Arc::new(RunSpec {
            tools: run.tools.clone(),
            deadline_ms: run.deadline_ms,
            paths: RunPaths {
                workspace: run.workspace.clone(),
                home: run.home.clone(),
            },
        });
        let mut runs = self.lock();
        if runs.len() >= Self::MAX {
            let now = clock::now_ms();
            runs.retain(|_, r| r.deadline_ms > now);
            if runs.len() >= Self::MAX {
                runs.clear();
            }
        }
        runs.insert(run.run_id.clone(), spec.clone());
        spec
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<RunId, Arc<RunSpec>>> {
        self.runs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Calls in flight on this sidecar: per-run cancellation and the drain count.
#[derive(Default)]
pub struct Calls {
    runs: Mutex<HashMap<RunId, (watch::Sender<bool>, usize)>>,
    total: AtomicUsize,
    idle: Notify,
}

impl Calls {
    /// Registers a call of `run_id`; the guard unregisters it when dropped.
    pub fn enter(self: &Arc<Self>, run_id: &RunId) -> CallGuard {
        let mut runs = self.runs.lock().unwrap_or_else(|p| p.into_inner());
        let entry = runs
            .entry(run_id.clone())
            .or_insert_with(|| (watch::channel(false).0, 0));
        entry.1 += 1;
        let cancel = entry.0.subscribe();
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
        if let Some((tx, _)) = runs.get(run_id) {
            tx.send_replace(true);
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
    cancel: watch::Receiver<bool>,
}

impl CallGuard {
    /// Resolves once the call's run is cancelled on this sidecar.
    pub async fn cancelled(&mut self) {
        if self.cancel.wait_for(|c| *c).await.is_err() {
            std::future::pending::<()>().await;
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
