//! What only a real Redis Cluster can show, beyond the shared store suite (`crate::store`): the
//! exact key layout, expiry instants that never move, and reservations racing across
//! connections. The outages (a frozen cluster, one that comes up late, a primary killed under
//! load) are in [`outages`], a slot migrated under load in [`reshard`].

mod direct;
mod outages;
mod reshard;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Mutex;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use toolgate::clock;
use toolgate::config::Durability;
use toolgate::error::{Code, SizeStage};
use toolgate::store::{Close, FinalBody, Finalized, Keys, Record, RunView, Status};

use crate::store::{
    SUITE_TIMEOUT, call_id, code, connect, create, error, new_run, projecting, ready, redis_config,
    reserved,
};
use crate::support::redis_cluster::{self, RedisCluster};

/// A direct cluster connection, to look at keys the way an operator would.
pub async fn raw(cluster: &RedisCluster) -> ClusterConnection {
    ClusterClient::new(cluster.urls())
        .expect("client")
        .get_async_connection()
        .await
        .expect("raw cluster connection")
}

/// The key names under the suite's default prefix, `toolgate`.
fn toolgate_keys() -> Keys {
    Keys {
        prefix: "toolgate".into(),
    }
}

pub async fn q<T: redis::FromRedisValue>(conn: &mut ClusterConnection, args: &[&str]) -> T {
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
    let mut cfg = redis_config(cluster, 60_000, Durability::Primary, SUITE_TIMEOUT);
    cfg.key_prefix = "tg-layout".into();
    let store = connect(&cfg).await;
    let run = create(
        &store,
        new_run("layout", 10, &[("search", 3)], 1 << 20, 600_000),
    )
    .await;
    let a = reserved(&store, &run, "call_abc", "search").await;
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
        crate::store::finalized(&done).to_json().expect("json"),
        "the record is the Rust serialization, byte for byte"
    );
    let ids: Vec<String> = q(&mut conn, &["LRANGE", &progress_key, "0", "-1"]).await;
    assert_eq!(ids, ["call_abc"]);
    let state: String = q(&mut conn, &["HGET", &run_key, "state"]).await;
    assert_eq!(state, "ACTIVE");
    let keys = Keys {
        prefix: "tg-layout".into(),
    };
    assert_eq!(keys.record(id, &call_id("call_abc")), record_key);
    assert_eq!(keys.run(id), run_key);
    assert_eq!(keys.progress(id), progress_key);
}

/// A run over its byte budget gets the stripped record, which the finalize script splices
/// itself: byte for byte the Rust side's stripped form, for a full body (non-ASCII, escapes and
/// large numbers around the splice points) and for one stripped already at the record limit.
/// The fallback's seal is sent only when the script asks for it (a second script call), with
/// either durability; the first call writes nothing, so each id is in the progress list once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_scripts_run_fallback_is_the_rust_stripped_record() {
    for (durability, prefix) in [
        (Durability::Primary, "tg-fallback"),
        (Durability::Replica, "tg-fallback-replica"),
    ] {
        scripts_run_fallback(durability, prefix).await;
    }
}

async fn scripts_run_fallback(durability: Durability, prefix: &str) {
    let cluster = redis_cluster::shared();
    let mut cfg = redis_config(cluster, 60_000, durability, SUITE_TIMEOUT);
    cfg.key_prefix = prefix.into();
    let store = connect(&cfg).await;
    // Room for one call, and no bytes: every finalize is over the run's budget.
    let run = create(&store, new_run("fallback", 10, &[], 1, 600_000)).await;
    let mut conn = raw(cluster).await;
    let keys = Keys {
        prefix: prefix.into(),
    };
    let full = Record {
        agent_input: serde_json::json!({"q": "\u{1}\u{e9}\\\"", "n": -0.5}),
        raw_response: serde_json::json!({"é": ["\"status\":\"PROJECTING\"", 1e300]}),
        ..ready(&projecting(&run, "whole", "search"))
    };
    let big = Record {
        raw_response: serde_json::json!({"blob": "ü".repeat(600)}),
        ..ready(&projecting(&run, "big", "search"))
    };
    for (done, record_bytes, outcome) in [
        (&full, 1 << 20, Finalized::TooLarge(SizeStage::Run)),
        (&big, 700, Finalized::TooLarge(SizeStage::Run)),
    ] {
        let body = FinalBody::new(done, record_bytes, &crate::store::sealer()).expect("body");
        let reserving = Record {
            status: Status::Projecting,
            evidence_status: None,
            raw_response: serde_json::Value::Null,
            agent_result: serde_json::Value::Null,
            upstream_status: None,
            duration_ms: None,
            ..done.clone()
        };
        store
            .reserve(&reserving, run.created_ms + 1)
            .await
            .expect("reserve");
        assert_eq!(
            store.finalize(done, record_bytes).await.expect("finalize"),
            outcome
        );
        let key = keys.record(&run.run_id, &done.tool_call_id);
        let stored: String = q(&mut conn, &["GET", &key]).await;
        assert_eq!(
            stored,
            body.run_fallback(done, &crate::store::sealer()),
            "{}",
            done.tool_call_id
        );
        assert_eq!(
            Record::from_json(&stored).expect("readable").error_code,
            Some(Code::ResultTooLarge(SizeStage::Record).into())
        );
    }
    let used: u64 = q(
        &mut conn,
        &["HGET", &keys.run(&run.run_id), "record_bytes_used"],
    )
    .await;
    assert_eq!(used, 0, "a fallback adds no bytes");
    let ids: Vec<String> = q(
        &mut conn,
        &["LRANGE", &keys.progress(&run.run_id), "0", "-1"],
    )
    .await;
    assert_eq!(ids, ["whole", "big"], "each id once, in order");
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
    let store = connect(&redis_config(
        cluster,
        ttl,
        Durability::Primary,
        SUITE_TIMEOUT,
    ))
    .await;
    let mut conn = raw(cluster).await;
    let before_create = clock::now_ms();
    let run = create(&store, new_run("pexpire", 10, &[], 1 << 20, 30_000)).await;
    let after_create = clock::now_ms();
    let keys = toolgate_keys();
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
    let record_key = keys.record(&run.run_id, &call_id("a"));
    let record_at: i64 = q(&mut conn, &["PEXPIRETIME", &record_key]).await;
    assert!(
        (before_reserve + ttl as i64..=after_reserve + ttl as i64).contains(&record_at),
        "record expires record_ttl after reservation: {record_at}"
    );

    tokio::time::sleep(Duration::from_millis(20)).await;
    store
        .get_record(&run.run_id, &call_id("a"))
        .await
        .expect("read");
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
        .close_run(&run.run_id, Close::End)
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
    let store = connect(&redis_config(
        cluster,
        300,
        Durability::Primary,
        SUITE_TIMEOUT,
    ))
    .await;
    let run = create(&store, new_run("midcall", 10, &[], 1 << 20, 600_000)).await;
    let a = reserved(&store, &run, "a", "search").await;
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        code(store.finalize(&ready(&a), 1 << 20).await),
        Code::RecordExpired
    );
    let keys = toolgate_keys();
    let mut conn = raw(cluster).await;
    let exists: i64 = q(
        &mut conn,
        &[
            "EXISTS",
            &keys.record(&run.run_id, &call_id("a")),
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

/// A node that lost its scripts (restarted, or `SCRIPT FLUSH`) gets them loaded again by the
/// call that meets `NOSCRIPT`: reserve and finalize still answer, and the record is written.
/// A cluster of its own: a flush on the shared one would take the scripts from under the
/// other tests' calls.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_that_lost_its_scripts_gets_them_again() {
    let cluster = RedisCluster::spawn().await;
    let cluster = &cluster;
    let store = connect(&redis_config(
        cluster,
        600_000,
        Durability::Primary,
        SUITE_TIMEOUT,
    ))
    .await;
    let run = create(&store, new_run("noscript", 10, &[], 1 << 20, 600_000)).await;
    let flush = || {
        for node in cluster.primaries() {
            assert_eq!(
                redis_cluster::query(node.port, &["SCRIPT", "FLUSH"]).as_deref(),
                Some("OK")
            );
        }
    };
    let a = projecting(&run, "a", "search");
    flush();
    store
        .reserve(&a, run.created_ms + 1)
        .await
        .expect("reserve after SCRIPT FLUSH");
    flush();
    let written = store
        .finalize(&ready(&a), 1 << 20)
        .await
        .expect("finalize after SCRIPT FLUSH");
    assert!(matches!(written, toolgate::store::Finalized::Written));
    let keys = toolgate_keys();
    let mut conn = raw(cluster).await;
    let body: String = q(
        &mut conn,
        &["GET", &keys.record(&run.run_id, &call_id("a"))],
    )
    .await;
    assert!(body.contains(r#""status":"READY""#), "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn reservations_race_across_connections() {
    let cluster = redis_cluster::shared();
    let cfg = redis_config(cluster, 60_000, Durability::Primary, SUITE_TIMEOUT);
    let mut stores = Vec::new();
    for _ in 0..4 {
        stores.push(connect(&cfg).await);
    }
    let run = create(
        &stores[0],
        new_run("race", 30, &[("a", 10)], 1 << 20, 600_000),
    )
    .await;
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

/// Locks a mutex of the load tests, poisoned or not.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
