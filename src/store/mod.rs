//! The canonical store: the [`Store`] trait, [`open`] for the configured backend, and the
//! per-operation timing every backend gets.
//!
//! Implementations: [`memory::MemoryStore`] (embedded) and [`redis::RedisStore`] (Redis
//! Cluster). Both enforce the same invariants (lifecycle, TTL set once, sizes, ownership) and
//! pass one shared test suite. Nothing outside this module knows which one runs. The layout and
//! the scripts are described in `docs/store.md`.

pub mod keys;
pub mod memory;
pub mod record;
pub mod redis;
pub mod run;

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::evidence::Sealer;

pub use keys::Keys;
pub use record::{
    Evidence, Fact, Facts, FinalBody, Finalized, ProgressEntry, Record, Status, check_final,
    check_projecting, facts,
};
pub use run::{Budget, Close, NewRun, RunState, RunView};

use crate::config::{StoreConfig, StoreKind};
use crate::error::{Code, Error, Result};
use crate::ids::{RunId, ToolCallId};

/// A boxed store future, so the trait stays object-safe (`Arc<dyn Store>`).
pub type StoreFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T>> + Send + 'a>>;

/// The canonical store. Every method fails with `STORE_UNAVAILABLE` when the backend does not
/// answer in time; the other codes are listed per method.
pub trait Store: Send + Sync + 'static {
    /// Creates an ACTIVE run. `RUN_EXISTS` if the id is taken.
    fn create_run(&self, run: NewRun) -> StoreFuture<'_, RunView>;

    /// The run, or `None` if unknown or expired.
    fn get_run<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<RunView>>;

    /// Moves an ACTIVE run to ENDED or CANCELLED; any other state is left as it is.
    fn close_run<'a>(&'a self, run_id: &'a RunId, how: Close) -> StoreFuture<'a, Option<RunView>>;

    /// The atomic reservation (preflight step 10): checks run state, deadline, duplicate id and
    /// budgets, then creates the PROJECTING record with its TTL and moves the run's counters.
    /// Codes: RUN_INACTIVE, RUN_DEADLINE_EXCEEDED, DUPLICATE_TOOL_CALL, BUDGET_EXHAUSTED.
    fn reserve<'a>(&'a self, record: &'a Record, now_ms: u64) -> StoreFuture<'a, ()>;

    /// Compare-and-set PROJECTING → READY | ERROR, keeping the TTL, with size accounting and the
    /// progress append in the same atomic step. Codes: RECORD_EXPIRED, INTERNAL (bad transition).
    fn finalize<'a>(&'a self, record: &'a Record, record_bytes: u64) -> StoreFuture<'a, Finalized>;

    /// A record and its remaining TTL in milliseconds. Never renews the TTL.
    fn get_record<'a>(
        &'a self,
        run_id: &'a RunId,
        tool_call_id: &'a ToolCallId,
    ) -> StoreFuture<'a, Option<(Record, u64)>>;

    /// The run's progress list resolved through the records, in order; `None` if the run is
    /// unknown. Missing records are `None` entries.
    fn progress<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<Vec<ProgressEntry>>>;

    /// Whether the backend answers (every primary, for a cluster).
    fn ping(&self) -> StoreFuture<'_, ()>;
}

/// Every store operation: the closed set of the `op` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StoreOp {
    CreateRun,
    GetRun,
    EndRun,
    CancelRun,
    Reserve,
    Finalize,
    GetRecord,
    Facts,
    Ping,
}

impl StoreOp {
    pub const ALL: [StoreOp; 9] = [
        StoreOp::CreateRun,
        StoreOp::GetRun,
        StoreOp::EndRun,
        StoreOp::CancelRun,
        StoreOp::Reserve,
        StoreOp::Finalize,
        StoreOp::GetRecord,
        StoreOp::Facts,
        StoreOp::Ping,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            StoreOp::CreateRun => "create_run",
            StoreOp::GetRun => "get_run",
            StoreOp::EndRun => "end_run",
            StoreOp::CancelRun => "cancel_run",
            StoreOp::Reserve => "reserve",
            StoreOp::Finalize => "finalize",
            StoreOp::GetRecord => "get_record",
            StoreOp::Facts => "facts",
            StoreOp::Ping => "ping",
        }
    }
}

/// Told the duration and outcome of every store operation (the metrics implement it).
pub trait Observer: Send + Sync + 'static {
    fn store_op(&self, op: StoreOp, elapsed: Duration, unavailable: bool);
}

/// Opens the configured backend, every operation timed and reported to `observer`.
pub async fn open(
    config: &StoreConfig,
    observer: Arc<dyn Observer>,
    sealer: Arc<Sealer>,
) -> Result<Arc<dyn Store>> {
    let inner: Box<dyn Store> = match config.kind {
        StoreKind::Memory => Box::new(
            memory::MemoryStore::bounded(config.record_ttl_ms, config.memory_max_bytes, sealer)
                .expire_in_background()
                .map_err(|e| Error::internal(format!("cannot start the expiry thread: {e}")))?,
        ),
        StoreKind::RedisCluster => Box::new(redis::RedisStore::connect(config, sealer).await?),
    };
    Ok(Arc::new(Timed { inner, observer }))
}

/// A store whose every operation is timed, and counted when it fails with STORE_UNAVAILABLE.
struct Timed {
    inner: Box<dyn Store>,
    observer: Arc<dyn Observer>,
}

impl Timed {
    fn timed<'a, T: Send + 'a>(
        &'a self,
        op: StoreOp,
        fut: StoreFuture<'a, T>,
    ) -> StoreFuture<'a, T> {
        Box::pin(async move {
            let started = Instant::now();
            let result = fut.await;
            let unavailable = matches!(&result, Err(e) if e.code == Code::StoreUnavailable);
            self.observer.store_op(op, started.elapsed(), unavailable);
            result
        })
    }
}

impl Store for Timed {
    fn create_run(&self, run: NewRun) -> StoreFuture<'_, RunView> {
        self.timed(StoreOp::CreateRun, self.inner.create_run(run))
    }

    fn get_run<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<RunView>> {
        self.timed(StoreOp::GetRun, self.inner.get_run(run_id))
    }

    fn close_run<'a>(&'a self, run_id: &'a RunId, how: Close) -> StoreFuture<'a, Option<RunView>> {
        let op = match how {
            Close::End => StoreOp::EndRun,
            Close::Cancel => StoreOp::CancelRun,
        };
        self.timed(op, self.inner.close_run(run_id, how))
    }

    fn reserve<'a>(&'a self, record: &'a Record, now_ms: u64) -> StoreFuture<'a, ()> {
        self.timed(StoreOp::Reserve, self.inner.reserve(record, now_ms))
    }

    fn finalize<'a>(&'a self, record: &'a Record, record_bytes: u64) -> StoreFuture<'a, Finalized> {
        self.timed(StoreOp::Finalize, self.inner.finalize(record, record_bytes))
    }

    fn get_record<'a>(
        &'a self,
        run_id: &'a RunId,
        tool_call_id: &'a ToolCallId,
    ) -> StoreFuture<'a, Option<(Record, u64)>> {
        self.timed(
            StoreOp::GetRecord,
            self.inner.get_record(run_id, tool_call_id),
        )
    }

    fn progress<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<Vec<ProgressEntry>>> {
        self.timed(StoreOp::Facts, self.inner.progress(run_id))
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        self.timed(StoreOp::Ping, self.inner.ping())
    }
}
