//! The shared store suite against a real Redis Cluster, plus what only Redis can show: the
//! exact key layout, expiry instants that never move, races across connections, a frozen
//! cluster, and a primary killed under load.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use support::Deadline;
use support::redis_cluster::{self, RedisCluster};
use support::store_suite::{Harness, code, error, new_run, projecting, ready};
use toolgate::clock;
use toolgate::config::{Durability, StoreConfig, StoreKind};
use toolgate::error::Code;
use toolgate::store::redis::RedisStore;
use toolgate::store::{Finalized, Keys, Record, RunView, Status, Store};

/// Generous for a loaded 2-core machine; the timeout tests use their own.
const SUITE_TIMEOUT: Duration = Duration::from_secs(2);

fn config(
    cluster: &RedisCluster,
    record_ttl_ms: u64,
    durability: Durability,
    timeout: Duration,
) -> StoreConfig {
    StoreConfig {
        kind: StoreKind::RedisCluster,
        nodes: cluster.urls(),
        key_prefix: "toolgate".into(),
        record_ttl_ms,
        durability,
        timeout,
    }
}

async fn connect(cfg: &StoreConfig) -> Arc<dyn Store> {
    Arc::new(RedisStore::connect(cfg).await.expect("connect"))
}

/// The suite on the binary's shared cluster, in real time.
struct Redis(&'static RedisCluster);

impl Redis {
    fn shared() -> Redis {
        Redis(redis_cluster::shared())
    }
}

impl Harness for Redis {
    async fn store(&self, record_ttl_ms: u64) -> Arc<dyn Store> {
        connect(&config(
            self.0,
            record_ttl_ms,
            Durability::Primary,
            SUITE_TIMEOUT,
        ))
        .await
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

store_suite!(
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    Redis::shared()
);

/// The suite's cases again with `durability: replica`: every finalize also waits for a replica.
struct RedisReplica(&'static RedisCluster);

impl Harness for RedisReplica {
    async fn store(&self, record_ttl_ms: u64) -> Arc<dyn Store> {
        connect(&config(
            self.0,
            record_ttl_ms,
            Durability::Replica,
            SUITE_TIMEOUT,
        ))
        .await
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

mod replica {
    use super::*;
    store_suite!(
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        RedisReplica(redis_cluster::shared())
    );
}

/// A direct cluster connection, to look at keys the way an operator would.
async fn raw(cluster: &RedisCluster) -> ClusterConnection {
    ClusterClient::new(cluster.urls())
        .expect("client")
        .get_async_connection()
        .await
        .expect("raw cluster connection")
}

async fn q<T: redis::FromRedisValue>(conn: &mut ClusterConnection, args: &[&str]) -> T {
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(conn)
        .await
        .unwrap_or_else(|e| panic!("{args:?}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_follow_the_contract_layout() {
    let cluster = redis_cluster::shared();
    let mut cfg = config(cluster, 60_000, Durability::Primary, SUITE_TIMEOUT);
    cfg.key_prefix = "tg-layout".into();
    let store = connect(&cfg).await;
    let run = store
        .create_run(new_run("layout", 10, &[("search", 3)], 1 << 20, 600_000))
        .await
        .expect("create");
    let a = projecting(&run, "call_abc", "search");
    store
        .reserve(&a, run.created_ms + 1)
        .await
        .expect("reserve");
    let done = ready(&a);
    store.finalize(&done, 1 << 20).await.expect("finalize");

    let id = &run.run_id;
    let record_key = format!("tg-layout:{{{id}}}:call_abc");
    let run_key = format!("tg-layout:{{{id}}}:run");
    let progress_key = format!("tg-layout:{{{id}}}:progress");
    // Every key of the run, on every primary: exactly three, the record, the run hash and the
    // progress list.
    let mut found = BTreeSet::new();
    for node in cluster.primaries() {
        let client = redis::Client::open(format!("redis://127.0.0.1:{}", node.port)).expect("c");
        let mut conn = client.get_connection().expect("node connection");
        let keys: Vec<String> = redis::cmd("KEYS")
            .arg(format!("tg-layout:{{{id}}}:*"))
            .query(&mut conn)
            .expect("KEYS");
        found.extend(keys);
    }
    let expected: BTreeSet<String> = [&record_key, &run_key, &progress_key]
        .into_iter()
        .cloned()
        .collect();
    assert_eq!(found, expected);

    let mut conn = raw(cluster).await;
    let slots: BTreeSet<i64> = [&record_key, &run_key, &progress_key]
        .iter()
        .map(|k| cluster_keyslot(k))
        .collect();
    assert_eq!(slots.len(), 1, "one hash slot for the whole run");
    assert_eq!(
        q::<String>(&mut conn, &["TYPE", &record_key]).await,
        "string"
    );
    assert_eq!(q::<String>(&mut conn, &["TYPE", &run_key]).await, "hash");
    assert_eq!(
        q::<String>(&mut conn, &["TYPE", &progress_key]).await,
        "list"
    );
    let body: String = q(&mut conn, &["GET", &record_key]).await;
    assert_eq!(
        body,
        done.to_json().expect("json"),
        "the record is the Rust serialization, byte for byte"
    );
    let ids: Vec<String> = q(&mut conn, &["LRANGE", &progress_key, "0", "-1"]).await;
    assert_eq!(ids, ["call_abc"]);
    let state: String = q(&mut conn, &["HGET", &run_key, "state"]).await;
    assert_eq!(state, "ACTIVE");
    let keys = Keys {
        prefix: "tg-layout".into(),
    };
    assert_eq!(keys.record(id, "call_abc"), record_key);
    assert_eq!(keys.run(id), run_key);
    assert_eq!(keys.progress(id), progress_key);
}

/// The slot of a key, computed locally (CRC16 of the hash tag), so no node is asked.
fn cluster_keyslot(key: &str) -> i64 {
    let bytes = key.as_bytes();
    let tag = match (key.find('{'), key.find('}')) {
        (Some(open), Some(close)) if close > open + 1 => &bytes[open + 1..close],
        _ => bytes,
    };
    let mut crc: u16 = 0;
    for &b in tag {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    i64::from(crc % 16384)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expiry_instants_never_move() {
    let cluster = redis_cluster::shared();
    let ttl = 60_000;
    let store = connect(&config(cluster, ttl, Durability::Primary, SUITE_TIMEOUT)).await;
    let mut conn = raw(cluster).await;
    let before_create = clock::now_ms();
    let run = store
        .create_run(new_run("pexpire", 10, &[], 1 << 20, 30_000))
        .await
        .expect("create");
    let after_create = clock::now_ms();
    let keys = Keys {
        prefix: "toolgate".into(),
    };
    let run_key = keys.run(&run.run_id);
    let progress_key = keys.progress(&run.run_id);
    let run_at: i64 = q(&mut conn, &["PEXPIRETIME", &run_key]).await;
    let key_ttl = run.key_ttl_ms(ttl) as i64;
    assert_eq!(key_ttl, 30_000 + 60_000);
    assert!(
        (before_create as i64 + key_ttl..=after_create as i64 + key_ttl).contains(&run_at),
        "run key expires timeout + record TTL after creation: {run_at}"
    );

    let a = projecting(&run, "a", "search");
    let before_reserve = clock::now_ms() as i64;
    store
        .reserve(&a, run.created_ms + 1)
        .await
        .expect("reserve");
    let after_reserve = clock::now_ms() as i64;
    let record_key = keys.record(&run.run_id, "a");
    let record_at: i64 = q(&mut conn, &["PEXPIRETIME", &record_key]).await;
    assert!(
        (before_reserve + ttl as i64..=after_reserve + ttl as i64).contains(&record_at),
        "record expires record_ttl after reservation: {record_at}"
    );

    tokio::time::sleep(Duration::from_millis(20)).await;
    store.get_record(&run.run_id, "a").await.expect("read");
    store.get_run(&run.run_id).await.expect("read");
    store.progress(&run.run_id).await.expect("read");
    store.ping().await.expect("ping");
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &record_key]).await,
        record_at
    );
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &run_key]).await,
        run_at
    );

    store.finalize(&ready(&a), 1 << 20).await.expect("finalize");
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &record_key]).await,
        record_at,
        "finalize keeps the record's expiry"
    );
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &progress_key]).await,
        run_at,
        "the progress list expires with the run"
    );
    let b = projecting(&run, "b", "search");
    store
        .reserve(&b, run.created_ms + 2)
        .await
        .expect("reserve b");
    store
        .finalize(&error(&b, Code::ToolTimeout), 1 << 20)
        .await
        .expect("finalize b");
    store
        .close_run(&run.run_id, toolgate::store::RunState::Ended)
        .await
        .expect("close");
    store.progress(&run.run_id).await.expect("read");
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &run_key]).await,
        run_at
    );
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &progress_key]).await,
        run_at
    );
    assert_eq!(
        q::<i64>(&mut conn, &["PEXPIRETIME", &record_key]).await,
        record_at
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_expired_mid_call_leaves_no_key() {
    let cluster = redis_cluster::shared();
    let store = connect(&config(cluster, 300, Durability::Primary, SUITE_TIMEOUT)).await;
    let run = store
        .create_run(new_run("midcall", 10, &[], 1 << 20, 600_000))
        .await
        .expect("create");
    let a = projecting(&run, "a", "search");
    store
        .reserve(&a, run.created_ms + 1)
        .await
        .expect("reserve");
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        code(store.finalize(&ready(&a), 1 << 20).await),
        Code::RecordExpired
    );
    let keys = Keys {
        prefix: "toolgate".into(),
    };
    let mut conn = raw(cluster).await;
    let exists: i64 = q(
        &mut conn,
        &[
            "EXISTS",
            &keys.record(&run.run_id, "a"),
            &keys.progress(&run.run_id),
        ],
    )
    .await;
    assert_eq!(exists, 0, "neither the record nor a progress entry exists");
    let bytes: String = q(
        &mut conn,
        &["HGET", &keys.run(&run.run_id), "record_bytes_used"],
    )
    .await;
    assert_eq!(bytes, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_race_across_connections() {
    let cluster = redis_cluster::shared();
    let cfg = config(cluster, 60_000, Durability::Primary, SUITE_TIMEOUT);
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(connect(&cfg).await);
    }
    let run = stores[0]
        .create_run(new_run("race", 30, &[("a", 10)], 1 << 20, 600_000))
        .await
        .expect("create");
    // 40 ids (20 per tool), each tried 5 times from different connections: 200 racing calls.
    let mut tasks = tokio::task::JoinSet::new();
    for attempt in 0..5 {
        for i in 0..40 {
            let store = stores[(attempt + i) % stores.len()].clone();
            let tool = if i % 2 == 0 { "a" } else { "b" };
            let r = projecting(&run, &format!("call_{i}"), tool);
            let now = run.created_ms + 1;
            tasks.spawn(async move { (i, store.reserve(&r, now).await.map_err(|e| e.code)) });
        }
    }
    let mut wins: BTreeMap<usize, usize> = BTreeMap::new();
    let (mut duplicates, mut exhausted) = (0, 0);
    while let Some(joined) = tasks.join_next().await {
        match joined.expect("task") {
            (i, Ok(())) => *wins.entry(i).or_default() += 1,
            (_, Err(Code::DuplicateToolCall)) => duplicates += 1,
            (_, Err(Code::BudgetExhausted)) => exhausted += 1,
            (_, Err(other)) => panic!("unexpected {other:?}"),
        }
    }
    assert!(wins.values().all(|&n| n == 1), "an id won twice: {wins:?}");
    let a_wins = wins.keys().filter(|i| *i % 2 == 0).count();
    let b_wins = wins.len() - a_wins;
    // The per-tool cap (10) binds tool a; the run's 30 calls are then filled by b.
    assert_eq!((a_wins, b_wins), (10, 20));
    // Each winning id's 4 other attempts came after its win (a refusal never turns into a win).
    assert_eq!(duplicates, 30 * 4);
    assert_eq!(exhausted, 200 - 30 - 120);
    let view: RunView = stores[1]
        .get_run(&run.run_id)
        .await
        .expect("get_run")
        .expect("run");
    assert_eq!(view.calls_used, 30);
    assert_eq!(
        view.calls_per_tool,
        BTreeMap::from([("a".into(), 10), ("b".into(), 20)])
    );
}

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
    };
    // Nothing listens yet: the store opens, and every operation is STORE_UNAVAILABLE in time.
    let started = Instant::now();
    let store = RedisStore::connect(&cfg)
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
    op: impl std::future::Future<Output = toolgate::error::Result<T>>,
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
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .expect("spawn cluster");
    let timeout = Duration::from_millis(500);
    let store = connect(&config(&cluster, 60_000, Durability::Primary, timeout)).await;
    let run = store
        .create_run(new_run("frozen", 100, &[], 1 << 20, 600_000))
        .await
        .expect("create");
    let a = projecting(&run, "a", "search");
    store
        .reserve(&a, run.created_ms + 1)
        .await
        .expect("reserve");

    cluster.pause_primaries();
    let b = projecting(&run, "b", "search");
    assert_unavailable("reserve", timeout, store.reserve(&b, run.created_ms + 2)).await;
    assert_unavailable("finalize", timeout, store.finalize(&ready(&a), 1 << 20)).await;
    assert_unavailable("get_run", timeout, store.get_run(&run.run_id)).await;
    assert_unavailable("get_record", timeout, store.get_record(&run.run_id, "a")).await;
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
        .get_record(&run.run_id, "c")
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

/// What the writers of the failover test share.
#[derive(Default)]
struct Load {
    /// (run, tool_call_id) of every finalize answered `Written`: what an agent was told READY.
    acked: Mutex<Vec<(String, String)>>,
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

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn killing_a_primary_loses_no_acknowledged_record() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("spawn cluster"),
    );
    let timeout = Duration::from_millis(1000);
    let cfg = config(&cluster, 300_000, Durability::Replica, timeout);
    let store = connect(&cfg).await;
    let keys = Keys {
        prefix: "toolgate".into(),
    };
    let mut runs = Vec::new();
    for _ in 0..12 {
        runs.push(
            store
                .create_run(new_run("failover", 1_000_000, &[], 1 << 30, 600_000))
                .await
                .expect("create"),
        );
    }
    let victim = cluster.primary_index_for_key(&keys.run(&runs[0].run_id));
    let on_victim: BTreeSet<String> = runs
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
    load.wait_until("acknowledged records before the kill", |l| l.acks() >= 100)
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
    let reader = connect(&config(&cluster, 300_000, Durability::Primary, timeout)).await;
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
        .get_record(&run.run_id, "after-failover")
        .await
        .expect("read")
        .expect("exists");
    assert_eq!(stored.status, Status::Ready);
}

/// One command on one node, any reply shape; fails the test on an error.
fn on_node(port: u16, args: &[&str]) -> redis::Value {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).expect("client");
    let mut conn = client
        .get_connection_with_timeout(Duration::from_secs(2))
        .unwrap_or_else(|e| panic!("connect to {port}: {e}"));
    conn.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query(&mut conn)
        .unwrap_or_else(|e| panic!("{port} {args:?}: {e}"))
}

fn node_id(port: u16) -> String {
    redis_cluster::query(port, &["CLUSTER", "MYID"]).expect("CLUSTER MYID")
}

fn count_keys_in_slot(port: u16, slot: u16) -> i64 {
    redis::from_redis_value(on_node(
        port,
        &["CLUSTER", "COUNTKEYSINSLOT", &slot.to_string()],
    ))
    .expect("COUNTKEYSINSLOT")
}

/// Whether node `port` sees `owner` as the only node serving `slot`, with no migration left in
/// its own view and the cluster state ok.
fn sees_owner(port: u16, slot: u16, owner: &str) -> bool {
    let Some(nodes) = redis_cluster::query(port, &["CLUSTER", "NODES"]) else {
        return false;
    };
    let owners: Vec<&str> = nodes
        .lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let serves = f.len() > 8
                && f[8..].iter().any(|range| {
                    let mut ends = range.split('-').map(|p| p.parse::<u16>());
                    match (ends.next(), ends.next()) {
                        (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                        (Some(Ok(a)), None) => a == slot,
                        _ => false,
                    }
                });
            serves.then_some(f[0])
        })
        .collect();
    let info = redis_cluster::query(port, &["CLUSTER", "INFO"]).unwrap_or_default();
    owners == [owner] && !nodes.contains(&format!("[{slot}-")) && info.contains("cluster_state:ok")
}

/// How many `kind` error replies (MOVED, ASK, TRYAGAIN) node `port` has sent (INFO errorstats).
fn error_replies(port: u16, kind: &str) -> u64 {
    let stats = redis_cluster::query(port, &["INFO", "errorstats"]).expect("INFO errorstats");
    let prefix = format!("errorstat_{kind}:count=");
    stats
        .lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .map_or(0, |n| n.trim().parse().expect("count"))
}

/// What a slot migration did, and the redirects the store met while the slot moved.
struct Migration {
    keys: usize,
    batches: usize,
    /// TRYAGAIN replies, from the source and the target, and ASK replies from the source.
    tryagain: u64,
    ask: u64,
}

/// A call of the resharding load that answered an error, and when it ran.
#[derive(Clone)]
struct Failure {
    op: &'static str,
    started: Instant,
    ended: Instant,
    code: Code,
    cause: String,
}

/// What the load of the resharding test records.
#[derive(Default)]
struct Reshard {
    /// Ids whose reserve answered Ok.
    reserved: Mutex<Vec<String>>,
    /// Ids whose reserve answered an error (they may still have run: a lost reply).
    unreserved: Mutex<Vec<String>>,
    /// Ids whose finalize answered `Written`: what an agent was told READY.
    written: Mutex<Vec<String>>,
    errors: Mutex<Vec<Failure>>,
    stop: AtomicBool,
}

impl Reshard {
    fn writes(&self) -> usize {
        lock(&self.written).len()
    }

    async fn wait_until(&self, what: &str, done: impl Fn(&Reshard) -> bool) {
        let deadline = Deadline::after(Duration::from_secs(30), what);
        while !done(self) {
            deadline.tick().await;
        }
    }
}

/// Moves `slot` from `src` to `dst` by hand, as `redis-cli --cluster reshard` does: IMPORTING on
/// the target, MIGRATING on the source, MIGRATE batch by batch until the source holds no key of
/// the slot, then `SETSLOT NODE` everywhere.
fn migrate_slot(cluster: &RedisCluster, slot: u16, src: u16, dst: u16) -> Migration {
    let (src_id, dst_id) = (node_id(src), node_id(dst));
    let slot_arg = slot.to_string();
    let dst_port = dst.to_string();
    on_node(
        dst,
        &["CLUSTER", "SETSLOT", &slot_arg, "IMPORTING", &src_id],
    );
    on_node(
        src,
        &["CLUSTER", "SETSLOT", &slot_arg, "MIGRATING", &dst_id],
    );
    // Held open until the load met each phase, so the redirects are seen, not just possible:
    // here a reserve finds the run key but not its new record key on the source: TRYAGAIN.
    let deadline = Instant::now() + Duration::from_secs(30);
    let (src_tryagain, src_ask, dst_tryagain) = (
        error_replies(src, "TRYAGAIN"),
        error_replies(src, "ASK"),
        error_replies(dst, "TRYAGAIN"),
    );
    redis_cluster::poll(deadline, "TRYAGAIN from the migrating source", || {
        error_replies(src, "TRYAGAIN") > src_tryagain
    });
    let (mut moved, mut batches) = (0, 0);
    loop {
        let keys: Vec<String> = redis::from_redis_value(on_node(
            src,
            &["CLUSTER", "GETKEYSINSLOT", &slot_arg, "100"],
        ))
        .expect("GETKEYSINSLOT");
        if keys.is_empty() {
            break;
        }
        let mut args = vec!["MIGRATE", "127.0.0.1", &dst_port, "", "0", "5000", "KEYS"];
        args.extend(keys.iter().map(String::as_str));
        // NOKEY only if every key of the batch expired meanwhile; the loop then looks again.
        on_node(src, &args);
        moved += keys.len();
        batches += 1;
    }
    // Once the run key moved (during the batches or now, every key on the target and the slot
    // still the source's), the source answers ASK to a call none of whose keys it holds, and the
    // importing target runs a script whose keys all exist (finalize) but answers TRYAGAIN to one
    // with a key still to create (reserve). Held until both were seen.
    redis_cluster::poll(
        deadline,
        "ASK from the source, TRYAGAIN from the target",
        || error_replies(src, "ASK") > src_ask && error_replies(dst, "TRYAGAIN") > dst_tryagain,
    );
    let migration = Migration {
        keys: moved,
        batches,
        tryagain: error_replies(src, "TRYAGAIN") - src_tryagain + error_replies(dst, "TRYAGAIN")
            - dst_tryagain,
        ask: error_replies(src, "ASK") - src_ask,
    };
    let mut order = vec![dst, src];
    order.extend(
        cluster
            .primaries()
            .iter()
            .map(|n| n.port)
            .filter(|p| *p != src && *p != dst),
    );
    for port in order {
        on_node(port, &["CLUSTER", "SETSLOT", &slot_arg, "NODE", &dst_id]);
    }
    let deadline = Instant::now() + Duration::from_secs(30);
    for node in &cluster.nodes {
        redis_cluster::poll(
            deadline,
            &format!("node {} to see slot {slot} on {dst}", node.port),
            || sees_owner(node.port, slot, &dst_id),
        );
    }
    migration
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_migration_under_load_is_survived() {
    let cluster = Arc::new(
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("spawn cluster"),
    );
    let timeout = Duration::from_secs(2);
    let store = connect(&config(&cluster, 300_000, Durability::Primary, timeout)).await;
    let run = store
        .create_run(new_run("reshard", 10_000_000, &[], 1 << 40, 600_000))
        .await
        .expect("create");
    let keys = Keys {
        prefix: "toolgate".into(),
    };
    let run_key = keys.run(&run.run_id);
    let any = cluster.primaries()[0].port;
    let slot: u16 = redis_cluster::query(any, &["CLUSTER", "KEYSLOT", &run_key])
        .and_then(|s| s.parse().ok())
        .expect("CLUSTER KEYSLOT");
    let src_index = cluster.primary_index_for_key(&run_key);
    let src = cluster.primaries()[src_index].port;
    let dst = cluster.primaries()[(src_index + 1) % 3].port;

    let load = Arc::new(Reshard::default());
    let mut workers = tokio::task::JoinSet::new();
    for w in 0..4 {
        let (store, run, load) = (store.clone(), run.clone(), load.clone());
        workers.spawn(async move {
            for n in 0usize.. {
                if load.stop.load(Ordering::Relaxed) {
                    break;
                }
                let id = format!("w{w}-{n}");
                let r = projecting(&run, &id, "search");
                let started = Instant::now();
                match store.reserve(&r, run.created_ms + 1).await {
                    Ok(()) => lock(&load.reserved).push(id.clone()),
                    Err(e) => {
                        lock(&load.unreserved).push(id.clone());
                        lock(&load.errors).push(Failure {
                            op: "reserve",
                            started,
                            ended: Instant::now(),
                            code: e.code,
                            cause: e.cause,
                        });
                        continue;
                    }
                }
                let started = Instant::now();
                match store.finalize(&ready(&r), 1 << 20).await {
                    Ok(Finalized::Written) => lock(&load.written).push(id),
                    Ok(other) => lock(&load.errors).push(Failure {
                        op: "finalize",
                        started,
                        ended: Instant::now(),
                        code: Code::Internal,
                        cause: format!("finalize answered {other:?}"),
                    }),
                    Err(e) => lock(&load.errors).push(Failure {
                        op: "finalize",
                        started,
                        ended: Instant::now(),
                        code: e.code,
                        cause: e.cause,
                    }),
                }
            }
        });
    }
    // Enough keys in the slot for several MIGRATE batches.
    load.wait_until("calls before the migration", |l| l.writes() >= 300)
        .await;

    let src_moved = error_replies(src, "MOVED");
    let window_start = Instant::now();
    let c = cluster.clone();
    let migration = tokio::task::spawn_blocking(move || migrate_slot(&c, slot, src, dst))
        .await
        .expect("migration");
    let window_end = Instant::now();
    let after_move = load.writes();
    load.wait_until("calls after the migration", |l| {
        l.writes() >= after_move + 300
    })
    .await;
    load.stop.store(true, Ordering::Relaxed);
    while let Some(joined) = workers.join_next().await {
        joined.expect("worker");
    }

    // Only STORE_UNAVAILABLE, and only for calls that overlapped the migration window. The ids
    // are fresh, so DUPLICATE_TOOL_CALL could only be the client retrying a reserve that had run;
    // MOVED, ASK and TRYAGAIN refuse a command before it runs, so a migration must not cause one.
    let errors = lock(&load.errors).clone();
    for e in &errors {
        assert_eq!(e.code, Code::StoreUnavailable, "{}: {}", e.op, e.cause);
        assert!(
            e.started < window_end && e.ended > window_start,
            "{} failed outside the migration window: {}",
            e.op,
            e.cause
        );
    }
    let reserve_errors = errors.iter().filter(|e| e.op == "reserve").count();
    eprintln!(
        "slot {slot} moved {src} -> {dst} in {:?}: {} keys in {} MIGRATE batches; the store met \
         {} TRYAGAIN and {} ASK; {reserve_errors} reserve and {} finalize errors, all \
         STORE_UNAVAILABLE: {:?}",
        window_end - window_start,
        migration.keys,
        migration.batches,
        migration.tryagain,
        migration.ask,
        errors.len() - reserve_errors,
        errors.iter().map(|e| &e.cause).collect::<BTreeSet<_>>()
    );

    // After SETSLOT NODE the source redirects the store's stale slot map with MOVED.
    let moved_replies = error_replies(src, "MOVED") - src_moved;
    assert!(moved_replies > 0, "the store never met MOVED");
    eprintln!("the source answered MOVED {moved_replies} times");

    // The same store object keeps working: no restart.
    let after = projecting(&run, "after-migration", "search");
    store
        .reserve(&after, run.created_ms + 1)
        .await
        .expect("reserve after the migration");
    assert_eq!(
        store
            .finalize(&ready(&after), 1 << 20)
            .await
            .expect("finalize after the migration"),
        Finalized::Written
    );
    let mut reserved = lock(&load.reserved).clone();
    reserved.push(after.tool_call_id.clone());
    let mut written = lock(&load.written).clone();
    written.push(after.tool_call_id.clone());

    // A reserve that answered an error may still have run (its reply was lost to the timeout,
    // while the script ran): its record then exists and its call was counted once, which is
    // right, not a double spend. Counted here so calls_used can be checked exactly.
    let unreserved = lock(&load.unreserved).clone();
    let mut lost_replies = 0;
    for id in &unreserved {
        if store
            .get_record(&run.run_id, id)
            .await
            .expect("read")
            .is_some()
        {
            lost_replies += 1;
        }
    }
    eprintln!(
        "{} calls reserved, {} refused, {lost_replies} of those lost replies",
        reserved.len(),
        unreserved.len()
    );
    let mut records = 0;
    for id in &reserved {
        let (record, _) = store
            .get_record(&run.run_id, id)
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("reserved {id} has no record"));
        assert_eq!(record.tool_call_id, *id);
        records += 1;
    }
    let view = store
        .get_run(&run.run_id)
        .await
        .expect("get_run")
        .expect("run");
    assert_eq!(
        view.calls_used as usize,
        reserved.len() + lost_replies,
        "calls_used counts each reserved call once ({lost_replies} lost replies)"
    );
    for id in &written {
        let (record, _) = store
            .get_record(&run.run_id, id)
            .await
            .expect("read")
            .unwrap_or_else(|| panic!("acknowledged {id} is gone"));
        assert_eq!(record.status, Status::Ready, "{id}");
    }
    let progress = store
        .progress(&run.run_id)
        .await
        .expect("progress")
        .expect("run");
    let listed: BTreeSet<&str> = progress.iter().map(|(id, _)| id.as_str()).collect();
    assert_eq!(listed.len(), progress.len(), "an id listed twice");
    for id in &written {
        assert!(
            listed.contains(id.as_str()),
            "acknowledged {id} not in progress"
        );
    }
    for id in &listed {
        assert!(
            reserved.iter().chain(&unreserved).any(|r| r == id),
            "{id} in progress was never reserved"
        );
    }

    // The slot's keys all live on the target now: run, progress list and every record.
    assert_eq!(count_keys_in_slot(src, slot), 0);
    assert_eq!(
        count_keys_in_slot(dst, slot) as usize,
        2 + records + lost_replies
    );
}
