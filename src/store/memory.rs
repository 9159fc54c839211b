//! The embedded store: the same semantics as Redis Cluster (TTL included) in one process.
//! Every operation takes one lock, so each is atomic, as a Lua script is in Redis.

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

use super::{
    Finalized, NewRun, PreparedFinal, ProgressEntry, Record, RunState, RunView, Status, Store,
    StoreFuture, check_projecting,
};
use crate::error::{Code, Error, SizeStage};

/// Embedded store. TTLs run on tokio's clock, so tests can pause and advance time.
pub struct MemoryStore {
    record_ttl: Duration,
    inner: Mutex<Inner>,
}

#[derive(Default)]
struct Inner {
    runs: HashMap<String, Expiring<RunEntry>>,
    records: HashMap<(String, String), Expiring<String>>,
    ops: u64,
}

struct RunEntry {
    run: RunView,
    progress: Vec<String>,
}

struct Expiring<T> {
    value: T,
    expires_at: Instant,
}

impl<T> Expiring<T> {
    fn live(&self, now: Instant) -> bool {
        now < self.expires_at
    }
}

impl MemoryStore {
    pub fn new(record_ttl_ms: u64) -> MemoryStore {
        MemoryStore {
            record_ttl: Duration::from_millis(record_ttl_ms),
            inner: Mutex::new(Inner::default()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding the lock cannot leave a half-applied operation: each
        // operation mutates only after all its checks, so the data stays consistent.
        let mut inner = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        inner.ops += 1;
        if inner.ops.is_multiple_of(1024) {
            inner.sweep(Instant::now());
        }
        inner
    }
}

impl Inner {
    fn sweep(&mut self, now: Instant) {
        self.runs.retain(|_, e| e.live(now));
        self.records.retain(|_, e| e.live(now));
    }

    fn run(&mut self, run_id: &str, now: Instant) -> Option<&mut RunEntry> {
        if self.runs.get(run_id).is_some_and(|e| !e.live(now)) {
            self.runs.remove(run_id);
        }
        self.runs.get_mut(run_id).map(|e| &mut e.value)
    }

    fn record(&mut self, run_id: &str, id: &str, now: Instant) -> Option<&Expiring<String>> {
        let key = (run_id.to_string(), id.to_string());
        if self.records.get(&key).is_some_and(|e| !e.live(now)) {
            self.records.remove(&key);
        }
        self.records.get(&key)
    }
}

impl Store for MemoryStore {
    fn create_run(&self, run: NewRun) -> StoreFuture<'_, RunView> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock();
            if inner.run(&run.run_id, now).is_some() {
                return Err(Code::RunExists.into());
            }
            let view = RunView::new(run);
            let ttl = Duration::from_millis(view.key_ttl_ms(self.record_ttl.as_millis() as u64));
            inner.runs.insert(
                view.run_id.clone(),
                Expiring {
                    value: RunEntry {
                        run: view.clone(),
                        progress: Vec::new(),
                    },
                    expires_at: now + ttl,
                },
            );
            Ok(view)
        })
    }

    fn get_run<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Ok(inner.run(run_id, Instant::now()).map(|e| e.run.clone()))
        })
    }

    fn close_run<'a>(&'a self, run_id: &'a str, to: RunState) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Ok(inner.run(run_id, Instant::now()).map(|e| {
                if e.run.state == RunState::Active {
                    e.run.state = to;
                }
                e.run.clone()
            }))
        })
    }

    fn reserve<'a>(&'a self, record: &'a Record, now_ms: u64) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_projecting(record)?;
            let body = record.to_json()?;
            let now = Instant::now();
            let mut inner = self.lock();
            let duplicate = inner
                .record(&record.run_id, &record.tool_call_id, now)
                .is_some();
            let Some(entry) = inner.run(&record.run_id, now) else {
                return Err(Code::RunInactive.into());
            };
            entry.run.admit(&record.tool, now_ms, duplicate)?;
            entry.run.calls_used += 1;
            *entry
                .run
                .calls_per_tool
                .entry(record.tool.clone())
                .or_insert(0) += 1;
            inner.records.insert(
                (record.run_id.clone(), record.tool_call_id.clone()),
                Expiring {
                    value: body,
                    expires_at: now + self.record_ttl,
                },
            );
            Ok(())
        })
    }

    fn finalize<'a>(&'a self, record: &'a Record, record_bytes: u64) -> StoreFuture<'a, Finalized> {
        Box::pin(async move {
            let prepared = PreparedFinal::new(record, record_bytes)?;
            let now = Instant::now();
            let mut inner = self.lock();
            let Some(current) = inner.record(&record.run_id, &record.tool_call_id, now) else {
                return Err(Error::with_cause(Code::RecordExpired, "record vanished"));
            };
            if Record::from_json(&current.value)?.status != Status::Projecting {
                return Err(Error::internal("record is no longer PROJECTING"));
            }
            let expires_at = current.expires_at;
            let Some(entry) = inner.run(&record.run_id, now) else {
                return Err(Error::with_cause(Code::RecordExpired, "run vanished"));
            };
            let (body, outcome) = if entry.run.record_bytes_used + prepared.size()
                > entry.run.budget.max_record_bytes
            {
                (prepared.run_fallback, Finalized::TooLarge(SizeStage::Run))
            } else {
                entry.run.record_bytes_used += prepared.size();
                let outcome = prepared.written();
                (prepared.body, outcome)
            };
            entry.progress.push(record.tool_call_id.clone());
            inner.records.insert(
                (record.run_id.clone(), record.tool_call_id.clone()),
                Expiring {
                    value: body,
                    expires_at,
                },
            );
            Ok(outcome)
        })
    }

    fn get_record<'a>(
        &'a self,
        run_id: &'a str,
        tool_call_id: &'a str,
    ) -> StoreFuture<'a, Option<(Record, u64)>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock();
            let Some(e) = inner.record(run_id, tool_call_id, now) else {
                return Ok(None);
            };
            let ttl = e.expires_at.saturating_duration_since(now).as_millis() as u64;
            Ok(Some((Record::from_json(&e.value)?, ttl)))
        })
    }

    fn progress<'a>(&'a self, run_id: &'a str) -> StoreFuture<'a, Option<Vec<ProgressEntry>>> {
        Box::pin(async move {
            let now = Instant::now();
            let mut inner = self.lock();
            let Some(ids) = inner.run(run_id, now).map(|e| e.progress.clone()) else {
                return Ok(None);
            };
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let record = match inner.record(run_id, &id, now) {
                    Some(e) => Some(Record::from_json(&e.value)?),
                    None => None,
                };
                out.push((id, record));
            }
            Ok(Some(out))
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}
