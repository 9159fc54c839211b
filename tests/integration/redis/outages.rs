//! Outages: a cluster that comes up after the store opened, a frozen cluster (seen by the store
//! and by the whole sidecar), and a primary killed under load. While an outage lasts, calls fail
//! closed with STORE_UNAVAILABLE; after it, the same store works again without a restart, and a
//! failover loses no acknowledged record.

use std::collections::BTreeSet;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use serde_json::json;
use toolgate::config::{DEFAULT_MEMORY_MAX_BYTES, Durability, StoreConfig, StoreKind};
use toolgate::error::{Code, Result};
use toolgate::ids::{RunId, ToolCallId};
use toolgate::store::redis::RedisStore;
use toolgate::store::{Finalized, Record, Status, Store};

use super::{lock, toolgate_keys};
use crate::store::{call_id, connect, create, new_run, projecting, ready, redis_config, reserved};
use crate::support::fake_tool::FakeTool;
use crate::support::redis_cluster::{self, RedisCluster};
use crate::support::sidecar::Sidecar;
use crate::support::{Deadline, unique, yaml_list};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_that_comes_up_later_is_used_without_restart() {
    let ports = redis_cluster::free_ports(6);
    // Long enough for a first finalize on a busy CI machine: script load plus a replica's WAIT.
    let timeout = Duration::from_millis(1000);
    let cfg = StoreConfig {
        kind: StoreKind::RedisCluster,
        nodes: ports
            .iter()
            .map(|p| format!("redis://127.0.0.1:{p}"))
            .collect(),
        key_prefix: "toolgate".into(),
        record_ttl_ms: 60_000,
        durability: Durability::Replica,
        timeout,
        memory_max_bytes: DEFAULT_MEMORY_MAX_BYTES,
    };
    // Nothing listens yet: the store opens, and every operation is STORE_UNAVAILABLE in time.
    let started = Instant::now();
    let store = RedisStore::connect(&cfg, crate::store::sealer())
        .await
        .expect("opening does not need the cluster");
    assert!(started.elapsed() < timeout * 4, "connect took too long");
    assert_unavailable("ping", timeout, store.ping()).await;
    let run = new_run("later", 10, &[], 1 << 20, 600_000);
    assert_unavailable("create_run", timeout, store.create_run(run.clone())).await;
    assert_unavailable("get_run", timeout, store.get_run(&run.run_id)).await;

    let cluster = tokio::task::spawn_blocking(move || RedisCluster::start_on(ports))
        .await
        .expect("spawn cluster");
    let deadline = Deadline::after(
        Duration::from_secs(30),
        "the store to reach the new cluster",
    );
    while store.ping().await.is_err() {
        deadline.tick().await;
    }
    let view = store.create_run(run).await.expect("create");
    let a = projecting(&view, "a", "search");
    store
        .reserve(&a, view.created_ms + 1)
        .await
        .expect("reserve");
    assert_eq!(
        store.finalize(&ready(&a), 1 << 20).await.expect("finalize"),
        Finalized::Written,
        "scripts are loaded on first use and a replica acknowledges"
    );
    drop(cluster);
}

/// Runs `op` against a frozen cluster: it must answer STORE_UNAVAILABLE, and return.
async fn assert_unavailable<T: std::fmt::Debug>(
    what: &str,
    timeout: Duration,
    op: impl Future<Output = Result<T>>,
) {
    let started = Instant::now();
    let result = tokio::time::timeout(timeout * 4, op)
        .await
        .unwrap_or_else(|_| panic!("{what} did not return within 4 x the store timeout"));
    match result {
        Err(e) => assert_eq!(e.code, Code::StoreUnavailable, "{what}: {e}"),
        Ok(v) => panic!("{what} succeeded against a frozen cluster: {v:?}"),
    }
    assert!(started.elapsed() < timeout * 4, "{what} took too long");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_cluster_is_store_unavailable_and_the_store_recovers() {
    let cluster = RedisCluster::spawn().await;
    let timeout = Duration::from_millis(500);
    let store = connect(&redis_config(
        &cluster,
        60_000,
        Durability::Primary,
        timeout,
    ))
    .await;
    let run = create(&store, new_run("frozen", 100, &[], 1 << 20, 600_000)).await;
    let a = reserved(&store, &run, "a", "search").await;

    cluster.pause_primaries();
    let b = projecting(&run, "b", "search");
    assert_unavailable("reserve", timeout, store.reserve(&b, run.created_ms + 2)).await;
    assert_unavailable("finalize", timeout, store.finalize(&ready(&a), 1 << 20)).await;
    assert_unavailable("get_run", timeout, store.get_run(&run.run_id)).await;
    assert_unavailable(
        "get_record",
        timeout,
        store.get_record(&run.run_id, &call_id("a")),
    )
    .await;
    assert_unavailable("progress", timeout, store.progress(&run.run_id)).await;
    assert_unavailable("ping", timeout, store.ping()).await;
    assert_unavailable(
        "create_run",
        timeout,
        store.create_run(new_run("frozen2", 1, &[], 1, 1000)),
    )
    .await;
    cluster.resume();

    // The same store, no restart: poll until it answers again.
    let deadline = Deadline::after(Duration::from_secs(30), "recovery after SIGCONT");
    while !(store.ping().await.is_ok() && store.get_run(&run.run_id).await.is_ok()) {
        deadline.tick().await;
    }
    // Writes queued while frozen may have run after the thaw; use fresh ids.
    let c = projecting(&run, "c", "search");
    store
        .reserve(&c, run.created_ms + 3)
        .await
        .expect("reserve after recovery");
    assert_eq!(
        store.finalize(&ready(&c), 1 << 20).await.expect("finalize"),
        Finalized::Written
    );
    let (stored, _) = store
        .get_record(&run.run_id, &call_id("c"))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(stored.status, Status::Ready);
    let other = store
        .create_run(new_run("thawed", 1, &[], 1 << 20, 1000))
        .await
        .expect("create after recovery");
    assert_eq!(other.calls_used, 0);
}

/// The whole sidecar against a frozen cluster: calls fail closed with STORE_UNAVAILABLE without
/// reaching the tool, `/readyz` turns 503, and both recover by themselves after the thaw.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_cluster_fails_closed_and_recovers() {
    let cluster = RedisCluster::spawn().await;
    let tool = FakeTool::start().await;
    let nodes = yaml_list(&cluster.urls());
    let config = format!(
        "store: {{kind: redis-cluster, nodes: {nodes}, timeout_ms: 500}}\n\
         tools:\n  - {{name: search, upstream: '{}', read_only: true}}\n",
        tool.url("search")
    );
    let sidecar = Sidecar::start(&config).await;
    let run_id = unique("frozen");
    let token = sidecar.create_run(json!({"run_id": run_id})).await;
    let ok = sidecar
        .invoke(&token, &run_id, "before", "search", json!({"q": "x"}))
        .await;
    assert_eq!(ok.status, 200, "{}", ok.raw);

    cluster.pause_primaries();
    let (ready, _) = sidecar.get_telemetry("/readyz").await;
    assert_eq!(ready, 503, "/readyz while the primaries are frozen");
    let frozen = sidecar
        .invoke(&token, &run_id, "frozen", "search", json!({"q": "x"}))
        .await;
    assert_eq!(frozen.status, 503, "{}", frozen.raw);
    assert_eq!(frozen.body["error"]["code"], "STORE_UNAVAILABLE");
    assert_eq!(frozen.body["tool_call_id"], "frozen");
    assert_eq!(
        tool.calls("search").len(),
        1,
        "the tool is not called without a reservation"
    );
    let admin = sidecar
        .admin("GET", &format!("/v1/runs/{run_id}"), None)
        .await;
    assert_eq!(admin.status, 503, "{}", admin.raw);
    assert_eq!(admin.body["error"]["code"], "STORE_UNAVAILABLE");

    cluster.resume();
    let deadline = Deadline::after(Duration::from_secs(30), "/readyz after the thaw");
    while sidecar.get_telemetry("/readyz").await.0 != 200 {
        deadline.tick().await;
    }
    let after = sidecar
        .invoke(&token, &run_id, "after", "search", json!({"q": "x"}))
        .await;
    assert_eq!(after.status, 200, "{}", after.raw);
    let metrics = sidecar.metrics().await;
    assert!(
        metrics.contains(
            r#"toolgate_preflight_rejections_total{tool="search",code="STORE_UNAVAILABLE"} 1"#
        ),
        "{metrics}"
    );
}

/// What the writers of the failover test share.
#[derive(Default)]
struct Load {
    /// (run, tool_call_id) of every finalize answered `Written`: what an agent was told READY.
    acked: Mutex<Vec<(RunId, ToolCallId)>>,
    /// Finalizes (of any outcome) on runs of the shard that gets killed.
    victim_finalizes: AtomicUsize,
    stop: AtomicBool,
}

impl Load {
    fn acks(&self) -> usize {
        lock(&self.acked).len()
    }

    /// Polls `done` with a deadline.
    async fn wait_until(&self, what: &str, done: impl Fn(&Load) -> bool) {
        let deadline = Deadline::after(Duration::from_secs(30), what);
        while !done(self) {
            deadline.tick().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_primary_loses_no_acknowledged_record() {
    let cluster = Arc::new(RedisCluster::spawn().await);
    let timeout = Duration::from_millis(1000);
    let cfg = redis_config(&cluster, 300_000, Durability::Replica, timeout);
    let store = connect(&cfg).await;
    let keys = toolgate_keys();
    let mut runs = Vec::new();
    for _ in 0..12 {
        runs.push(
            create(
                &store,
                new_run("failover", 1_000_000, &[], 1 << 30, 600_000),
            )
            .await,
        );
    }
    let victim = cluster.primary_index_for_key(&keys.run(&runs[0].run_id));
    let on_victim: BTreeSet<RunId> = runs
        .iter()
        .filter(|r| cluster.primary_index_for_key(&keys.run(&r.run_id)) == victim)
        .map(|r| r.run_id.clone())
        .collect();

    let load = Arc::new(Load::default());
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..6 {
        let (store, runs, load, on_victim) =
            (store.clone(), runs.clone(), load.clone(), on_victim.clone());
        workers.spawn(async move {
            for n in 0..100_000usize {
                if load.stop.load(Ordering::Relaxed) {
                    break;
                }
                let run = &runs[(w + n) % runs.len()];
                let r = projecting(run, &format!("w{w}-{n}"), "search");
                if store.reserve(&r, run.created_ms + 1).await.is_err() {
                    continue;
                }
                let done = store.finalize(&ready(&r), 1 << 20).await;
                if on_victim.contains(&run.run_id) {
                    load.victim_finalizes.fetch_add(1, Ordering::Relaxed);
                }
                if let Ok(Finalized::Written) = done {
                    lock(&load.acked).push((r.run_id.clone(), r.tool_call_id.clone()));
                }
            }
        });
    }
    // Some of them on the shard to be killed, which the test is about: on a busy machine the
    // first hundred have all come from the other shards.
    let acked_on_victim = |l: &Load| {
        lock(&l.acked)
            .iter()
            .filter(|(run, _)| on_victim.contains(run))
            .count()
    };
    load.wait_until(
        "acknowledged records before the kill, some on the shard to kill",
        |l| l.acks() >= 100 && acked_on_victim(l) >= 10,
    )
    .await;
    // Partition the victim from its replica (frozen, so it cannot reconnect): from now on the
    // primary's writes reach no replica, and a finalize acknowledged without a replica's
    // confirmation would be lost in the failover.
    let replica = cluster.replica_of(cluster.primaries()[victim]);
    cluster.pause(replica);
    cluster.disconnect_replicas(cluster.primaries()[victim]);
    let finalized = load.victim_finalizes.load(Ordering::Relaxed);
    load.wait_until(
        "finalizes on the killed shard while its replica is frozen",
        |l| l.victim_finalizes.load(Ordering::Relaxed) >= finalized + 6,
    )
    .await;
    let killed = cluster.kill_primary(victim).port;
    cluster.resume_node(replica);
    let before_kill = load.acks();
    let c = cluster.clone();
    tokio::task::spawn_blocking(move || {
        c.wait_failover(
            c.primaries()[victim],
            Instant::now() + Duration::from_secs(30),
        )
    })
    .await
    .expect("failover completed");
    let after_failover = load.acks();
    load.wait_until("acknowledged records after the failover", |l| {
        l.acks() >= after_failover + 100
    })
    .await;
    load.stop.store(true, Ordering::Relaxed);
    while let Some(joined) = workers.join_next().await {
        joined.expect("worker");
    }

    let acked = lock(&load.acked).clone();
    let on_victim_acked = acked
        .iter()
        .filter(|(run, _)| on_victim.contains(run))
        .count();
    assert!(
        on_victim_acked > 0,
        "no record of the killed primary {killed} was acknowledged: the test proves nothing"
    );
    // A fresh store, as after a restart: every acknowledged record reads back READY.
    let reader = connect(&redis_config(
        &cluster,
        300_000,
        Durability::Primary,
        timeout,
    ))
    .await;
    let mut missing = Vec::new();
    for (run, id) in &acked {
        match reader.get_record(run, id).await.expect("read") {
            Some((r, _)) if r.status == Status::Ready => {}
            other => missing.push((run.clone(), id.clone(), other.map(|(r, _)| r.status))),
        }
    }
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged records lost ({before_kill} acked before the kill, {on_victim_acked} on the killed shard): {missing:?}",
        missing.len(),
        acked.len()
    );

    // The promoted replica has no replica of its own: finalize there fails closed, while the
    // record itself is READY.
    let run = runs
        .iter()
        .find(|r| on_victim.contains(&r.run_id))
        .expect("a run on the killed shard");
    let r = projecting(run, "after-failover", "search");
    store
        .reserve(&r, run.created_ms + 1)
        .await
        .expect("reserve on the promoted primary");
    let err = store
        .finalize(&ready(&r), 1 << 20)
        .await
        .expect_err("no replica can acknowledge");
    assert_eq!(err.code, Code::StoreUnavailable, "{err}");
    let (stored, _): (Record, u64) = reader
        .get_record(&run.run_id, &call_id("after-failover"))
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(stored.status, Status::Ready);
}
