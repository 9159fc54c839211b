//! A differential target for the memory store: the fuzz bytes become a sequence of store
//! operations (runs with small budgets and timeouts, reservations, finalizations of every
//! kind, closes, reads, and time moving on), run against `MemoryStore::bounded` on a paused
//! tokio clock and against a small model of the store's rules, written here from the contract:
//!
//! - a record's lifecycle is PROJECTING → READY | ERROR, once; one live record per id;
//! - reservations are checked in contract order (run state, deadline, duplicate, budgets), and
//!   neither the call budget nor a tool's budget is ever overspent;
//! - a record's TTL is set at its reservation and never moved: it is there until exactly then;
//! - a run's record bytes count what finalize wrote, and a final record over the tool's limit
//!   or the run's budget is replaced by the stripped `RESULT_TOO_LARGE` record;
//! - progress lists finalized ids in order, resolved through the records that still live;
//! - once everything has expired and expiry has run, the store holds no bytes.
//!
//! Any disagreement panics.
#![no_main]

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolgate::clock;
use toolgate::config::RunPaths;
use toolgate::error::{Code, Error, SizeStage};
use toolgate::evidence::Sealer;
use toolgate::ids::{RunId, ToolCallId, ToolName};
use toolgate::store::memory::MemoryStore;
use toolgate::store::{
    Budget, Close, Evidence, FinalBody, Finalized, NewRun, Record, RunState, RunView, Status, Store,
};

const RUNS: &[&str] = &["r1", "r2", "r3"];
const IDS: &[&str] = &["a", "b", "c", "d", "toolu_01:x"];
const TOOLS: &[&str] = &["t1", "t2", "t3"];
const MAX_OPS: usize = 64;

#[derive(Debug)]
enum Op {
    CreateRun {
        run: usize,
        timeout_ms: u64,
        max_calls: u64,
        /// A cap for `t1`, and one for `t2`.
        caps: [Option<u64>; 2],
        max_record_bytes: u64,
    },
    Reserve {
        run: usize,
        id: usize,
        tool: usize,
        pad: usize,
    },
    Finalize {
        run: usize,
        id: usize,
        how: Final,
        raw: usize,
        record_bytes: u64,
    },
    Close {
        run: usize,
        cancel: bool,
    },
    GetRecord {
        run: usize,
        id: usize,
    },
    GetRun {
        run: usize,
    },
    Progress {
        run: usize,
    },
    Advance {
        ms: u64,
    },
    /// Moves time to one of the instants where something changes (a run's deadline, a run's or
    /// a record's expiry, in the model), one millisecond before it, or one after.
    AdvanceTo {
        pick: usize,
        delta: i8,
    },
}

#[derive(Debug, Clone, Copy)]
enum Final {
    Ready,
    /// READY with no evidence: `NO_EVIDENCE`.
    ReadyNone,
    Error,
    /// A shape `check_final` refuses: still PROJECTING.
    StillProjecting,
    /// A shape `check_final` refuses: READY without a result.
    ReadyWithoutResult,
}

fn op(u: &mut Unstructured<'_>) -> Result<Op> {
    let run = u.choose_index(RUNS.len())?;
    let id = u.choose_index(IDS.len())?;
    Ok(match u.int_in_range(0..=10)? {
        0 => Op::CreateRun {
            run,
            timeout_ms: u.int_in_range(1..=3_000)?,
            max_calls: u.int_in_range(0..=6)?,
            caps: [
                u.arbitrary::<bool>()?.then_some(u.int_in_range(0..=3)?),
                u.arbitrary::<bool>()?.then_some(u.int_in_range(0..=3)?),
            ],
            max_record_bytes: u.int_in_range(1..=4_000)?,
        },
        1 | 2 => Op::Reserve {
            run,
            id,
            tool: u.choose_index(TOOLS.len())?,
            pad: u.int_in_range(0..=600)?,
        },
        3 | 4 => Op::Finalize {
            run,
            id,
            how: *u.choose(&[
                Final::Ready,
                Final::Ready,
                Final::ReadyNone,
                Final::Error,
                Final::Error,
                Final::StillProjecting,
                Final::ReadyWithoutResult,
            ])?,
            raw: if u.ratio(2, 3)? {
                u.int_in_range(0..=100)?
            } else {
                u.int_in_range(0..=2_000)?
            },
            record_bytes: u.int_in_range(300..=3_000)?,
        },
        5 => Op::Close {
            run,
            cancel: u.arbitrary()?,
        },
        6 => Op::GetRecord { run, id },
        7 => Op::GetRun { run },
        8 => Op::Progress { run },
        9 => Op::Advance {
            ms: if u.arbitrary()? {
                *u.choose(&[0, 1, 2, 10, 100, 499, 500, 501, 1_000, 1_999, 2_000, 3_000])?
            } else {
                u.int_in_range(0..=3_000)?
            },
        },
        _ => Op::AdvanceTo {
            pick: u.int_in_range(0..=15)?,
            delta: u.int_in_range(-1..=1)?,
        },
    })
}

/// The model of one run.
#[derive(Debug, Clone)]
struct MRun {
    view: RunView,
    progress: Vec<ToolCallId>,
    expires_at: u64,
}

/// The model of one record: exactly what the store should hold, and until when.
#[derive(Debug, Clone)]
struct MRecord {
    record: Record,
    expires_at: u64,
}

struct Model {
    ttl: u64,
    bounded: bool,
    now: u64,
    runs: HashMap<RunId, MRun>,
    records: HashMap<(RunId, ToolCallId), MRecord>,
}

impl Model {
    /// Drops what has expired: a key lives while `now < expires_at`.
    fn expire(&mut self) {
        let now = self.now;
        self.runs.retain(|_, r| now < r.expires_at);
        self.records.retain(|_, r| now < r.expires_at);
    }
}

fn code<T: std::fmt::Debug>(r: &std::result::Result<T, Error>) -> Option<Code> {
    r.as_ref().err().map(|e| e.code)
}

/// The stripped `ERROR/RESULT_TOO_LARGE` record that replaces a final record over a limit.
fn stripped(r: &Record) -> Record {
    Record {
        status: Status::Error,
        evidence_status: Some(Evidence::Error),
        raw_response: Value::Null,
        agent_result: Value::Null,
        error_code: Some(Code::ResultTooLarge(SizeStage::Record).into()),
        ..r.clone()
    }
}

/// The fuzzed store's seal key.
fn sealer() -> Arc<Sealer> {
    Arc::new(Sealer::derive(b"the memory store fuzz target's key"))
}

/// `r` as the store writes it: with its digests and seal, read back.
fn sealed(r: &Record) -> Record {
    let body = FinalBody::new(r, u64::MAX, &sealer()).expect("a final record");
    Record::from_json(&body.text).expect("readable")
}

fn final_record(base: &Record, how: Final, raw: usize, now: u64) -> Record {
    let mut r = base.clone();
    r.updated_at = clock::rfc3339(now);
    r.duration_ms = Some(raw as u64 % 97);
    r.raw_response = json!({"blob": "x".repeat(raw)});
    r.upstream_status = Some(200);
    match how {
        Final::Ready => {
            r.status = Status::Ready;
            r.evidence_status = Some(Evidence::Found);
            r.agent_result = json!({"item": {"n": raw}});
        }
        Final::ReadyNone => {
            r.status = Status::Ready;
            r.evidence_status = Some(Evidence::None);
            r.agent_result = json!({"scope": {"tool": r.tool, "input": r.request}});
        }
        Final::Error => {
            r.status = Status::Error;
            r.evidence_status = Some(Evidence::Error);
            r.error_code = Some(Code::ToolExecutionFailed.into());
            r.upstream_status = Some(500);
        }
        Final::StillProjecting => {}
        Final::ReadyWithoutResult => {
            r.status = Status::Ready;
            r.evidence_status = Some(Evidence::Found);
        }
    }
    r
}

fn ids(run: usize, id: usize) -> (RunId, ToolCallId) {
    (
        RunId::parse(RUNS[run]).expect("safe"),
        ToolCallId::parse(IDS[id]).expect("safe"),
    )
}

async fn drive(store: &MemoryStore, m: &mut Model, ops: &[Op]) {
    for (step, op) in ops.iter().enumerate() {
        m.expire();
        assert_eq!(
            clock::now_ms(),
            m.now,
            "step {step}: the clock moved by itself"
        );
        let now = m.now;
        match op {
            Op::Advance { ms } => {
                tokio::time::advance(Duration::from_millis(*ms)).await;
                m.now += ms;
                assert_eq!(clock::now_ms(), m.now, "step {step}: advanced by {ms} ms");
            }
            Op::AdvanceTo { pick, delta } => {
                let mut instants: Vec<u64> = m
                    .runs
                    .values()
                    .flat_map(|r| [r.view.deadline_ms, r.expires_at])
                    .chain(m.records.values().map(|r| r.expires_at))
                    .collect();
                instants.sort_unstable();
                instants.dedup();
                let Some(at) = instants.get(pick % instants.len().max(1)) else {
                    continue;
                };
                let target = at.saturating_add_signed(i64::from(*delta));
                if target > now {
                    let ms = target - now;
                    tokio::time::advance(Duration::from_millis(ms)).await;
                    m.now = target;
                    assert_eq!(clock::now_ms(), m.now, "step {step}: advanced by {ms} ms");
                }
            }
            Op::CreateRun {
                run,
                timeout_ms,
                max_calls,
                caps,
                max_record_bytes,
            } => {
                let run_id = RunId::parse(RUNS[*run]).expect("safe");
                let mut max_calls_per_tool = BTreeMap::new();
                for (tool, cap) in TOOLS.iter().zip(caps) {
                    if let Some(cap) = cap {
                        max_calls_per_tool.insert(tool.to_string(), *cap);
                    }
                }
                let new = NewRun {
                    run_id: run_id.clone(),
                    created_ms: now,
                    deadline_ms: now + timeout_ms,
                    budget: Budget {
                        max_calls: *max_calls,
                        max_calls_per_tool,
                        max_record_bytes: *max_record_bytes,
                    },
                    tools: None,
                    paths: RunPaths::default(),
                };
                let got = store.create_run(new.clone()).await;
                if m.runs.contains_key(&run_id) {
                    assert_eq!(code(&got), Some(Code::RunExists), "step {step}: {op:?}");
                    continue;
                }
                if m.bounded && code(&got) == Some(Code::StoreUnavailable) {
                    continue;
                }
                let view = got.unwrap_or_else(|e| panic!("step {step}: {op:?}: {e:?}"));
                assert_eq!(view, RunView::new(new), "step {step}: the new run");
                m.runs.insert(
                    run_id,
                    MRun {
                        expires_at: now + timeout_ms + m.ttl,
                        view,
                        progress: Vec::new(),
                    },
                );
            }
            Op::Reserve { run, id, tool, pad } => {
                let (run_id, id) = ids(*run, *id);
                let tool = ToolName::parse(TOOLS[*tool]).expect("safe");
                let record = Record::projecting(
                    run_id.clone(),
                    id.clone(),
                    tool.clone(),
                    json!({"q": "x".repeat(*pad)}),
                    now,
                );
                let got = store.reserve(&record, now).await;
                if m.bounded && code(&got) == Some(Code::StoreUnavailable) {
                    continue;
                }
                let key = (run_id.clone(), id.clone());
                let duplicate = m.records.contains_key(&key);
                let want = match m.runs.get(&run_id) {
                    None => Some(Code::RunInactive),
                    Some(r) if r.view.state != RunState::Active => Some(Code::RunInactive),
                    Some(r) if now >= r.view.deadline_ms => Some(Code::RunDeadlineExceeded),
                    Some(_) if duplicate => Some(Code::DuplicateToolCall),
                    Some(r) => {
                        let v = &r.view;
                        let used = v.calls_per_tool.get(tool.as_str()).copied().unwrap_or(0);
                        let cap = v.budget.max_calls_per_tool.get(tool.as_str()).copied();
                        (v.calls_used >= v.budget.max_calls
                            || cap.is_some_and(|c| used >= c)
                            || v.record_bytes_used >= v.budget.max_record_bytes)
                            .then_some(Code::BudgetExhausted)
                    }
                };
                assert_eq!(code(&got), want, "step {step}: {op:?} at {now}");
                if want.is_none() {
                    let r = m.runs.get_mut(&run_id).expect("live");
                    r.view.calls_used += 1;
                    *r.view.calls_per_tool.entry(tool.to_string()).or_insert(0) += 1;
                    m.records.insert(
                        key,
                        MRecord {
                            record,
                            expires_at: now + m.ttl,
                        },
                    );
                }
            }
            Op::Finalize {
                run,
                id,
                how,
                raw,
                record_bytes,
            } => {
                let (run_id, id) = ids(*run, *id);
                let key = (run_id.clone(), id.clone());
                let current = m.records.get(&key).cloned();
                let base = current.as_ref().map_or_else(
                    || {
                        Record::projecting(
                            run_id.clone(),
                            id.clone(),
                            ToolName::parse("t1").expect("safe"),
                            json!({}),
                            now,
                        )
                    },
                    |c| c.record.clone(),
                );
                // A final record is built from the PROJECTING one; a second finalize
                // sends one built from the first final record, as a replayed write would.
                let base = if base.status == Status::Projecting {
                    base
                } else {
                    let mut b = base.clone();
                    b.status = Status::Projecting;
                    b.evidence_status = None;
                    b.agent_result = Value::Null;
                    b.error_code = None;
                    b
                };
                let record = final_record(&base, *how, *raw, now);
                let got = store.finalize(&record, *record_bytes).await;
                let valid = !matches!(how, Final::StillProjecting | Final::ReadyWithoutResult);
                let Some(current) = current.filter(|_| valid) else {
                    let want = if valid {
                        Code::RecordExpired
                    } else {
                        Code::Internal
                    };
                    assert_eq!(code(&got), Some(want), "step {step}: {op:?}");
                    continue;
                };
                if current.record.status != Status::Projecting {
                    assert_eq!(
                        code(&got),
                        Some(Code::Internal),
                        "step {step}: {op:?}: twice"
                    );
                    continue;
                }
                let Some(r) = m.runs.get_mut(&run_id) else {
                    assert_eq!(code(&got), Some(Code::RecordExpired), "step {step}: {op:?}");
                    continue;
                };
                let full = sealed(&record).to_json().expect("serializable");
                let small = sealed(&stripped(&record));
                let (body, replaced) = if full.len() as u64 > *record_bytes {
                    (small.clone(), Some(SizeStage::Record))
                } else {
                    (sealed(&record), None)
                };
                let size = body.to_json().expect("serializable").len() as u64;
                let (written, want) =
                    if r.view.record_bytes_used + size > r.view.budget.max_record_bytes {
                        (small, Finalized::TooLarge(SizeStage::Run))
                    } else {
                        r.view.record_bytes_used += size;
                        (
                            body,
                            replaced.map_or(Finalized::Written, Finalized::TooLarge),
                        )
                    };
                let got = got.unwrap_or_else(|e| panic!("step {step}: {op:?}: {e:?}"));
                assert_eq!(got, want, "step {step}: {op:?}");
                r.progress.push(id.clone());
                m.records.insert(
                    key,
                    MRecord {
                        record: written,
                        expires_at: current.expires_at,
                    },
                );
            }
            Op::Close { run, cancel } => {
                let run_id = RunId::parse(RUNS[*run]).expect("safe");
                let how = if *cancel { Close::Cancel } else { Close::End };
                let got = store.close_run(&run_id, how).await;
                let got = got.unwrap_or_else(|e| panic!("step {step}: {op:?}: {e:?}"));
                let want = m.runs.get_mut(&run_id).map(|r| {
                    if r.view.state == RunState::Active {
                        r.view.state = how.state();
                    }
                    r.view.clone()
                });
                assert_eq!(got, want, "step {step}: {op:?}");
            }
            Op::GetRun { run } => {
                let run_id = RunId::parse(RUNS[*run]).expect("safe");
                let got = store.get_run(&run_id).await;
                let got = got.unwrap_or_else(|e| panic!("step {step}: {op:?}: {e:?}"));
                let want = m.runs.get(&run_id).map(|r| r.view.clone());
                assert_eq!(got, want, "step {step}: {op:?}");
                if let Some(v) = got {
                    assert!(v.calls_used <= v.budget.max_calls, "overspent: {v:?}");
                    for (tool, cap) in &v.budget.max_calls_per_tool {
                        let used = v.calls_per_tool.get(tool).copied().unwrap_or(0);
                        assert!(used <= *cap, "{tool} overspent: {v:?}");
                    }
                    assert!(v.record_bytes_used <= v.budget.max_record_bytes);
                }
            }
            Op::GetRecord { run, id } => {
                let (run_id, id) = ids(*run, *id);
                let got = store.get_record(&run_id, &id).await;
                let got = got.unwrap_or_else(|e| panic!("step {step}: {op:?}: {e:?}"));
                let want = m
                    .records
                    .get(&(run_id, id))
                    .map(|r| (r.record.clone(), r.expires_at - now));
                assert_eq!(got, want, "step {step}: {op:?} at {now}");
            }
            Op::Progress { run } => {
                let run_id = RunId::parse(RUNS[*run]).expect("safe");
                let got = store.progress(&run_id).await;
                let got = got.unwrap_or_else(|e| panic!("step {step}: {op:?}: {e:?}"));
                let want = m.runs.get(&run_id).map(|r| {
                    r.progress
                        .iter()
                        .map(|id| {
                            let key = (run_id.clone(), id.clone());
                            (id.clone(), m.records.get(&key).map(|r| r.record.clone()))
                        })
                        .collect::<Vec<_>>()
                });
                assert_eq!(got, want, "step {step}: {op:?}");
            }
        }
    }
    // Past every TTL: the store is empty and holds no bytes.
    let last = m.runs.values().map(|r| r.expires_at).max().unwrap_or(0);
    let last = m
        .records
        .values()
        .map(|r| r.expires_at)
        .fold(last, u64::max);
    let wait = last.saturating_sub(m.now);
    tokio::time::advance(Duration::from_millis(wait)).await;
    m.now += wait;
    for run in RUNS {
        let run_id = RunId::parse(run).expect("safe");
        assert_eq!(
            store.get_run(&run_id).await.ok(),
            Some(None),
            "{run} outlived its TTL"
        );
    }
    // What the expiry thread does in `serve`: this store has none.
    store.expire_due();
    assert_eq!(store.bytes(), 0, "bytes held once everything expired");
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let ttl = u.int_in_range(1..=2_500)?;
    let max_bytes = if u.ratio(1, 4)? {
        u.int_in_range(1_000..=20_000)?
    } else {
        u64::MAX
    };
    let mut ops = Vec::new();
    while !u.is_empty() && ops.len() < MAX_OPS {
        ops.push(op(&mut u)?);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_time()
        .start_paused(true)
        .build()
        .expect("a runtime");
    runtime.block_on(async {
        let store = MemoryStore::bounded(ttl, max_bytes, sealer());
        let mut model = Model {
            ttl,
            bounded: max_bytes != u64::MAX,
            now: clock::now_ms(),
            runs: HashMap::new(),
            records: HashMap::new(),
        };
        drive(&store, &mut model, &ops).await;
    });
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
