//! The harness of the integration tests, and nothing else: the sidecar on port 0 ([`sidecar`]),
//! in-process fake tools ([`fake_tool`]), an OTLP/HTTP trace receiver ([`otlp`]), a real Redis
//! Cluster ([`redis_cluster`]), and the small helpers below. The tests themselves are in
//! `tests/integration/`.

pub mod fake_tool;
pub mod otlp;
pub mod redis_cluster;
pub mod sidecar;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use toolgate::clock;

/// A fresh, unique temp directory (removed by the caller when it cares).
pub fn temp_dir(tag: &str) -> PathBuf {
    static N: AtomicU64 = AtomicU64::new(0);
    let dir = std::env::temp_dir().join(format!(
        "toolgate-{tag}-{}-{}-{}",
        std::process::id(),
        clock::now_ms(),
        N.fetch_add(1, Ordering::SeqCst)
    ));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

/// A unique id with a readable prefix, safe as a run id.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU64 = AtomicU64::new(0);
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        clock::now_ms() % 100_000_000,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

/// The store section of a test config: the memory store, or a Redis Cluster given its node URLs.
pub fn store_yaml(redis_nodes: Option<&[String]>) -> String {
    match redis_nodes {
        None => "store: {kind: memory, record_ttl_ms: 600000}\n".to_string(),
        Some(nodes) => format!(
            "store: {{kind: redis-cluster, nodes: {}, record_ttl_ms: 600000, timeout_ms: 2000}}\n",
            yaml_list(nodes)
        ),
    }
}

/// `items` as a YAML flow sequence of quoted strings: `["a", "b"]`.
pub fn yaml_list(items: &[String]) -> String {
    let quoted: Vec<String> = items.iter().map(|i| format!("\"{i}\"")).collect();
    format!("[{}]", quoted.join(", "))
}

/// A polling deadline: `tick` waits a little, and fails the test once the deadline has passed.
pub struct Deadline {
    until: tokio::time::Instant,
    what: String,
}

impl Deadline {
    pub fn after(within: Duration, what: impl Into<String>) -> Deadline {
        Deadline {
            until: tokio::time::Instant::now() + within,
            what: what.into(),
        }
    }

    /// Call between two polls of the awaited condition.
    pub async fn tick(&self) {
        assert!(
            tokio::time::Instant::now() < self.until,
            "timed out waiting for {}",
            self.what
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}
