//! The shared store suite against the embedded `MemoryStore`, on paused tokio time.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::store_suite::Harness;
use toolgate::store::Store;
use toolgate::store::memory::MemoryStore;

/// Each case runs on a paused clock, so TTLs move only through `advance`.
struct Memory;

impl Harness for Memory {
    async fn store(&self, record_ttl_ms: u64) -> Arc<dyn Store> {
        Arc::new(MemoryStore::new(record_ttl_ms))
    }

    async fn advance(&self, d: Duration) {
        tokio::time::advance(d).await;
    }
}

store_suite!(
    #[tokio::test(start_paused = true)]
    Memory
);
