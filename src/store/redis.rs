//! The Redis Cluster store.

use super::{Finalized, NewRun, ProgressEntry, Record, RunState, RunView, Store, StoreFuture};
use crate::config::StoreConfig;
use crate::error::{Error, Result};

/// Redis Cluster store.
pub struct RedisStore {
    _cfg: StoreConfig,
}

impl RedisStore {
    /// Connects to the cluster.
    pub async fn connect(cfg: &StoreConfig) -> Result<RedisStore> {
        Err(Error::store(format!(
            "redis-cluster store not built yet ({} nodes)",
            cfg.nodes.len()
        )))
    }
}

impl Store for RedisStore {
    fn create_run(&self, _run: NewRun) -> StoreFuture<'_, RunView> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn get_run<'a>(&'a self, _run_id: &'a str) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn close_run<'a>(
        &'a self,
        _run_id: &'a str,
        _to: RunState,
    ) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn reserve<'a>(&'a self, _record: &'a Record, _now_ms: u64) -> StoreFuture<'a, ()> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn finalize<'a>(
        &'a self,
        _record: &'a Record,
        _record_bytes: u64,
    ) -> StoreFuture<'a, Finalized> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn get_record<'a>(
        &'a self,
        _run_id: &'a str,
        _id: &'a str,
    ) -> StoreFuture<'a, Option<(Record, u64)>> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn progress<'a>(&'a self, _run_id: &'a str) -> StoreFuture<'a, Option<Vec<ProgressEntry>>> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Err(Error::store("unimplemented")) })
    }
}
