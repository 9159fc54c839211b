//! The store suite: every case runs unchanged against each `Store` backend, as three tests
//! `case::memory`, `case::redis` and `case::redis_replica` (the same Redis Cluster with
//! `durability: replica`, so every finalize also waits for a replica).
//!
//! A backend is a [`Harness`]. Cases use unique run ids, so they can share the binary's one Redis
//! Cluster. Time moves only through [`Harness::advance`]: paused tokio time for memory, real time
//! for Redis. Reservations take explicit wall-clock `now_ms` values derived from the run's own
//! creation time.
//!
//! The builders here ([`new_run`], [`create`], [`projecting`], [`reserved`], [`ready`], [`error`],
//! [`code`]) and the Redis store config are shared with the Redis-only tests of `crate::redis`.

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use serde_json::{Value, json};
use tokio::task::JoinSet;
use toolgate::clock;
use toolgate::config::{DEFAULT_MEMORY_MAX_BYTES, Durability, RunPaths, StoreConfig, StoreKind};
use toolgate::error::{Code, CodeName, Result, SizeStage};
use toolgate::evidence::Sealer;
use toolgate::ids::{RunId, ToolCallId, ToolName};
use toolgate::store::memory::MemoryStore;
use toolgate::store::redis::RedisStore;
use toolgate::store::{
    Budget, Close, Evidence, FinalBody, Finalized, NewRun, Record, RunState, RunView, Status,
    Store, facts,
};

use crate::support::redis_cluster::{self, RedisCluster};
use crate::support::unique;

/// For each case `async fn case(h: &impl Harness)`, a module `case` with one test per backend.
macro_rules! on_every_store {
    ($($case:ident),+ $(,)?) => {
        $(
            mod $case {
                use super::{Memory, Redis};

                #[tokio::test(start_paused = true)]
                async fn memory() {
                    super::$case(&Memory).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis() {
                    super::$case(&Redis::primary()).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn redis_replica() {
                    super::$case(&Redis::replica()).await;
                }
            }
        )+
    };
}

on_every_store!(
    create_and_get_run,
    create_run_twice_is_run_exists,
    close_run_to_ended_is_final,
    close_run_to_cancelled_is_idempotent,
    reserve_creates_projecting_record_and_moves_counters,
    reserve_on_unknown_or_closed_run_is_run_inactive,
    reserve_checks_in_contract_order,
    duplicate_leaves_first_record_untouched,
    run_call_budget_is_enforced,
    per_tool_budget_is_enforced,
    used_up_record_bytes_exhaust_the_budget,
    reserve_refuses_a_malformed_record,
    finalize_ready_and_error,
    finalizing_twice_is_internal,
    finalize_refuses_invalid_shapes,
    record_over_record_bytes_is_stored_stripped,
    run_over_max_record_bytes_is_stored_stripped,
    progress_order_and_facts,
    facts_exclude_expired_records,
    ttl_is_set_at_creation_and_not_renewed_by_reads,
    finalize_keeps_the_remaining_ttl,
    record_is_gone_after_its_ttl,
    finalize_after_expiry_is_record_expired,
    run_and_progress_outlive_records,
    concurrent_reserves_of_one_id_have_one_winner,
    concurrent_reserves_never_overspend,
    ping_answers,
);

// ---------------------------------------------------------------------------------------------
// The backends.

/// What a backend gives the suite.
pub trait Harness: Sync {
    /// A store whose records live `record_ttl_ms`.
    fn store(&self, record_ttl_ms: u64) -> impl Future<Output = Arc<dyn Store>> + Send;
    /// Lets `d` pass for the store's TTLs.
    fn advance(&self, d: Duration) -> impl Future<Output = ()> + Send;
}

/// The embedded `MemoryStore`. Each case runs on a paused clock, so TTLs move only through
/// `advance`.
struct Memory;

impl Harness for Memory {
    async fn store(&self, record_ttl_ms: u64) -> Arc<dyn Store> {
        Arc::new(MemoryStore::new(record_ttl_ms, sealer()))
    }

    async fn advance(&self, d: Duration) {
        tokio::time::advance(d).await;
    }
}

/// A `RedisStore` on the binary's shared cluster, in real time.
struct Redis {
    cluster: &'static RedisCluster,
    durability: Durability,
}

impl Redis {
    fn primary() -> Redis {
        Redis {
            cluster: redis_cluster::shared(),
            durability: Durability::Primary,
        }
    }

    fn replica() -> Redis {
        Redis {
            cluster: redis_cluster::shared(),
            durability: Durability::Replica,
        }
    }
}

impl Harness for Redis {
    async fn store(&self, record_ttl_ms: u64) -> Arc<dyn Store> {
        connect(&redis_config(
            self.cluster,
            record_ttl_ms,
            self.durability,
            SUITE_TIMEOUT,
        ))
        .await
    }

    async fn advance(&self, d: Duration) {
        tokio::time::sleep(d).await;
    }
}

/// The Redis store timeout of the suite: generous for a loaded 2-core machine; the tests about
/// timeouts use their own.
pub const SUITE_TIMEOUT: Duration = Duration::from_secs(2);

/// The store config of a `RedisStore` on `cluster`, under the default key prefix.
pub fn redis_config(
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
        memory_max_bytes: DEFAULT_MEMORY_MAX_BYTES,
    }
}

pub async fn connect(cfg: &StoreConfig) -> Arc<dyn Store> {
    Arc::new(RedisStore::connect(cfg, sealer()).await.expect("connect"))
}

/// `r` as the suite's stores write it when they finalize it: with its digests and seal, read
/// back.
pub fn finalized(r: &Record) -> Record {
    let body = FinalBody::new(r, u64::MAX, &sealer()).expect("final body");
    Record::from_json(&body.text).expect("record")
}

/// The seal key of the suite's stores: any run-token key does.
pub fn sealer() -> Arc<Sealer> {
    Arc::new(Sealer::derive(b"the store suite's run-token key"))
}

// ---------------------------------------------------------------------------------------------
// Builders.

/// Long enough that no record expires during a case that is not about expiry.
const LONG_TTL: u64 = 60_000;
const RUN_TIMEOUT: u64 = 600_000;

/// A run with the given budget, created now, ending `timeout_ms` later.
pub fn new_run(
    tag: &str,
    max_calls: u64,
    per_tool: &[(&str, u64)],
    max_record_bytes: u64,
    timeout_ms: u64,
) -> NewRun {
    let created_ms = clock::now_ms();
    NewRun {
        run_id: run_id(tag),
        created_ms,
        deadline_ms: created_ms + timeout_ms,
        budget: Budget {
            max_calls,
            max_calls_per_tool: per_tool.iter().map(|(t, n)| (t.to_string(), *n)).collect(),
            max_record_bytes,
        },
        tools: None,
        paths: RunPaths::default(),
    }
}

/// A fresh, unique run id.
pub fn run_id(tag: &str) -> RunId {
    RunId::from_string(unique(tag)).expect("a safe run id")
}

/// A tool-call id the test knows to be safe.
pub fn call_id(id: &str) -> ToolCallId {
    ToolCallId::parse(id).expect("a safe tool_call_id")
}

/// A tool name the test knows to be safe.
pub fn tool_name(name: &str) -> ToolName {
    ToolName::parse(name).expect("a safe tool name")
}

/// A run with room for anything a case does.
fn roomy(tag: &str) -> NewRun {
    new_run(tag, 100, &[], 8 << 20, RUN_TIMEOUT)
}

/// A PROJECTING record whose request holds numbers a JSON re-encoder would alter.
pub fn projecting(run: &RunView, id: &str, tool: &str) -> Record {
    Record::projecting(
        run.run_id.clone(),
        call_id(id),
        tool_name(tool),
        json!({"q": "redis", "big": 9007199254740993u64, "f": 0.1, "s": "é\"}"}),
        run.created_ms,
    )
}

/// Creates `new` on `store`; returns the ACTIVE run.
pub async fn create(store: &Arc<dyn Store>, new: NewRun) -> RunView {
    store.create_run(new).await.expect("create")
}

/// Reserves `id` of `tool` on `run` just after its creation; returns the PROJECTING record.
pub async fn reserved(store: &Arc<dyn Store>, run: &RunView, id: &str, tool: &str) -> Record {
    let r = projecting(run, id, tool);
    store
        .reserve(&r, run.created_ms + 1)
        .await
        .unwrap_or_else(|e| panic!("reserve {id}: {e:?}"));
    r
}

/// `r` finalized READY with `EVIDENCE_FOUND`.
pub fn ready(r: &Record) -> Record {
    Record {
        status: Status::Ready,
        evidence_status: Some(Evidence::Found),
        raw_response: json!({"results": [{"title": "a", "n": 12345678901234567890u64}, {"x": 1e-7}]}),
        agent_result: json!({"items": [{"title": "a"}], "total_items": 2}),
        upstream_status: Some(200),
        updated_at: clock::rfc3339(clock::now_ms()),
        duration_ms: Some(12),
        ..r.clone()
    }
}

/// `r` finalized READY with `NO_EVIDENCE`.
fn no_evidence(r: &Record) -> Record {
    Record {
        evidence_status: Some(Evidence::None),
        agent_result: json!({"scope": {"tool": r.tool, "input": r.request}}),
        raw_response: json!({"results": []}),
        ..ready(r)
    }
}

/// `r` finalized ERROR with `code`.
pub fn error(r: &Record, code: Code) -> Record {
    Record {
        status: Status::Error,
        evidence_status: Some(Evidence::Error),
        raw_response: Value::Null,
        agent_result: Value::Null,
        error_code: Some(code.into()),
        upstream_status: None,
        updated_at: clock::rfc3339(clock::now_ms()),
        duration_ms: Some(5),
        ..r.clone()
    }
}

/// The bytes a finalize of `r` adds to the run when it fits.
fn size_of(r: &Record, record_bytes: u64) -> u64 {
    FinalBody::new(r, record_bytes, &sealer())
        .expect("a valid final record")
        .size()
}

#[track_caller]
pub fn code<T: std::fmt::Debug>(r: Result<T>) -> Code {
    match r {
        Ok(v) => panic!("expected an error, got Ok({v:?})"),
        Err(e) => e.code,
    }
}

async fn run_of(store: &Arc<dyn Store>, run_id: &RunId) -> RunView {
    store
        .get_run(run_id)
        .await
        .expect("get_run")
        .expect("the run exists")
}

async fn record_of(store: &Arc<dyn Store>, r: &Record) -> Option<(Record, u64)> {
    store
        .get_record(&r.run_id, &r.tool_call_id)
        .await
        .expect("get_record")
}

async fn progress_ids(store: &Arc<dyn Store>, run_id: &RunId) -> Vec<String> {
    store
        .progress(run_id)
        .await
        .expect("progress")
        .expect("the run exists")
        .into_iter()
        .map(|(id, _)| id.to_string())
        .collect()
}

// ---------------------------------------------------------------------------------------------
// Runs: create, get, close.

async fn create_and_get_run(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let new = new_run("create", 7, &[("search", 2)], 4096, RUN_TIMEOUT);
    let created = store.create_run(new.clone()).await.expect("create_run");
    assert_eq!(created, RunView::new(new.clone()));
    assert_eq!(created.state, RunState::Active);
    assert_eq!(created.calls_used, 0);
    assert_eq!(created.record_bytes_used, 0);
    assert!(created.calls_per_tool.is_empty());
    assert_eq!(run_of(&store, &new.run_id).await, created);

    let mut with_tools = roomy("tools");
    with_tools.tools = Some(vec!["search".into(), "fetch".into()]);
    let created = create(&store, with_tools.clone()).await;
    assert_eq!(run_of(&store, &with_tools.run_id).await, created);
    assert_eq!(created.tools, with_tools.tools);

    let unknown = run_id("unknown");
    assert_eq!(store.get_run(&unknown).await.expect("get_run"), None);
    assert_eq!(store.progress(&unknown).await.expect("progress"), None);
    assert!(
        store
            .get_record(&unknown, &call_id("call_1"))
            .await
            .expect("get_record")
            .is_none()
    );
    assert_eq!(
        progress_ids(&store, &new.run_id).await,
        Vec::<String>::new()
    );
}

async fn create_run_twice_is_run_exists(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let first = roomy("exists");
    let created = create(&store, first.clone()).await;
    let second = NewRun {
        budget: Budget {
            max_calls: 1,
            max_calls_per_tool: BTreeMap::new(),
            max_record_bytes: 1,
        },
        ..first.clone()
    };
    assert_eq!(code(store.create_run(second).await), Code::RunExists);
    assert_eq!(
        run_of(&store, &first.run_id).await,
        created,
        "the first run is unchanged"
    );
}

async fn close_run_to_ended_is_final(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("end")).await;
    let ended = store
        .close_run(&run.run_id, Close::End)
        .await
        .expect("close")
        .expect("known run");
    assert_eq!(ended.state, RunState::Ended);
    assert_eq!(
        ended,
        RunView {
            state: RunState::Ended,
            ..run.clone()
        }
    );
    for to in [Close::Cancel, Close::End] {
        let again = store
            .close_run(&run.run_id, to)
            .await
            .expect("close")
            .expect("known run");
        assert_eq!(again.state, RunState::Ended, "closing {to:?} changed it");
    }
    assert_eq!(run_of(&store, &run.run_id).await.state, RunState::Ended);
    let unknown = run_id("unknown");
    assert_eq!(
        store.close_run(&unknown, Close::End).await.expect("close"),
        None
    );
    assert_eq!(store.get_run(&unknown).await.expect("get_run"), None);
}

async fn close_run_to_cancelled_is_idempotent(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("cancel")).await;
    for to in [Close::Cancel, Close::Cancel, Close::End] {
        let view = store
            .close_run(&run.run_id, to)
            .await
            .expect("close")
            .expect("known run");
        assert_eq!(view.state, RunState::Cancelled);
    }
    assert_eq!(run_of(&store, &run.run_id).await.state, RunState::Cancelled);
}

// ---------------------------------------------------------------------------------------------
// Reserve: the atomic reservation and its refusals.

async fn reserve_creates_projecting_record_and_moves_counters(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("reserve")).await;
    let a = reserved(&store, &run, "call_a", "search").await;
    let (stored, ttl) = record_of(&store, &a).await.expect("record a exists");
    assert_eq!(stored, a);
    assert_eq!(stored.status, Status::Projecting);
    assert!(
        ttl <= LONG_TTL && ttl > LONG_TTL - 10_000,
        "ttl {ttl} of {LONG_TTL}"
    );
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 1);
    assert_eq!(view.calls_per_tool, BTreeMap::from([("search".into(), 1)]));

    let b = projecting(&run, "toolu_01:b", "fetch");
    store
        .reserve(&b, run.created_ms + 2)
        .await
        .expect("reserve b");
    let c = projecting(&run, "call_c", "search");
    store
        .reserve(&c, run.created_ms + 3)
        .await
        .expect("reserve c");
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 3);
    assert_eq!(
        view.calls_per_tool,
        BTreeMap::from([("fetch".into(), 1), ("search".into(), 2)])
    );
    assert_eq!(view.record_bytes_used, 0, "bytes are counted at finalize");
    assert_eq!(view.state, RunState::Active);
    assert_eq!(
        progress_ids(&store, &run.run_id).await,
        Vec::<String>::new(),
        "PROJECTING records are not progress"
    );
}

async fn reserve_on_unknown_or_closed_run_is_run_inactive(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let unknown = RunView::new(roomy("unknown"));
    let r = projecting(&unknown, "call_1", "search");
    assert_eq!(
        code(store.reserve(&r, unknown.created_ms + 1).await),
        Code::RunInactive
    );
    assert!(
        record_of(&store, &r).await.is_none(),
        "no record is created"
    );
    assert_eq!(store.get_run(&unknown.run_id).await.expect("get_run"), None);

    for to in [Close::End, Close::Cancel] {
        let run = create(&store, roomy("closed")).await;
        store.close_run(&run.run_id, to).await.expect("close");
        let r = projecting(&run, "call_1", "search");
        assert_eq!(
            code(store.reserve(&r, run.created_ms + 1).await),
            Code::RunInactive,
            "{to:?}"
        );
        assert!(record_of(&store, &r).await.is_none());
        let view = run_of(&store, &run.run_id).await;
        assert_eq!(view.calls_used, 0);
        assert!(view.calls_per_tool.is_empty());
    }
}

async fn reserve_checks_in_contract_order(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(
        &store,
        new_run("order", 1, &[("search", 1)], 1 << 20, RUN_TIMEOUT),
    )
    .await;
    let deadline = run.deadline_ms;
    let a = projecting(&run, "call_a", "search");
    store
        .reserve(&a, deadline - 1)
        .await
        .expect("just before the deadline");

    // a again: duplicate, budget used up, and the deadline passed: the deadline answers.
    assert_eq!(
        code(store.reserve(&a, deadline).await),
        Code::RunDeadlineExceeded
    );
    // Before the deadline: duplicate and budget used up: the duplicate answers.
    assert_eq!(
        code(store.reserve(&a, deadline - 1).await),
        Code::DuplicateToolCall
    );
    let b = projecting(&run, "call_b", "search");
    assert_eq!(
        code(store.reserve(&b, deadline - 1).await),
        Code::BudgetExhausted
    );
    // Ended: inactive wins over everything.
    store
        .close_run(&run.run_id, Close::End)
        .await
        .expect("close");
    assert_eq!(
        code(store.reserve(&a, deadline + 1).await),
        Code::RunInactive
    );
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 1, "refused reservations spend nothing");
    assert_eq!(view.calls_per_tool, BTreeMap::from([("search".into(), 1)]));
    assert!(record_of(&store, &b).await.is_none());

    // The deadline alone.
    let run = create(&store, roomy("deadline")).await;
    let c = projecting(&run, "call_c", "search");
    assert_eq!(
        code(store.reserve(&c, run.deadline_ms).await),
        Code::RunDeadlineExceeded
    );
    assert_eq!(
        code(store.reserve(&c, run.deadline_ms + 60_000).await),
        Code::RunDeadlineExceeded
    );
    assert!(record_of(&store, &c).await.is_none());
    assert_eq!(run_of(&store, &run.run_id).await.calls_used, 0);
}

async fn duplicate_leaves_first_record_untouched(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("dup")).await;
    let first = reserved(&store, &run, "call_dup", "search").await;
    let second = Record {
        tool: tool_name("fetch"),
        request: json!({"url": "https://example.org"}),
        ..first.clone()
    };
    assert_eq!(
        code(store.reserve(&second, run.created_ms + 2).await),
        Code::DuplicateToolCall
    );
    assert_eq!(record_of(&store, &first).await.expect("exists").0, first);
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 1);
    assert_eq!(view.calls_per_tool, BTreeMap::from([("search".into(), 1)]));

    // Still a duplicate once final: the READY record is not replaced.
    let done = ready(&first);
    assert_eq!(
        store.finalize(&done, 1 << 20).await.expect("finalize"),
        Finalized::Written
    );
    assert_eq!(
        code(store.reserve(&first, run.created_ms + 3).await),
        Code::DuplicateToolCall
    );
    assert_eq!(
        record_of(&store, &first).await.expect("exists").0,
        finalized(&done)
    );
    assert_eq!(progress_ids(&store, &run.run_id).await, ["call_dup"]);
    assert_eq!(run_of(&store, &run.run_id).await.calls_used, 1);
}

async fn run_call_budget_is_enforced(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, new_run("calls", 2, &[], 1 << 20, RUN_TIMEOUT)).await;
    for id in ["c1", "c2"] {
        reserved(&store, &run, id, "search").await;
    }
    for (id, tool) in [("c3", "search"), ("c4", "other")] {
        let r = projecting(&run, id, tool);
        assert_eq!(
            code(store.reserve(&r, run.created_ms + 1).await),
            Code::BudgetExhausted
        );
        assert!(record_of(&store, &r).await.is_none());
    }
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 2);
    assert_eq!(view.calls_per_tool, BTreeMap::from([("search".into(), 2)]));
}

async fn per_tool_budget_is_enforced(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(
        &store,
        new_run(
            "pertool",
            10,
            &[("search", 1), ("none", 0)],
            1 << 20,
            RUN_TIMEOUT,
        ),
    )
    .await;
    reserved(&store, &run, "s1", "search").await;
    let s2 = projecting(&run, "s2", "search");
    assert_eq!(
        code(store.reserve(&s2, run.created_ms + 1).await),
        Code::BudgetExhausted
    );
    let n1 = projecting(&run, "n1", "none");
    assert_eq!(
        code(store.reserve(&n1, run.created_ms + 1).await),
        Code::BudgetExhausted,
        "a cap of 0 allows no call"
    );
    for id in ["f1", "f2"] {
        reserved(&store, &run, id, "fetch").await;
    }
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 3);
    assert_eq!(
        view.calls_per_tool,
        BTreeMap::from([("fetch".into(), 2), ("search".into(), 1)])
    );
    assert!(record_of(&store, &s2).await.is_none());
}

async fn used_up_record_bytes_exhaust_the_budget(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run_template = new_run("bytes", 10, &[], 0, RUN_TIMEOUT);
    // Sizes depend on the run id: measure with the real one.
    let sized = RunView::new(run_template.clone());
    let size = size_of(&ready(&projecting(&sized, "a", "search")), 1 << 20);
    let run = create(
        &store,
        NewRun {
            budget: Budget {
                max_record_bytes: size,
                ..run_template.budget.clone()
            },
            ..run_template
        },
    )
    .await;
    let a = reserved(&store, &run, "a", "search").await;
    let done = ready(&a);
    assert_eq!(size_of(&done, 1 << 20), size);
    assert_eq!(
        store.finalize(&done, 1 << 20).await.expect("finalize"),
        Finalized::Written,
        "a record that exactly fills the budget fits"
    );
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.record_bytes_used, size);
    let b = projecting(&run, "b", "search");
    assert_eq!(
        code(store.reserve(&b, run.created_ms + 2).await),
        Code::BudgetExhausted
    );
    assert_eq!(run_of(&store, &run.run_id).await.calls_used, 1);
    assert!(record_of(&store, &b).await.is_none());
}

async fn reserve_refuses_a_malformed_record(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("malformed")).await;
    let good = projecting(&run, "call_1", "search");
    let bad = [
        ready(&good),
        Record {
            evidence_status: Some(Evidence::Found),
            ..good.clone()
        },
        Record {
            error_code: Some(Code::ToolTimeout.into()),
            ..good.clone()
        },
    ];
    for r in &bad {
        assert_eq!(
            code(store.reserve(r, run.created_ms + 1).await),
            Code::Internal,
            "{r:?}"
        );
    }
    // A record with an unsafe id cannot be built at all: the id type refuses it.
    assert!(ToolCallId::parse("bad id").is_none());
    assert!(ToolCallId::parse("").is_none());
    assert!(record_of(&store, &good).await.is_none());
    assert_eq!(run_of(&store, &run.run_id).await.calls_used, 0);
}

// ---------------------------------------------------------------------------------------------
// Finalize: the final record, once, within the byte limits.

async fn finalize_ready_and_error(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("final")).await;
    let a = reserved(&store, &run, "call_a", "search").await;
    let b = reserved(&store, &run, "call_b", "fetch").await;

    // b finishes first: progress is completion order.
    let b_done = error(&b, Code::ToolTimeout);
    assert_eq!(
        store.finalize(&b_done, 1 << 20).await.expect("finalize b"),
        Finalized::Written
    );
    let a_done = ready(&a);
    assert_eq!(
        store.finalize(&a_done, 1 << 20).await.expect("finalize a"),
        Finalized::Written
    );
    let (stored_a, _) = record_of(&store, &a).await.expect("a exists");
    assert_eq!(
        stored_a,
        finalized(&a_done),
        "the record reads back exactly, numbers included"
    );
    assert_eq!(
        stored_a.to_json().expect("json"),
        finalized(&a_done).to_json().expect("json")
    );
    let (stored_b, _) = record_of(&store, &b).await.expect("b exists");
    assert_eq!(stored_b, finalized(&b_done));
    assert_eq!(
        progress_ids(&store, &run.run_id).await,
        ["call_b", "call_a"]
    );
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(
        view.record_bytes_used,
        size_of(&a_done, 1 << 20) + size_of(&b_done, 1 << 20)
    );
    assert_eq!(view.calls_used, 2, "finalize does not spend calls");
}

async fn finalizing_twice_is_internal(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("twice")).await;
    let a = reserved(&store, &run, "call_a", "search").await;
    let done = ready(&a);
    assert_eq!(
        store.finalize(&done, 1 << 20).await.expect("first"),
        Finalized::Written
    );
    let later = Record {
        updated_at: clock::rfc3339(clock::now_ms() + 1000),
        ..no_evidence(&a)
    };
    for second in [done.clone(), later, error(&a, Code::ToolTimeout)] {
        assert_eq!(
            code(store.finalize(&second, 1 << 20).await),
            Code::Internal,
            "{second:?}"
        );
    }
    assert_eq!(
        record_of(&store, &a).await.expect("exists").0,
        finalized(&done)
    );
    assert_eq!(progress_ids(&store, &run.run_id).await, ["call_a"]);
    assert_eq!(
        run_of(&store, &run.run_id).await.record_bytes_used,
        size_of(&done, 1 << 20)
    );
}

async fn finalize_refuses_invalid_shapes(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("shapes")).await;
    let a = reserved(&store, &run, "call_a", "search").await;
    let bad = [
        Record {
            updated_at: "2030-01-01T00:00:00.000Z".into(),
            ..a.clone()
        },
        Record {
            evidence_status: None,
            ..ready(&a)
        },
        Record {
            evidence_status: Some(Evidence::Error),
            ..ready(&a)
        },
        Record {
            agent_result: Value::Null,
            ..ready(&a)
        },
        Record {
            error_code: Some(Code::ToolTimeout.into()),
            ..ready(&a)
        },
        Record {
            agent_result: json!({"item": 1}),
            ..error(&a, Code::ToolTimeout)
        },
        Record {
            evidence_status: Some(Evidence::Found),
            ..error(&a, Code::ToolTimeout)
        },
        Record {
            error_code: None,
            ..error(&a, Code::ToolTimeout)
        },
    ];
    for r in &bad {
        assert_eq!(
            code(store.finalize(r, 1 << 20).await),
            Code::Internal,
            "{r:?}"
        );
    }
    assert_eq!(record_of(&store, &a).await.expect("exists").0, a);
    assert_eq!(
        progress_ids(&store, &run.run_id).await,
        Vec::<String>::new()
    );
    assert_eq!(run_of(&store, &run.run_id).await.record_bytes_used, 0);
    assert_eq!(
        store.finalize(&ready(&a), 1 << 20).await.expect("valid"),
        Finalized::Written,
        "refused shapes left the record PROJECTING"
    );
    // An unknown error code cannot be put into a record: the code type refuses it.
    assert!(CodeName::parse("NOT_A_CODE").is_none());
}

async fn record_over_record_bytes_is_stored_stripped(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("toolarge")).await;
    let a = reserved(&store, &run, "call_a", "search").await;
    let big = Record {
        raw_response: json!({"blob": "é".repeat(2000)}),
        ..ready(&a)
    };
    let limit = 1000;
    assert!(size_of(&big, u64::MAX) > limit);
    assert_eq!(
        store.finalize(&big, limit).await.expect("finalize"),
        Finalized::TooLarge(SizeStage::Record)
    );
    let (stored, _) = record_of(&store, &a).await.expect("exists");
    assert_eq!(stored.status, Status::Error);
    assert_eq!(stored.evidence_status, Some(Evidence::Error));
    assert_eq!(
        stored.error_code.map(CodeName::as_str),
        Some("RESULT_TOO_LARGE")
    );
    assert!(stored.raw_response.is_null() && stored.agent_result.is_null());
    assert_eq!(stored.request, a.request, "the request is kept");
    assert_eq!(stored.updated_at, big.updated_at);
    let stripped = stored.to_json().expect("json").len() as u64;
    assert!(stripped <= limit);
    assert_eq!(
        run_of(&store, &run.run_id).await.record_bytes_used,
        stripped
    );
    assert_eq!(progress_ids(&store, &run.run_id).await, ["call_a"]);
    let f = facts(
        &run.run_id,
        store.progress(&run.run_id).await.expect("p").expect("run"),
        &sealer(),
    );
    assert!(f.facts.is_empty());
    assert_eq!(f.excluded, 1);
}

async fn run_over_max_record_bytes_is_stored_stripped(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let template = new_run("runbytes", 10, &[], 0, RUN_TIMEOUT);
    let sized = RunView::new(template.clone());
    let a_size = size_of(&ready(&projecting(&sized, "a", "search")), 1 << 20);
    let run = create(
        &store,
        NewRun {
            budget: Budget {
                max_record_bytes: a_size + 10,
                ..template.budget.clone()
            },
            ..template
        },
    )
    .await;
    let a = reserved(&store, &run, "a", "search").await;
    let b = reserved(&store, &run, "b", "search").await;
    let a_done = ready(&a);
    assert_eq!(size_of(&a_done, 1 << 20), a_size);
    assert_eq!(
        store.finalize(&a_done, 1 << 20).await.expect("a"),
        Finalized::Written
    );
    let b_done = ready(&b);
    assert_eq!(
        store.finalize(&b_done, 1 << 20).await.expect("b"),
        Finalized::TooLarge(SizeStage::Run)
    );
    let (stored, _) = record_of(&store, &b).await.expect("b exists");
    assert_eq!(stored.status, Status::Error);
    assert_eq!(
        stored.error_code.map(CodeName::as_str),
        Some("RESULT_TOO_LARGE")
    );
    assert!(stored.raw_response.is_null() && stored.agent_result.is_null());
    let fallback = FinalBody::new(&b_done, 1 << 20, &sealer())
        .expect("body")
        .run_fallback(&b_done, &sealer());
    assert_eq!(
        stored,
        Record::from_json(&fallback).expect("fallback"),
        "the stored fallback is the record stripped"
    );
    assert_eq!(
        run_of(&store, &run.run_id).await.record_bytes_used,
        a_size,
        "the refused record's bytes are not added"
    );
    assert_eq!(progress_ids(&store, &run.run_id).await, ["a", "b"]);
    let f = facts(
        &run.run_id,
        store.progress(&run.run_id).await.expect("p").expect("run"),
        &sealer(),
    );
    let ids: Vec<_> = f.facts.iter().map(|f| f.tool_call_id.as_str()).collect();
    assert_eq!(ids, ["a"]);
    assert_eq!(f.excluded, 1);
}

// ---------------------------------------------------------------------------------------------
// Progress and facts.

async fn progress_order_and_facts(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("facts")).await;
    let ids = ["f1", "e1", "p1", "n1", "f2"];
    let records: Vec<Record> = ids
        .iter()
        .map(|id| projecting(&run, id, "search"))
        .collect();
    for r in &records {
        store.reserve(r, run.created_ms + 1).await.expect("reserve");
    }
    let f1 = ready(&records[0]);
    let e1 = error(&records[1], Code::ToolExecutionFailed);
    let n1 = no_evidence(&records[3]);
    let f2 = ready(&records[4]);
    for r in [&f2, &e1, &f1, &n1] {
        store.finalize(r, 1 << 20).await.expect("finalize");
    }
    let entries = store
        .progress(&run.run_id)
        .await
        .expect("progress")
        .expect("run");
    let got: Vec<(String, Option<Record>)> = entries
        .iter()
        .map(|(id, r)| (id.to_string(), r.clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            ("f2".to_string(), Some(finalized(&f2))),
            ("e1".to_string(), Some(finalized(&e1))),
            ("f1".to_string(), Some(finalized(&f1))),
            ("n1".to_string(), Some(finalized(&n1))),
        ],
        "completion order; PROJECTING p1 is not listed"
    );
    let f = facts(&run.run_id, entries, &sealer());
    let got: Vec<(&str, Evidence)> = f
        .facts
        .iter()
        .map(|f| (f.tool_call_id.as_str(), f.evidence_status))
        .collect();
    assert_eq!(
        got,
        [
            ("f2", Evidence::Found),
            ("f1", Evidence::Found),
            ("n1", Evidence::None)
        ]
    );
    assert_eq!(f.facts[0].result, f2.agent_result);
    assert_eq!(f.facts[2].result, n1.agent_result);
    assert_eq!(f.excluded, 1, "the ERROR record");

    // A run's facts never include another run's records.
    let other = create(&store, roomy("other")).await;
    assert_eq!(
        store.progress(&other.run_id).await.expect("p"),
        Some(vec![])
    );
}

async fn facts_exclude_expired_records(h: &impl Harness) {
    let store = h.store(1_500).await;
    let run = create(&store, roomy("expired")).await;
    let a = reserved(&store, &run, "a", "search").await;
    store.finalize(&ready(&a), 1 << 20).await.expect("a");
    h.advance(Duration::from_millis(1_000)).await;
    let b = projecting(&run, "b", "search");
    store.reserve(&b, run.created_ms + 2).await.expect("b");
    store.finalize(&ready(&b), 1 << 20).await.expect("b");
    h.advance(Duration::from_millis(700)).await;
    let entries = store
        .progress(&run.run_id)
        .await
        .expect("progress")
        .expect("run");
    assert_eq!(entries.len(), 2);
    assert_eq!(entries[0], (call_id("a"), None), "a expired");
    assert_eq!(entries[1].0, "b");
    assert!(entries[1].1.is_some(), "b is alive");
    let f = facts(&run.run_id, entries, &sealer());
    assert_eq!(f.facts.len(), 1);
    assert_eq!(f.facts[0].tool_call_id, "b");
    assert_eq!(f.excluded, 1);
}

// ---------------------------------------------------------------------------------------------
// Expiry: a record lives record_ttl_ms from its reservation, no read or finalize renews it, and
// the run and its progress outlive it.

async fn ttl_is_set_at_creation_and_not_renewed_by_reads(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("ttl")).await;
    let a = reserved(&store, &run, "a", "search").await;
    // Final, so the progress read resolves it too.
    store.finalize(&ready(&a), 1 << 20).await.expect("finalize");
    let (_, ttl1) = record_of(&store, &a).await.expect("exists");
    assert!(
        ttl1 <= LONG_TTL && ttl1 > LONG_TTL - 10_000,
        "ttl {ttl1} of {LONG_TTL}"
    );
    h.advance(Duration::from_millis(300)).await;
    // Every read path, then the TTL again.
    run_of(&store, &run.run_id).await;
    store.progress(&run.run_id).await.expect("progress");
    store.ping().await.expect("ping");
    record_of(&store, &a).await.expect("exists");
    let (_, ttl2) = record_of(&store, &a).await.expect("exists");
    assert!(
        ttl2 + 300 <= ttl1,
        "reads renewed the TTL: {ttl1} then {ttl2}"
    );
    h.advance(Duration::from_millis(300)).await;
    let (_, ttl3) = record_of(&store, &a).await.expect("exists");
    assert!(ttl3 + 300 <= ttl2, "{ttl2} then {ttl3}");
}

async fn finalize_keeps_the_remaining_ttl(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("keepttl")).await;
    let a = reserved(&store, &run, "a", "search").await;
    h.advance(Duration::from_millis(400)).await;
    let (_, before) = record_of(&store, &a).await.expect("exists");
    assert!(before <= LONG_TTL - 400, "{before}");
    store.finalize(&ready(&a), 1 << 20).await.expect("finalize");
    let (stored, after) = record_of(&store, &a).await.expect("exists");
    assert_eq!(stored.status, Status::Ready);
    assert!(
        after <= before,
        "finalize renewed the TTL: {before} then {after}"
    );
    assert!(after > 0, "finalize must not drop the TTL");
}

async fn record_is_gone_after_its_ttl(h: &impl Harness) {
    let store = h.store(1_000).await;
    let run = create(&store, roomy("gone")).await;
    let a = reserved(&store, &run, "a", "search").await;
    let b = reserved(&store, &run, "b", "search").await;
    store.finalize(&ready(&a), 1 << 20).await.expect("a");
    let (_, ttl) = record_of(&store, &a).await.expect("a exists");
    assert!(ttl <= 1_000);
    h.advance(Duration::from_millis(1_100)).await;
    assert!(record_of(&store, &a).await.is_none(), "READY a expired");
    assert!(
        record_of(&store, &b).await.is_none(),
        "PROJECTING b expired"
    );
    // An expired id is free again: its budget was spent, the call itself is new.
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 2);
    assert_eq!(
        view.record_bytes_used,
        size_of(&ready(&a), 1 << 20),
        "expiry gives no bytes back"
    );
}

async fn finalize_after_expiry_is_record_expired(h: &impl Harness) {
    let store = h.store(1_000).await;
    let run = create(&store, roomy("midcall")).await;
    let a = reserved(&store, &run, "a", "search").await;
    h.advance(Duration::from_millis(1_100)).await;
    for done in [ready(&a), error(&a, Code::ToolTimeout)] {
        assert_eq!(
            code(store.finalize(&done, 1 << 20).await),
            Code::RecordExpired
        );
    }
    assert!(
        record_of(&store, &a).await.is_none(),
        "the record is not recreated"
    );
    assert_eq!(
        progress_ids(&store, &run.run_id).await,
        Vec::<String>::new()
    );
    assert_eq!(run_of(&store, &run.run_id).await.record_bytes_used, 0);

    // A record that never existed is not created either.
    let ghost = projecting(&run, "ghost", "search");
    assert_eq!(
        code(store.finalize(&ready(&ghost), 1 << 20).await),
        Code::RecordExpired
    );
    assert!(record_of(&store, &ghost).await.is_none());
    assert_eq!(
        progress_ids(&store, &run.run_id).await,
        Vec::<String>::new()
    );
}

async fn run_and_progress_outlive_records(h: &impl Harness) {
    let store = h.store(1_000).await;
    // Run keys live timeout + record TTL = 3 s from creation.
    let run = create(&store, new_run("outlive", 10, &[], 1 << 20, 2_000)).await;
    let a = reserved(&store, &run, "a", "search").await;
    store.finalize(&ready(&a), 1 << 20).await.expect("finalize");
    h.advance(Duration::from_millis(1_100)).await;
    assert!(record_of(&store, &a).await.is_none());
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 1);
    let entries = store
        .progress(&run.run_id)
        .await
        .expect("progress")
        .expect("the run and its progress outlive the record");
    assert_eq!(entries, vec![(call_id("a"), None)]);
    assert_eq!(facts(&run.run_id, entries, &sealer()).excluded, 1);
    h.advance(Duration::from_millis(2_100)).await;
    assert_eq!(store.get_run(&run.run_id).await.expect("get_run"), None);
    assert_eq!(store.progress(&run.run_id).await.expect("progress"), None);
}

// ---------------------------------------------------------------------------------------------
// Concurrency.

async fn concurrent_reserves_of_one_id_have_one_winner(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, roomy("race1")).await;
    let mut tasks = JoinSet::new();
    for i in 0..16 {
        let store = store.clone();
        let r = Record {
            request: json!({"attempt": i}),
            ..projecting(&run, "call_same", "search")
        };
        let now = run.created_ms + 1;
        tasks.spawn(async move { (r.clone(), store.reserve(&r, now).await) });
    }
    let mut winners = Vec::new();
    let mut duplicates = 0;
    while let Some(joined) = tasks.join_next().await {
        let (r, result) = joined.expect("task");
        match result {
            Ok(()) => winners.push(r),
            Err(e) => {
                assert_eq!(e.code, Code::DuplicateToolCall);
                duplicates += 1;
            }
        }
    }
    assert_eq!(winners.len(), 1, "exactly one reservation wins");
    assert_eq!(duplicates, 15);
    assert_eq!(
        record_of(&store, &winners[0]).await.expect("exists").0,
        winners[0],
        "the winner's record is the one stored"
    );
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 1);
}

async fn concurrent_reserves_never_overspend(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    let run = create(&store, new_run("race5", 5, &[], 1 << 20, RUN_TIMEOUT)).await;
    let mut tasks = JoinSet::new();
    for i in 0..20 {
        let store = store.clone();
        let r = projecting(&run, &format!("call_{i}"), "search");
        let now = run.created_ms + 1;
        tasks.spawn(async move { (r.clone(), store.reserve(&r, now).await) });
    }
    let mut winners = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (r, result) = joined.expect("task");
        match result {
            Ok(()) => winners.push(r),
            Err(e) => assert_eq!(e.code, Code::BudgetExhausted),
        }
    }
    assert_eq!(winners.len(), 5);
    let view = run_of(&store, &run.run_id).await;
    assert_eq!(view.calls_used, 5);
    assert_eq!(view.calls_per_tool, BTreeMap::from([("search".into(), 5)]));
    let mut stored = 0;
    for i in 0..20 {
        if store
            .get_record(&run.run_id, &call_id(&format!("call_{i}")))
            .await
            .expect("get_record")
            .is_some()
        {
            stored += 1;
        }
    }
    assert_eq!(stored, 5, "only the winners have records");
}

// ---------------------------------------------------------------------------------------------
// Health.

async fn ping_answers(h: &impl Harness) {
    let store = h.store(LONG_TTL).await;
    store.ping().await.expect("ping");
}
