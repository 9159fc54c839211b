//! Reserve and finalize go straight to the primary that owns the run's slot; a direct
//! connection that dies costs nothing but a detour through the cluster client, and is replaced.

use std::time::Duration;

use toolgate::config::Durability;
use toolgate::store::redis::{CLIENT_NAME, RedisStore, slot};
use toolgate::store::{Finalized, Keys, Store};

use crate::store::{new_run, projecting, ready, redis_config};
use crate::support::Deadline;
use crate::support::redis_cluster::{self, RedisCluster};

/// The ids of the direct connections on node `port` whose last command was `EVALSHA`.
fn direct_writers(port: u16) -> Vec<String> {
    let list = redis_cluster::query(port, &["CLIENT", "LIST"]).expect("CLIENT LIST");
    list.lines()
        .filter(|l| {
            l.split(' ').any(|f| f == format!("name={CLIENT_NAME}"))
                && l.split(' ').any(|f| f == "cmd=evalsha")
        })
        .filter_map(|l| l.split(' ').find_map(|f| f.strip_prefix("id=")))
        .map(str::to_string)
        .collect()
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
    let cluster = tokio::task::spawn_blocking(RedisCluster::start)
        .await
        .expect("spawn cluster");
    let cfg = redis_config(
        &cluster,
        60_000,
        Durability::Primary,
        Duration::from_secs(2),
    );
    let store = RedisStore::connect(&cfg).await.expect("connect");
    let deadline = Deadline::after(Duration::from_secs(20), "the slot map");
    while !store.direct_ready() {
        deadline.tick().await;
    }
    let run = store
        .create_run(new_run("direct", 1000, &[], 1 << 30, 600_000))
        .await
        .expect("create");
    let run_key = Keys {
        prefix: cfg.key_prefix.clone(),
    }
    .run(&run.run_id);
    let owner = cluster.primaries()[cluster.primary_index_for_key(&run_key)].port;
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
