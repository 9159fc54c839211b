//! A slot migrated by hand under load, as `redis-cli --cluster reshard` does: the store meets
//! MOVED, ASK and TRYAGAIN, fails only with STORE_UNAVAILABLE and only while the slot moves, and
//! keeps every acknowledged record, without a restart.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use toolgate::config::Durability;
use toolgate::error::Code;
use toolgate::ids::ToolCallId;
use toolgate::store::{Finalized, Status};

use super::{lock, toolgate_keys};
use crate::store::{connect, create, new_run, projecting, ready, redis_config};
use crate::support::Deadline;
use crate::support::redis_cluster::{self, RedisCluster};

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
    reserved: Mutex<Vec<ToolCallId>>,
    /// Ids whose reserve answered an error (they may still have run: a lost reply).
    unreserved: Mutex<Vec<ToolCallId>>,
    /// Ids whose finalize answered `Written`: what an agent was told READY.
    written: Mutex<Vec<ToolCallId>>,
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
    let cluster = Arc::new(RedisCluster::spawn().await);
    let timeout = Duration::from_secs(2);
    let store = connect(&redis_config(
        &cluster,
        300_000,
        Durability::Primary,
        timeout,
    ))
    .await;
    let run = create(
        &store,
        new_run("reshard", 10_000_000, &[], 1 << 40, 600_000),
    )
    .await;
    let keys = toolgate_keys();
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
                let r = projecting(&run, &format!("w{w}-{n}"), "search");
                let id = r.tool_call_id.clone();
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
