//! The Redis Cluster store: every store rule runs inside one Lua script per write (`lua/`), so
//! each write is one atomic step on the primary that owns the run's hash slot.
//!
//! Round trips per successful call, on a warm connection (scripts already cached):
//!
//! | operation    | round trips | commands |
//! |--------------|-------------|----------|
//! | `create_run` | 1 | `EVALSHA run_create` |
//! | `get_run`    | 1 | `HGETALL` |
//! | `close_run`  | 1 | `EVALSHA run_close` |
//! | `reserve`    | 1 | `EVALSHA reserve` |
//! | `finalize`   | 1 | `EVALSHA finalize`; with `durability: replica`, `EVALSHA finalize` + `WAIT 1` pipelined on one connection: still 1 round trip, whose latency includes a replica's ack |
//! | `get_record` | 1 | pipelined `GET` + `PTTL` |
//! | `progress`   | 1 | `EVALSHA progress` |
//! | `ping`       | 1 per primary, concurrently | `PING` |
//!
//! Reserve and finalize (with `durability: primary`) go straight to the primary that owns the
//! run's slot, on connections of toolgate's own to each primary ([`direct`], [`resp`]);
//! everything else, and those two whenever the direct path fails, goes through the cluster
//! client.
//!
//! So a tool call costs 2 round trips (reserve + finalize), with either durability. A script
//! missing from a node's cache (first use, a restarted or promoted node) costs `NOSCRIPT`,
//! `SCRIPT LOAD` and a retry, once.
//!
//! Failure handling: every operation is bounded by `store.timeout_ms`, including the client's
//! own retries on `MOVED`/`ASK`/`TRYAGAIN`/`CLUSTERDOWN` and reconnections; past it, or on any
//! connection or cluster error, the caller gets `STORE_UNAVAILABLE`. The cluster connection
//! rebuilds its slot map and reconnects by itself, so the store recovers without a restart.
//! `WAIT` gets half of the timeout; the script and the network the rest.
//!
//! A write whose reply was lost (a connection dropped after the script ran, or the timeout fired
//! while it was queued) may still have happened, and the client may retry it: a retried reserve
//! then answers `DUPLICATE_TOOL_CALL`, a retried finalize `INTERNAL`. Either way the call fails
//! closed; no budget is spent twice and no final record is overwritten.

mod direct;
mod resp;

use std::collections::{BTreeMap, HashMap};
use std::fmt;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::Duration;

use redis::cluster::{ClusterClient, ClusterConfig};
use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{MultipleNodeRoutingInfo, ResponsePolicy, RoutingInfo};
use redis::{FromRedisValue, Script, ServerErrorKind, Value};
use serde::{Deserialize, Serialize};
use tokio::sync::{Semaphore, SemaphorePermit};

use super::{
    Budget, Close, FinalBody, Finalized, Keys, NewRun, ProgressEntry, Record, RunState, RunView,
    Store, StoreFuture, check_projecting,
};
use crate::config::{Durability, RunPaths, StoreConfig};
use crate::error::{Code, Error, Result, SizeStage};
use crate::evidence::Sealer;
use crate::ids::{RunId, ToolCallId};
pub use direct::{CLIENT_NAME, slot};
use direct::{Outcome, Primaries};

/// Redis Cluster store.
pub struct RedisStore {
    conn: ClusterConnection,
    /// Straight connections to the primaries, for reserve and finalize ([`direct`]).
    primaries: Arc<Primaries>,
    /// Connections for finalize with `durability: replica`, `None` with `primary`.
    waiters: Option<WaitPool>,
    keys: Keys,
    record_ttl_ms: u64,
    timeout: Duration,
    scripts: Scripts,
    /// Seals every final record.
    sealer: Arc<Sealer>,
}

struct Scripts {
    reserve: Script,
    finalize: Script,
    run_create: Script,
    run_close: Script,
    progress: Script,
}

impl Scripts {
    fn new() -> Scripts {
        Scripts {
            reserve: Script::new(include_str!("lua/reserve.lua")),
            finalize: Script::new(include_str!("lua/finalize.lua")),
            run_create: Script::new(include_str!("lua/run_create.lua")),
            run_close: Script::new(include_str!("lua/run_close.lua")),
            progress: Script::new(include_str!("lua/progress.lua")),
        }
    }

    fn all(&self) -> [&Script; 5] {
        [
            &self.reserve,
            &self.finalize,
            &self.run_create,
            &self.run_close,
            &self.progress,
        ]
    }
}

/// The fixed part of a run, kept as one JSON field of the run hash. The fields the scripts
/// compare (state, deadline, budgets, counters) are hash fields of their own.
#[derive(Serialize, Deserialize)]
struct RunSpec {
    run_id: RunId,
    created_ms: u64,
    deadline_ms: u64,
    budget: Budget,
    tools: Option<Vec<String>>,
    /// Absent in runs stored before runs had paths: the defaults then.
    #[serde(default)]
    workspace: Option<String>,
    #[serde(default)]
    home: Option<String>,
}

/// Per-tool counters and caps live in the run hash as `used:<tool>` and `cap:<tool>`.
const USED: &str = "used:";

impl RedisStore {
    /// Opens the store. Only an unusable node list fails here: a cluster that does not answer
    /// yet is not an error, because the connection is made in the background and retried by
    /// every operation, which answers `STORE_UNAVAILABLE` (and `/readyz` 503) until the cluster
    /// is up. The sidecar thus starts before Redis and recovers without a restart.
    pub async fn connect(cfg: &StoreConfig, sealer: Arc<Sealer>) -> Result<RedisStore> {
        if cfg.nodes.iter().any(|n| n.starts_with("rediss://")) {
            // redis-rs builds its rustls config from the process-wide provider; ring is the only
            // one compiled in. An Err only means a provider is already installed.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let timeout = cfg.timeout;
        let client = ClusterClient::builder(cfg.nodes.iter().map(String::as_str))
            .connection_timeout(timeout)
            .response_timeout(timeout)
            .overall_response_timeout(Some(timeout))
            // Redirects and a failover need a few retries; the overall timeout bounds them.
            .retries(5)
            .min_retry_wait(10)
            .max_retry_wait(timeout.as_millis() as u64 / 4 + 1)
            .build()
            .map_err(|e| Error::store(format!("redis-cluster nodes: {e}")))?;
        let conn = client.get_pending_async_connection_with_config(
            ClusterConfig::new()
                .set_connection_timeout(timeout)
                .set_response_timeout(timeout),
        );
        let waiters = match cfg.durability {
            Durability::Primary => None,
            Durability::Replica => Some(WaitPool::new(client)),
        };
        let primaries = Primaries::new(&cfg.nodes[0], timeout, conn.clone());
        let store = RedisStore {
            conn,
            primaries,
            waiters,
            keys: Keys {
                prefix: cfg.key_prefix.clone(),
            },
            record_ttl_ms: cfg.record_ttl_ms,
            timeout,
            scripts: Scripts::new(),
            sealer,
        };
        if let Err(e) = store.warm_up().await {
            tracing::warn!(cause = %e, "redis-cluster store not reachable yet; operations will retry");
        }
        Ok(store)
    }

    /// Loads the scripts and opens a WAIT connection ahead of the first call. Best effort: a
    /// missing script is loaded on first use, a missing connection opened when needed.
    async fn warm_up(&self) -> Result<()> {
        self.load_scripts().await?;
        if let Some(waiters) = &self.waiters {
            bounded(self.timeout, "connect", async {
                waiters.lease().await?.release();
                Ok(())
            })
            .await?;
        }
        Ok(())
    }

    /// `SCRIPT LOAD` goes to every node, replicas included, so a promoted replica has them too.
    async fn load_scripts(&self) -> Result<()> {
        for script in self.scripts.all() {
            let mut conn = self.conn.clone();
            bounded(self.timeout, "script load", async {
                script
                    .prepare_invoke()
                    .load_async(&mut conn)
                    .await
                    .map_err(redis_err)
            })
            .await?;
        }
        Ok(())
    }

    /// Runs a script that writes one run's keys (`key` is one of them): on the direct
    /// connection to the primary that owns the run's slot when it is known, else, and once more
    /// after any failure there, through the cluster client. The direct path writes the command
    /// straight into its connection's buffer; only a detour builds the client's command.
    async fn write(&self, key: &str, eval: &Eval<'_>) -> Result<i64> {
        let direct = self.primaries.write(key, |out| eval.pack(out)).await;
        match direct {
            Outcome::Code(code) => Ok(code),
            // The cluster client's future is large and this path rare: boxed, it does not
            // grow every direct write's future.
            Outcome::Detour => {
                Box::pin(run_script(eval.script, &eval.cmd(), &mut self.conn.clone())).await
            }
        }
    }

    /// Whether reserve and finalize go straight to the primaries on this thread (its slot map
    /// is known); when not, the map is asked for.
    pub fn direct_ready(&self) -> bool {
        self.primaries.ready()
    }

    /// Runs one operation within the store timeout.
    fn op<T, F: Future<Output = Result<T>>>(&self, what: &'static str, fut: F) -> Bounded<F> {
        bounded(self.timeout, what, fut)
    }

    async fn finalize_inner(&self, record: &Record, body: &FinalBody) -> Result<Finalized> {
        let keys = [
            self.keys.record(&record.run_id, &record.tool_call_id),
            self.keys.run(&record.run_id),
            self.keys.progress(&record.run_id),
        ];
        // The script makes the run fallback itself, from the marks, only when it needs it; its
        // seal is made here only then (the script answers 5 and nothing is written yet).
        let marks = body.fallback_marks();
        let mut code = self.finalize_once(&keys, record, body, &marks, "").await?;
        if code == 5 {
            let tail = body.fallback_tail(record, &self.sealer);
            code = self
                .finalize_once(&keys, record, body, &marks, &tail)
                .await?;
        }
        match code {
            0 => Ok(body.written()),
            1 => Ok(Finalized::TooLarge(SizeStage::Run)),
            2 => Err(Error::with_cause(Code::RecordExpired, "record vanished")),
            3 => Err(Error::internal("record is no longer PROJECTING")),
            4 => Err(Error::with_cause(Code::RecordExpired, "run vanished")),
            other => Err(Error::internal(format!("finalize script returned {other}"))),
        }
    }

    /// One run of the finalize script; `tail` is the stripped fallback's digests and seal, or
    /// empty when they are not made yet.
    async fn finalize_once(
        &self,
        keys: &[String; 3],
        record: &Record,
        body: &FinalBody,
        marks: &str,
        tail: &str,
    ) -> Result<i64> {
        let script = &self.scripts.finalize;
        let mut size = itoa::Buffer::new();
        let args = [
            body.text.as_str(),
            size.format(body.size()),
            marks,
            record.tool_call_id.as_str(),
            tail,
        ];
        Ok(match &self.waiters {
            None => {
                let key_bytes = keys.each_ref().map(|k| k.as_bytes());
                let arg_bytes = args.map(str::as_bytes);
                let eval = Eval {
                    script,
                    keys: &key_bytes,
                    args: &arg_bytes,
                };
                self.write(&keys[1], &eval).await?
            }
            // Boxed: the WAIT lease and pipeline are large, and would otherwise grow every
            // finalize's future, with either durability.
            Some(waiters) => {
                Box::pin(async {
                    let mut lease = waiters.lease().await?;
                    let conn = &mut lease.conn;
                    // WAIT must follow the write on the connection that made it: a pipeline is
                    // routed by its first key, so both go to the slot's primary, in one round
                    // trip.
                    let wait_ms = (self.timeout.as_millis() as u64 / 2).max(1);
                    let mut pipe = redis::pipe();
                    pipe.ignore_errors()
                        .cmd("EVALSHA")
                        .arg(script.get_hash())
                        .arg(keys.len())
                        .arg(keys)
                        .arg(&args)
                        .cmd("WAIT")
                        .arg(1)
                        .arg(wait_ms);
                    let mut replies: Vec<Value> =
                        pipe.query_async(conn).await.map_err(redis_err)?;
                    if replies.first().is_some_and(is_noscript) {
                        script.load_async(conn).await.map_err(redis_err)?;
                        replies = pipe.query_async(conn).await.map_err(redis_err)?;
                    }
                    lease.release();
                    let [code, acks] = <[Value; 2]>::try_from(replies)
                        .map_err(|r| Error::internal(format!("finalize pipeline gave {r:?}")))?;
                    let code = int_reply(code)?;
                    if code <= 1 {
                        let acks = int_reply(acks)?;
                        if acks < 1 {
                            return Err(Error::store(
                                "no replica acknowledged the finalized record",
                            ));
                        }
                    }
                    Ok(code)
                })
                .await?
            }
        })
    }
}

impl Store for RedisStore {
    fn create_run(&self, run: NewRun) -> StoreFuture<'_, RunView> {
        Box::pin(async move {
            let view = RunView::new(run);
            let spec = serde_json::to_string(&RunSpec {
                run_id: view.run_id.clone(),
                created_ms: view.created_ms,
                deadline_ms: view.deadline_ms,
                budget: view.budget.clone(),
                tools: view.tools.clone(),
                workspace: Some(view.workspace.clone()),
                home: Some(view.home.clone()),
            })
            .map_err(Error::internal)?;
            let mut invocation = self.scripts.run_create.prepare_invoke();
            invocation
                .key(self.keys.run(&view.run_id))
                .key(self.keys.progress(&view.run_id))
                .arg(view.key_ttl_ms(self.record_ttl_ms))
                .arg(spec)
                .arg(view.deadline_ms)
                .arg(view.budget.max_calls)
                .arg(view.budget.max_record_bytes);
            for (tool, cap) in &view.budget.max_calls_per_tool {
                invocation.arg(tool).arg(cap);
            }
            let created: i64 = self
                .op("create_run", async {
                    invocation
                        .invoke_async(&mut self.conn.clone())
                        .await
                        .map_err(redis_err)
                })
                .await?;
            if created == 1 {
                Ok(view)
            } else {
                Err(Code::RunExists.into())
            }
        })
    }

    fn get_run<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async move {
            let fields: HashMap<String, String> = self
                .op("get_run", async {
                    redis::cmd("HGETALL")
                        .arg(self.keys.run(run_id))
                        .query_async(&mut self.conn.clone())
                        .await
                        .map_err(redis_err)
                })
                .await?;
            if fields.is_empty() {
                return Ok(None);
            }
            run_from_fields(fields).map(Some)
        })
    }

    fn close_run<'a>(&'a self, run_id: &'a RunId, how: Close) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async move {
            let fields: Option<HashMap<String, String>> = self
                .op("close_run", async {
                    self.scripts
                        .run_close
                        .key(self.keys.run(run_id))
                        .arg(how.state().as_str())
                        .invoke_async(&mut self.conn.clone())
                        .await
                        .map_err(redis_err)
                })
                .await?;
            fields.map(run_from_fields).transpose()
        })
    }

    fn reserve<'a>(&'a self, record: &'a Record, now_ms: u64) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_projecting(record)?;
            let body = record.to_json()?;
            let code: i64 = self
                .op("reserve", async {
                    let script = &self.scripts.reserve;
                    let run = self.keys.run(&record.run_id);
                    let key = self.keys.record(&record.run_id, &record.tool_call_id);
                    let mut now = itoa::Buffer::new();
                    let mut ttl = itoa::Buffer::new();
                    let eval = Eval {
                        script,
                        keys: &[run.as_bytes(), key.as_bytes()],
                        args: &[
                            now.format(now_ms).as_bytes(),
                            record.tool.as_bytes(),
                            body.as_bytes(),
                            ttl.format(self.record_ttl_ms).as_bytes(),
                        ],
                    };
                    self.write(&run, &eval).await
                })
                .await?;
            match code {
                0 => Ok(()),
                1 => Err(Code::RunInactive.into()),
                2 => Err(Code::RunDeadlineExceeded.into()),
                3 => Err(Code::DuplicateToolCall.into()),
                4 => Err(Code::BudgetExhausted.into()),
                other => Err(Error::internal(format!("reserve script returned {other}"))),
            }
        })
    }

    fn finalize<'a>(&'a self, record: &'a Record, record_bytes: u64) -> StoreFuture<'a, Finalized> {
        Box::pin(async move {
            let body = FinalBody::new(record, record_bytes, &self.sealer)?;
            self.op("finalize", self.finalize_inner(record, &body))
                .await
        })
    }

    fn get_record<'a>(
        &'a self,
        run_id: &'a RunId,
        tool_call_id: &'a ToolCallId,
    ) -> StoreFuture<'a, Option<(Record, u64)>> {
        Box::pin(async move {
            let key = self.keys.record(run_id, tool_call_id);
            let (body, ttl): (Option<String>, i64) = self
                .op("get_record", async {
                    redis::pipe()
                        .cmd("GET")
                        .arg(&key)
                        .cmd("PTTL")
                        .arg(&key)
                        .query_async(&mut self.conn.clone())
                        .await
                        .map_err(redis_err)
                })
                .await?;
            match body {
                // PTTL is negative when the key expired between the two commands.
                Some(body) => Ok(Some((Record::from_json(&body)?, ttl.max(0) as u64))),
                None => Ok(None),
            }
        })
    }

    fn progress<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<Vec<ProgressEntry>>> {
        Box::pin(async move {
            let flat: Option<Vec<Option<String>>> = self
                .op("progress", async {
                    self.scripts
                        .progress
                        .key(self.keys.run(run_id))
                        .key(self.keys.progress(run_id))
                        .arg(self.keys.record_prefix(run_id))
                        .invoke_async(&mut self.conn.clone())
                        .await
                        .map_err(redis_err)
                })
                .await?;
            let Some(flat) = flat else {
                return Ok(None);
            };
            let mut out = Vec::with_capacity(flat.len() / 2);
            let mut it = flat.into_iter();
            while let Some(id) = it.next() {
                let id = id
                    .and_then(ToolCallId::from_string)
                    .ok_or_else(|| Error::internal("progress list holds an invalid id"))?;
                let record = match it.next().flatten() {
                    Some(body) => Some(Record::from_json(&body)?),
                    None => None,
                };
                out.push((id, record));
            }
            Ok(Some(out))
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async move {
            self.op("ping", async {
                let routing = RoutingInfo::MultiNode((
                    MultipleNodeRoutingInfo::AllMasters,
                    Some(ResponsePolicy::AllSucceeded),
                ));
                self.conn
                    .clone()
                    .route_command(redis::cmd("PING"), routing)
                    .await
                    .map(drop)
                    .map_err(redis_err)
            })
            .await
        })
    }
}

/// Cluster connections used one finalize at a time. `WAIT` blocks the connection it runs on
/// until a replica acknowledges or its timeout passes, so on a shared (multiplexed) connection
/// one slow or missing replica would queue every other command behind it, and the queue would
/// outgrow any timeout. A leased connection serves one finalize; one abandoned mid-call (the
/// store timeout fired) is dropped, not reused, so nothing ever waits behind a stale `WAIT`.
struct WaitPool {
    client: ClusterClient,
    idle: Mutex<Vec<ClusterConnection>>,
    permits: Semaphore,
}

/// At most this many finalizes wait for replicas at once; more wait for a lease, within the
/// store timeout. Each connection holds one socket per cluster node.
const WAIT_CONNECTIONS: usize = 8;

impl WaitPool {
    fn new(client: ClusterClient) -> WaitPool {
        WaitPool {
            client,
            idle: Mutex::new(Vec::new()),
            permits: Semaphore::new(WAIT_CONNECTIONS),
        }
    }

    async fn lease(&self) -> Result<Lease<'_>> {
        let permit = self
            .permits
            .acquire()
            .await
            .map_err(|e| Error::internal(format!("wait pool closed: {e}")))?;
        let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
        let conn = match idle {
            Some(conn) => conn,
            None => self
                .client
                .get_async_connection()
                .await
                .map_err(redis_err)?,
        };
        Ok(Lease {
            pool: self,
            conn,
            reusable: false,
            _permit: permit,
        })
    }
}

struct Lease<'a> {
    pool: &'a WaitPool,
    conn: ClusterConnection,
    /// Set once the last command on `conn` completed.
    reusable: bool,
    _permit: SemaphorePermit<'a>,
}

impl Lease<'_> {
    /// Marks the connection fit for reuse: its last command completed.
    fn release(&mut self) {
        self.reusable = true;
    }
}

impl Drop for Lease<'_> {
    /// Returns a released connection to the pool; any other is closed with its last clone.
    fn drop(&mut self) {
        if self.reusable {
            self.pool
                .idle
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(self.conn.clone());
        }
    }
}

/// One `EVALSHA` of a write: the script, then its keys and arguments as the bytes sent.
struct Eval<'a> {
    script: &'a Script,
    keys: &'a [&'a [u8]],
    args: &'a [&'a [u8]],
}

impl Eval<'_> {
    /// Appends the command in RESP (an array of bulk strings) to `out`, sized once.
    fn pack(&self, out: &mut Vec<u8>) {
        let hash = self.script.get_hash().as_bytes();
        let mut count = itoa::Buffer::new();
        let count = count.format(self.keys.len()).as_bytes();
        let parts = self.keys.iter().chain(self.args);
        // Each part: `$`, at most 20 digits and two line ends around it.
        let bytes: usize = parts.clone().map(|p| p.len() + 25).sum();
        out.reserve(bytes + 96);
        let mut len = itoa::Buffer::new();
        out.push(b'*');
        out.extend_from_slice(len.format(3 + self.keys.len() + self.args.len()).as_bytes());
        out.extend_from_slice(b"\r\n");
        for part in [&b"EVALSHA"[..], hash, count].iter().chain(parts) {
            out.push(b'$');
            out.extend_from_slice(len.format(part.len()).as_bytes());
            out.extend_from_slice(b"\r\n");
            out.extend_from_slice(part);
            out.extend_from_slice(b"\r\n");
        }
    }

    /// The same command for the cluster client, which routes it by its first key.
    fn cmd(&self) -> redis::Cmd {
        let mut cmd = redis::cmd("EVALSHA");
        cmd.arg(self.script.get_hash()).arg(self.keys.len());
        for part in self.keys.iter().chain(self.args) {
            cmd.arg(*part);
        }
        cmd
    }
}

/// Sends a script's command ([`Eval::cmd`]); a node that does not hold the script (`NOSCRIPT`, a
/// node that restarted) has it loaded and gets the command again, as `Script::invoke_async`
/// does.
async fn run_script<T: FromRedisValue>(
    script: &Script,
    cmd: &redis::Cmd,
    conn: &mut impl redis::aio::ConnectionLike,
) -> Result<T> {
    match cmd.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(ServerErrorKind::NoScript) => {
            script.load_async(conn).await.map_err(redis_err)?;
            cmd.query_async(conn).await.map_err(redis_err)
        }
        other => other.map_err(redis_err),
    }
}

/// Runs `fut` within `timeout`; a timeout is `STORE_UNAVAILABLE`.
///
/// A future of its own rather than an `async fn`: an `async fn` keeps its argument and the
/// `Timeout` it was moved into side by side, so the store's operation futures, about 1 KiB,
/// were held (and copied) twice at every layer.
fn bounded<T, F: Future<Output = Result<T>>>(
    timeout: Duration,
    what: &'static str,
    fut: F,
) -> Bounded<F> {
    Bounded {
        inner: tokio::time::timeout(timeout, fut),
        timeout,
        what,
    }
}

pin_project_lite::pin_project! {
    /// The future of [`bounded`].
    struct Bounded<F> {
        #[pin]
        inner: tokio::time::Timeout<F>,
        timeout: Duration,
        what: &'static str,
    }
}

impl<T, F: Future<Output = Result<T>>> Future for Bounded<F> {
    type Output = Result<T>;

    fn poll(self: std::pin::Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Result<T>> {
        let this = self.project();
        let what = *this.what;
        this.inner.poll(cx).map(|done| match done {
            Ok(result) => result.map_err(|mut e| {
                if e.code == Code::StoreUnavailable {
                    e.cause = format!("{what}: {}", e.cause);
                }
                e
            }),
            Err(_) => Err(Error::store(format!(
                "{what}: no answer within {} ms",
                this.timeout.as_millis()
            ))),
        })
    }
}

/// Every Redis failure (I/O, timeout, `CLUSTERDOWN`, exhausted redirects, a rejected command)
/// means the store could not do its job: `STORE_UNAVAILABLE`, the cause kept for logs.
fn redis_err(e: redis::RedisError) -> Error {
    Error::store(e)
}

/// One reply of a pipeline: a server error there is the store failing, like any Redis error.
fn int_reply(v: Value) -> Result<i64> {
    match v {
        Value::ServerError(e) => Err(Error::store(format!("{e:?}"))),
        v => redis::from_redis_value(v)
            .map_err(|e| Error::internal(format!("unexpected reply: {e}"))),
    }
}

fn is_noscript(v: &Value) -> bool {
    matches!(v, Value::ServerError(e) if e.kind() == Some(ServerErrorKind::NoScript))
}

fn run_from_fields(mut fields: HashMap<String, String>) -> Result<RunView> {
    let corrupt = |what: &dyn fmt::Display| Error::internal(format!("corrupt run hash: {what}"));
    let spec: RunSpec = fields
        .get("spec")
        .ok_or_else(|| corrupt(&"no spec"))
        .and_then(|s| serde_json::from_str(s).map_err(|e| corrupt(&e)))?;
    let state = match fields.get("state").map(String::as_str) {
        Some("ACTIVE") => RunState::Active,
        Some("ENDED") => RunState::Ended,
        Some("CANCELLED") => RunState::Cancelled,
        other => return Err(corrupt(&format!("state {other:?}"))),
    };
    let mut number = |name: &str| -> Result<u64> {
        fields
            .remove(name)
            .ok_or_else(|| corrupt(&format!("no {name}")))?
            .parse()
            .map_err(|e| corrupt(&e))
    };
    let calls_used = number("calls_used")?;
    let record_bytes_used = number("record_bytes_used")?;
    let mut calls_per_tool = BTreeMap::new();
    for (field, value) in &fields {
        if let Some(tool) = field.strip_prefix(USED) {
            calls_per_tool.insert(tool.to_string(), value.parse().map_err(|e| corrupt(&e))?);
        }
    }
    Ok(RunView {
        run_id: spec.run_id,
        state,
        created_ms: spec.created_ms,
        deadline_ms: spec.deadline_ms,
        budget: spec.budget,
        tools: spec.tools,
        workspace: spec
            .workspace
            .unwrap_or_else(|| RunPaths::default().workspace),
        home: spec.home.unwrap_or_else(|| RunPaths::default().home),
        calls_used,
        calls_per_tool,
        record_bytes_used,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// The direct path's command is, byte for byte, the one the cluster client sends.
        #[test]
        fn a_packed_write_is_the_clients_command(
            keys in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..40), 0..4),
            args in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..7),
        ) {
            let script = Script::new("return 1");
            let keys: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
            let args: Vec<&[u8]> = args.iter().map(Vec::as_slice).collect();
            let eval = Eval { script: &script, keys: &keys, args: &args };
            let mut packed = b"left as it was".to_vec();
            eval.pack(&mut packed);
            let mut expected = b"left as it was".to_vec();
            eval.cmd().write_packed_command(&mut expected);
            prop_assert_eq!(packed, expected);
        }
    }

    /// The finalize script splices a run's fallback with the texts the Rust side's stripped
    /// record has (the shared store suite checks the result against it, byte for byte).
    #[test]
    fn the_finalize_script_strips_with_the_records_texts() {
        let lua = include_str!("lua/finalize.lua");
        for text in [
            crate::store::record::STRIPPED_STATE,
            crate::store::record::STRIPPED_RESULT,
        ] {
            assert!(
                lua.contains(&format!("'{text}'")),
                "finalize.lua lacks {text}"
            );
        }
    }

    #[test]
    fn a_packed_write_reads_as_resp() {
        let script = Script::new("return 1");
        let eval = Eval {
            script: &script,
            keys: &[b"k"],
            args: &[b"", "é".as_bytes()],
        };
        let mut packed = Vec::new();
        eval.pack(&mut packed);
        let hash = script.get_hash();
        assert_eq!(
            String::from_utf8(packed).unwrap(),
            format!(
                "*6\r\n$7\r\nEVALSHA\r\n$40\r\n{hash}\r\n$1\r\n1\r\n$1\r\nk\r\n$0\r\n\r\n$2\r\né\r\n"
            )
        );
    }

    #[test]
    fn run_hash_round_trips() {
        let spec = RunSpec {
            run_id: RunId::parse("r").unwrap(),
            created_ms: 5,
            deadline_ms: 10,
            budget: Budget {
                max_calls: 3,
                max_calls_per_tool: BTreeMap::from([("s".to_string(), 1)]),
                max_record_bytes: 100,
            },
            tools: Some(vec!["s".into()]),
            workspace: None,
            home: None,
        };
        let fields = HashMap::from([
            ("spec".to_string(), serde_json::to_string(&spec).unwrap()),
            ("state".to_string(), "ENDED".to_string()),
            ("deadline_ms".to_string(), "10".to_string()),
            ("calls_used".to_string(), "2".to_string()),
            ("record_bytes_used".to_string(), "40".to_string()),
            ("cap:s".to_string(), "1".to_string()),
            ("used:s".to_string(), "1".to_string()),
            ("used:t".to_string(), "1".to_string()),
        ]);
        let run = run_from_fields(fields).unwrap();
        assert_eq!(run.state, RunState::Ended);
        assert_eq!(run.calls_used, 2);
        assert_eq!(run.record_bytes_used, 40);
        assert_eq!(
            run.calls_per_tool,
            BTreeMap::from([("s".to_string(), 1), ("t".to_string(), 1)])
        );
        assert_eq!(run.budget, spec.budget);
    }

    #[test]
    fn a_corrupt_run_hash_is_internal() {
        let fields = HashMap::from([("state".to_string(), "ACTIVE".to_string())]);
        assert_eq!(run_from_fields(fields).unwrap_err().code, Code::Internal);
    }
}
