//! Reserve and finalize go straight to the primary that owns the run's slot; a direct
//! connection that dies costs nothing but a detour through the cluster client, and is replaced.

use std::time::Duration;

use serde_json::json;
use toolgate::config::Durability;
use toolgate::store::redis::{CLIENT_NAME, RedisStore, slot};
use toolgate::store::{Finalized, Keys, Store};

use crate::store::{new_run, projecting, ready, redis_config};
use crate::support::fake_tool::FakeTool;
use crate::support::redis_cluster::{self, RedisCluster};
use crate::support::sidecar::Sidecar;
use crate::support::{Deadline, unique, yaml_list};

/// The `CLIENT LIST` lines of the direct connections on node `port` whose last command was
/// `EVALSHA`.
fn direct_writer_lines(port: u16) -> Vec<String> {
    let list = redis_cluster::query(port, &["CLIENT", "LIST"]).expect("CLIENT LIST");
    list.lines()
        .filter(|l| {
            l.split(' ').any(|f| f == format!("name={CLIENT_NAME}"))
                && l.split(' ').any(|f| f == "cmd=evalsha")
        })
        .map(str::to_string)
        .collect()
}

/// The ids of the direct connections on node `port` whose last command was `EVALSHA`.
fn direct_writers(port: u16) -> Vec<String> {
    direct_writer_lines(port)
        .iter()
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
}

/// Connects a store with `cfg`, waits for its slot map, and creates run `run_id`; returns the
/// store, the run, and the port of the primary that owns the run's slot.
async fn store_with_run(
    cluster: &RedisCluster,
    cfg: &toolgate::config::StoreConfig,
    run_id: &str,
) -> (RedisStore, toolgate::store::RunView, u16) {
    let store = RedisStore::connect(cfg, crate::store::sealer())
        .await
        .expect("connect");
    let deadline = Deadline::after(Duration::from_secs(20), "the slot map");
    while !store.direct_ready() {
        deadline.tick().await;
    }
    let run = store
        .create_run(new_run(run_id, 1000, &[], 1 << 30, 600_000))
        .await
        .expect("create");
    let run_key = Keys {
        prefix: cfg.key_prefix.clone(),
    }
    .run(&run.run_id);
    let owner = cluster.primaries()[cluster.primary_index_for_key(&run_key)].port;
    (store, run, owner)
}

async fn one_call(store: &RedisStore, run: &toolgate::store::RunView, id: &str) {
    let r = projecting(run, id, "search");
    store
        .reserve(&r, run.created_ms + 1)
        .await
        .unwrap_or_else(|e| panic!("reserve {id}: {e:?}"));
    let done = store
        .finalize(&ready(&r), 1 << 20)
        .await
        .unwrap_or_else(|e| panic!("finalize {id}: {e:?}"));
    assert!(
        matches!(done, Finalized::Written),
        "finalize {id}: {done:?}"
    );
}

#[test]
fn slots_agree_with_cluster_keyslot() {
    let cluster = redis_cluster::shared();
    let port = cluster.primaries()[0].port;
    let keys = [
        "foo",
        "toolgate:{run-1}:run",
        "tg:{a}:call_1",
        "{}x",
        "x{}{y}",
        "a{{b}}c",
        "{user1000}.following",
        "ünïcode:{ключ}:run",
        "no tag at all",
        "",
    ];
    for key in keys {
        let theirs: u16 = redis_cluster::query(port, &["CLUSTER", "KEYSLOT", key])
            .and_then(|s| s.parse().ok())
            .expect("CLUSTER KEYSLOT");
        assert_eq!(slot(key.as_bytes()), theirs, "slot of {key:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_go_straight_to_the_slot_owner_and_survive_its_connection_dying() {
    // A cluster of its own: the only direct connections on it are this store's.
    let cluster = RedisCluster::spawn().await;
    let cfg = redis_config(
        &cluster,
        60_000,
        Durability::Primary,
        Duration::from_secs(2),
    );
    let (store, run, owner) = store_with_run(&cluster, &cfg, "direct").await;
    let others: Vec<u16> = cluster
        .primaries()
        .iter()
        .map(|n| n.port)
        .filter(|&p| p != owner)
        .collect();

    one_call(&store, &run, "call_1").await;
    let first = direct_writers(owner);
    assert_eq!(
        first.len(),
        1,
        "one direct connection wrote on the owner: {first:?}"
    );
    for port in &others {
        assert!(
            direct_writers(*port).is_empty(),
            "no direct write on {port}"
        );
    }

    // The direct connection dies: the next call is still READY (through the cluster client),
    // and a new direct connection takes over.
    redis_cluster::query(owner, &["CLIENT", "KILL", "ID", &first[0]]).expect("CLIENT KILL");
    one_call(&store, &run, "call_2").await;
    let deadline = Deadline::after(Duration::from_secs(20), "a new direct connection");
    let mut n = 3;
    loop {
        one_call(&store, &run, &format!("call_{n}")).await;
        n += 1;
        let now = direct_writers(owner);
        if !now.is_empty() {
            assert_ne!(now, first, "the killed connection is gone");
            break;
        }
        deadline.tick().await;
    }
    let progress = store
        .progress(&run.run_id)
        .await
        .expect("progress")
        .expect("run");
    assert_eq!(progress.len(), n - 1, "every call is in the run's progress");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn direct_connections_authenticate_with_the_urls_credentials() {
    // A cluster of its own, with a user `toolgate` on every node (ACLs are per node). The
    // default user stays open for the test's own queries.
    let cluster = RedisCluster::spawn().await;
    for node in &cluster.nodes {
        let set = [
            "ACL", "SETUSER", "toolgate", "on", ">s3cret", "~*", "&*", "+@all",
        ];
        assert_eq!(
            redis_cluster::query(node.port, &set).as_deref(),
            Some("OK"),
            "ACL SETUSER on {}",
            node.port
        );
    }
    let mut cfg = redis_config(
        &cluster,
        60_000,
        Durability::Primary,
        Duration::from_secs(2),
    );
    cfg.nodes = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://toolgate:s3cret@127.0.0.1:{}", n.port))
        .collect();
    let (store, run, owner) = store_with_run(&cluster, &cfg, "direct-auth").await;
    one_call(&store, &run, "call_1").await;
    let writers = direct_writer_lines(owner);
    assert_eq!(writers.len(), 1, "one direct writer: {writers:?}");
    assert!(
        writers[0].split(' ').any(|f| f == "user=toolgate"),
        "the direct writer is authenticated as the URL's user: {}",
        writers[0]
    );

    // The wrong password: no direct path and no cluster client, so the call fails closed.
    cfg.nodes = cluster
        .nodes
        .iter()
        .map(|n| format!("redis://toolgate:wrong@127.0.0.1:{}", n.port))
        .collect();
    let refused = RedisStore::connect(&cfg, crate::store::sealer())
        .await
        .expect("connect is lazy");
    let r = projecting(&run, "call_2", "search");
    let err = refused
        .reserve(&r, run.created_ms + 1)
        .await
        .expect_err("refused credentials");
    assert_eq!(err.code, toolgate::error::Code::StoreUnavailable);
    assert!(!refused.direct_ready(), "no slot map without a session");
}

/// How many direct connections are open on node `port`.
fn direct_connections(port: u16) -> usize {
    let list = redis_cluster::query(port, &["CLIENT", "LIST"]).expect("CLIENT LIST");
    list.lines()
        .filter(|l| l.split(' ').any(|f| f == format!("name={CLIENT_NAME}")))
        .count()
}

/// Each serving thread opens its own connection to every primary at its first write; the main
/// runtime, where the admin API runs, opens none.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sidecar_opens_direct_connections_on_its_serving_threads_only() {
    // A cluster of its own: the only direct connections on it are this sidecar's.
    let cluster = RedisCluster::spawn().await;
    let tool = FakeTool::start().await;
    let nodes = yaml_list(&cluster.urls());
    let config = format!(
        "store: {{kind: redis-cluster, nodes: {nodes}, durability: primary, timeout_ms: 2000}}\n\
         tools:\n  - {{name: search, upstream: '{}', read_only: true}}\n",
        tool.url("search")
    );
    let sidecar = Sidecar::start(&config).await;
    let run_id = unique("threads");
    let token = sidecar
        .create_run(json!({"run_id": run_id, "budget": {"max_calls": 10_000}}))
        .await;
    let primaries: Vec<u16> = cluster.primaries().iter().map(|n| n.port).collect();
    let mut n = 0;
    let deadline = Deadline::after(
        Duration::from_secs(20),
        "both serving threads' direct connections",
    );
    loop {
        four_calls(&sidecar, &token, &run_id, &mut n).await;
        if primaries.iter().all(|&p| direct_connections(p) >= 2) {
            break;
        }
        deadline.tick().await;
    }
    // More calls open no more.
    for _ in 0..5 {
        four_calls(&sidecar, &token, &run_id, &mut n).await;
    }
    for port in primaries {
        assert_eq!(
            direct_connections(port),
            2,
            "one direct connection per serving thread on {port}"
        );
    }
}

/// Four calls at once, on as many agent connections: they reach both serving threads. `n`
/// numbers their ids.
async fn four_calls(sidecar: &Sidecar, token: &str, run_id: &str, n: &mut usize) {
    let call = |i: usize| async move {
        let id = format!("call_{i}");
        sidecar
            .invoke(token, run_id, &id, "search", json!({"q": "x"}))
            .await
    };
    let replies = tokio::join!(call(*n), call(*n + 1), call(*n + 2), call(*n + 3));
    *n += 4;
    for r in [replies.0, replies.1, replies.2, replies.3] {
        assert_eq!(r.status, 200, "{}", r.raw);
    }
}
