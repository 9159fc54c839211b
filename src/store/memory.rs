//! The embedded store: the same semantics as Redis Cluster (TTL included) in one process.
//! Every operation takes one lock, so each is atomic, as a Lua script is in Redis. Expiry runs
//! on the one clock ([`crate::clock`]), so tests move TTLs by pausing and advancing tokio time.
//!
//! Expiry is Redis's too: a read checks a key's instant itself, so an expired key is never
//! seen, and a background task ([`MemoryStore::expire_in_background`]) drops the keys that
//! have come due, a few at a time, and frees them after the lock is released. A call never
//! drops keys it did not ask for; only a reservation that would take the store past its byte
//! bound drops everything due first.
//!
//! Nothing grows as one block: records sit in many small hash maps that each grow on their
//! own, expiry in an ordered map with one entry a key, progress lists in chunks. So no
//! single operation pays for rehashing or copying the whole store, however many records it
//! holds.

use std::collections::BTreeMap;
use std::hash::{BuildHasher, Hash, RandomState};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use hashbrown::HashTable;

use super::{
    Close, FinalBody, Finalized, NewRun, ProgressEntry, Record, RunState, RunView, Store,
    StoreFuture, check_projecting,
};
use crate::clock;
use crate::error::{Code, Error, SizeStage};
use crate::evidence::Sealer;
use crate::ids::{RunId, ToolCallId};

/// Instants of the one clock, in epoch milliseconds.
type Instant = u64;

/// Embedded store.
pub struct MemoryStore {
    record_ttl_ms: u64,
    /// A reservation that would take the store past this many bytes fails closed.
    max_bytes: u64,
    inner: Arc<Mutex<Inner>>,
    /// Seals every final record.
    sealer: Arc<Sealer>,
    /// The thread of [`MemoryStore::expire_in_background`], which ends with the store.
    expiry_thread: Option<std::thread::JoinHandle<()>>,
}

/// What one record costs besides its key and body: the map and heap entries and the headers of
/// the strings (measured on 64-bit Linux, rounded up).
const RECORD_OVERHEAD: u64 = 160;
/// What one run costs besides its progress list (its view, budget map, entries).
const RUN_OVERHEAD: u64 = 512;
/// What one progress entry costs besides the id's bytes.
const PROGRESS_OVERHEAD: u64 = 32;

#[derive(Default)]
struct Inner {
    runs: Sharded<RunId, Expiring<RunEntry>>,
    records: Sharded<(RunId, ToolCallId), Expiring<StoredRecord>>,
    /// The bytes the runs and records above take, by the estimate of the constants above.
    bytes: u64,
    /// Every key by the instant it is due, soonest first (and in the order they were added at
    /// one instant, by a sequence number): expired keys are dropped in O(log n) each, so
    /// memory stays bounded by the TTLs without ever scanning the whole store. One entry a
    /// key, with no list of its own to allocate.
    expiry: BTreeMap<(Instant, u64), Key>,
    /// The sequence number of the next key added to `expiry`.
    expiry_seq: u64,
}

/// How many maps the records (and runs) are spread over: a shard that grows rehashes only its
/// own share, about a 256th of the store.
const SHARDS: usize = 256;

/// A hash map split into [`SHARDS`] tables by the key's hash, each growing independently.
/// A key is hashed once per operation: eight middle bits of the hash pick the shard (see
/// [`shard_of`]) and the table finds the slot with the same hash.
struct Sharded<K, V> {
    shards: Vec<HashTable<(K, V)>>,
    hasher: RandomState,
    len: usize,
}

impl<K, V> Default for Sharded<K, V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| HashTable::new()).collect(),
            hasher: RandomState::new(),
            len: 0,
        }
    }
}

/// The shard of a hash: bits 32–39. A table takes a slot's position from the hash's low bits
/// and, to tell the keys in a probed group apart before comparing them, a tag from its top
/// seven bits; a shard picked by either would give all its keys the same position bits or the
/// same tag (the top bits made every key of a group a candidate, each compared in full).
fn shard_of(hash: u64) -> usize {
    (hash >> 32) as usize % SHARDS
}

/// Where a key lies in a [`Sharded`]: its hash and the shard the hash picks. Found once, it
/// serves every lookup of that key within one operation.
#[derive(Clone, Copy)]
struct At {
    hash: u64,
    shard: usize,
}

impl<K: Hash + Eq, V> Sharded<K, V> {
    fn locate(&self, key: &K) -> At {
        let hash = self.hasher.hash_one(key);
        At {
            hash,
            shard: shard_of(hash),
        }
    }

    fn insert(&mut self, key: K, value: V) -> Option<V> {
        self.insert_at(self.locate(&key), key, value)
    }

    /// [`Sharded::insert`] of `key`, which lies at `at`.
    fn insert_at(&mut self, at: At, key: K, value: V) -> Option<V> {
        let At { hash, shard: i } = at;
        let hasher = &self.hasher;
        match self.shards[i].entry(hash, |(k, _)| *k == key, |(k, _)| hasher.hash_one(k)) {
            hashbrown::hash_table::Entry::Occupied(mut e) => {
                Some(std::mem::replace(&mut e.get_mut().1, value))
            }
            hashbrown::hash_table::Entry::Vacant(e) => {
                e.insert((key, value));
                self.len += 1;
                None
            }
        }
    }

    /// The value of `key` when `keep` holds for it; otherwise it is removed. One hash, one
    /// probe.
    fn lookup(&mut self, key: &K, keep: impl FnOnce(&V) -> bool) -> Lookup<'_, V> {
        self.lookup_at(self.locate(key), key, keep)
    }

    /// [`Sharded::lookup`] of `key`, which lies at `at`.
    fn lookup_at(&mut self, at: At, key: &K, keep: impl FnOnce(&V) -> bool) -> Lookup<'_, V> {
        let At { hash, shard: i } = at;
        match self.shards[i].find_entry(hash, |(k, _)| k == key) {
            Err(_) => Lookup::Missing,
            Ok(found) if keep(&found.get().1) => Lookup::Kept(&mut found.into_mut().1),
            Ok(found) => {
                let ((_, old), _) = found.remove();
                self.len -= 1;
                Lookup::Removed(old)
            }
        }
    }

    /// Removes `key` when `take` holds for its value, and gives back the key and the value as
    /// they were stored. One hash, one probe.
    fn take_if(&mut self, key: &K, take: impl FnOnce(&V) -> bool) -> Option<(K, V)> {
        let At { hash, shard: i } = self.locate(key);
        let found = self.shards[i].find_entry(hash, |(k, _)| k == key).ok()?;
        if !take(&found.get().1) {
            return None;
        }
        let (stored, _) = found.remove();
        self.len -= 1;
        Some(stored)
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.len
    }
}

/// What [`Sharded::lookup`] found.
enum Lookup<'a, V> {
    Kept(&'a mut V),
    Removed(V),
    Missing,
}

/// A list that grows by fixed-size chunks, never by copying what it holds.
struct Chunked<T> {
    chunks: Vec<Vec<T>>,
}

/// Entries per chunk of a [`Chunked`] list.
const CHUNK: usize = 1024;

impl<T> Default for Chunked<T> {
    fn default() -> Self {
        Chunked { chunks: Vec::new() }
    }
}

impl<T> Chunked<T> {
    fn push(&mut self, value: T) {
        match self.chunks.last_mut() {
            Some(last) if last.len() < CHUNK => last.push(value),
            _ => {
                let mut chunk = Vec::with_capacity(CHUNK);
                chunk.push(value);
                self.chunks.push(chunk);
            }
        }
    }

    fn iter(&self) -> impl Iterator<Item = &T> {
        self.chunks.iter().flatten()
    }
}

#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
enum Key {
    Run(RunId),
    Record(RunId, ToolCallId),
}

struct RunEntry {
    run: RunView,
    progress: Chunked<ToolCallId>,
    /// What this entry counts in `Inner::bytes`.
    size: u64,
}

fn record_size(key: &(RunId, ToolCallId), body: &str) -> u64 {
    (key.0.len() + key.1.len() + body.len()) as u64 + RECORD_OVERHEAD
}

/// A record as the memory store holds it: its JSON, and whether it is still PROJECTING, so a
/// finalize need not parse the JSON back to find out.
struct StoredRecord {
    json: String,
    projecting: bool,
}

struct Expiring<T> {
    value: T,
    expires_at: Instant,
}

impl<T> Expiring<T> {
    fn live(&self, now: Instant) -> bool {
        now < self.expires_at
    }
}

impl MemoryStore {
    /// A store without a byte bound (tests, the demo).
    pub fn new(record_ttl_ms: u64, sealer: Arc<Sealer>) -> MemoryStore {
        MemoryStore::bounded(record_ttl_ms, u64::MAX, sealer)
    }

    /// A store that holds at most about `max_bytes` of runs and records: a reservation that
    /// would go past it fails closed with `STORE_UNAVAILABLE`; nothing is ever evicted early.
    /// Due keys leave memory once [`MemoryStore::expire_in_background`] runs (or when the
    /// store is full).
    pub fn bounded(record_ttl_ms: u64, max_bytes: u64, sealer: Arc<Sealer>) -> MemoryStore {
        MemoryStore {
            record_ttl_ms,
            max_bytes,
            inner: Arc::default(),
            sealer,
            expiry_thread: None,
        }
    }

    /// Starts the thread that drops due keys: every [`EXPIRY_TICK`], batches of at most
    /// [`EXPIRE_PER_BATCH`] due keys, each under the lock for that batch only and freed after
    /// it, until none is due. The thread runs at a lower priority than the serving threads
    /// (nice 10), so on a busy machine a call's thread is not kept waiting for a core behind it,
    /// and it reads the clock of the runtime it is started from. It ends within a tick once the
    /// store is dropped.
    pub fn expire_in_background(mut self) -> std::io::Result<MemoryStore> {
        let inner = Arc::downgrade(&self.inner);
        let runtime = tokio::runtime::Handle::try_current().map_err(std::io::Error::other)?;
        let thread = std::thread::Builder::new()
            .name("toolgate-expiry".into())
            .spawn(move || {
                let _clock = runtime.enter();
                lower_priority();
                expire_due_keys(&inner);
            })?;
        self.expiry_thread = Some(thread);
        Ok(self)
    }

    /// Drops every key that is due now, as the expiry thread does, and frees it after the lock
    /// is released. For a store without that thread (tests, fuzzing).
    pub fn expire_due(&self) {
        drop(take_due(&self.inner, clock::now_ms(), usize::MAX));
    }

    /// The bytes held now, by the store's estimate.
    /// The text a record is held as. With [`MemoryStore::put_raw_record`], for tests that play
    /// someone who can write to the store's memory: nothing else reads or writes around the
    /// store's rules.
    #[doc(hidden)]
    pub fn raw_record(&self, run_id: &RunId, id: &str) -> Option<String> {
        let id = ToolCallId::parse(id)?;
        let now = clock::now_ms();
        let mut inner = self.lock();
        inner.record(run_id, &id, now).map(|e| e.value.json.clone())
    }

    /// Replaces the text of an existing final record, keeping its expiry (see
    /// [`MemoryStore::raw_record`]).
    #[doc(hidden)]
    pub fn put_raw_record(&self, run_id: &RunId, id: &str, json: String) {
        let Some(id) = ToolCallId::parse(id) else {
            return;
        };
        let now = clock::now_ms();
        let mut inner = self.lock();
        let key = (run_id.clone(), id);
        let at = inner.records.locate(&key);
        let Some(expires_at) = inner.record_at(at, &key, now).map(|e| e.expires_at) else {
            return;
        };
        let value = StoredRecord {
            json,
            projecting: false,
        };
        inner.put_record(at, key, Expiring { value, expires_at });
    }

    pub fn bytes(&self) -> u64 {
        self.lock().bytes
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        lock(&self.inner)
    }
}

/// The store's lock. A panic while holding it cannot leave a half-applied operation: each
/// operation mutates only after all its checks, so the data stays consistent.
fn lock(inner: &Mutex<Inner>) -> MutexGuard<'_, Inner> {
    inner.lock().unwrap_or_else(|p| p.into_inner())
}

/// How often the expiry task looks for due keys when none was due at its last look: a key
/// leaves memory at most about this long after it came due.
pub const EXPIRY_TICK: Duration = Duration::from_millis(10);

/// The most due keys the expiry task drops under one hold of the lock. A call that waits for
/// the lock waits for at most one batch; between batches the task yields to other tasks.
pub const EXPIRE_PER_BATCH: usize = 32;

/// How often, in milliseconds, the expiry thread gives the memory the allocator holds free back to the OS
/// ([`toolgate_alloc::purge`]). The records it frees were allocated by the serving threads;
/// left to the allocator, their memory would be purged a second later by whichever thread
/// got to it first, in practice a serving thread in the middle of a call (each purge a
/// `madvise` of 80-100 µs on average, up to 0.8 ms, while a burst of records comes due).
/// Purging here, more often than the allocator's delay, leaves the serving threads none.
pub const PURGE_EVERY_MS: u64 = 100;

/// The expiry thread's loop: drops due keys until none is due, then sleeps a tick; gives free
/// memory back every [`PURGE_EVERY_MS`]; ends when the store is gone.
fn expire_due_keys(inner: &Weak<Mutex<Inner>>) {
    let mut purge_at = clock::now_ms() + PURGE_EVERY_MS;
    // Room for one batch, kept from tick to tick: nothing allocates while the lock is held,
    // nor on a tick that finds nothing due.
    let mut expired = Expired::with_room(EXPIRE_PER_BATCH);
    loop {
        let Some(store) = inner.upgrade() else {
            return;
        };
        let now = clock::now_ms();
        lock(&store).expire(now, EXPIRE_PER_BATCH, &mut expired);
        drop(store);
        let full = expired.len() == EXPIRE_PER_BATCH;
        // Freed here, after the lock was released; the room stays.
        expired.clear();
        if now >= purge_at {
            toolgate_alloc::purge();
            purge_at = now + PURGE_EVERY_MS;
        }
        if !full {
            #[allow(clippy::disallowed_methods)] // a thread of its own, not a runtime's
            std::thread::sleep(EXPIRY_TICK);
        }
    }
}

/// Lowers the calling thread's priority to nice 10 (best effort: where it cannot, the thread
/// runs at the process's priority).
#[cfg(target_os = "linux")]
fn lower_priority() {
    let me = rustix::thread::gettid();
    let _ = rustix::process::setpriority_process(Some(me), 10);
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Takes up to `max` keys due at `now` out of the store, under the lock, and hands them back
/// to be freed after it is released.
fn take_due(inner: &Mutex<Inner>, now: Instant, max: usize) -> Expired {
    let mut expired = Expired::with_room(max.min(EXPIRE_PER_BATCH));
    lock(inner).expire(now, max, &mut expired);
    expired
}

/// What expiry took out of the store, freed by whoever holds it, after the lock was released.
/// A record comes with the key its expiry entry named and the key and value the record map
/// held; a run with its progress list, which may hold the last references to many ids. (A run
/// or record found expired by a read is rare: it is dropped where it is found.)
#[derive(Default)]
struct Expired {
    records: Vec<(RecordKey, (RecordKey, Expiring<StoredRecord>))>,
    runs: Vec<(RunId, Expiring<RunEntry>)>,
}

impl Expired {
    /// Room for `batch` keys of either kind, made before the lock is taken, so that a batch of
    /// at most that many never grows while the lock is held.
    fn with_room(batch: usize) -> Expired {
        Expired {
            records: Vec::with_capacity(batch),
            runs: Vec::with_capacity(batch),
        }
    }

    fn len(&self) -> usize {
        self.records.len() + self.runs.len()
    }

    /// Frees what was taken, keeping the room.
    fn clear(&mut self) {
        self.records.clear();
        self.runs.clear();
    }
}

/// A record's key: its run and its tool_call_id.
type RecordKey = (RunId, ToolCallId);

impl Inner {
    /// Drops up to `max` of the keys whose time has come, soonest first, into `expired`, to be
    /// freed by the caller (after releasing the lock). An entry whose key was since replaced by a newer one (same name,
    /// later expiry) leaves that key alone.
    fn expire(&mut self, now: Instant, max: usize, expired: &mut Expired) {
        for _ in 0..max {
            let Some(due) = self.expiry.first_entry() else {
                break;
            };
            let (at, _) = *due.key();
            if at > now {
                break;
            }
            match due.remove() {
                Key::Run(id) => {
                    if let Some(stored) = self.runs.take_if(&id, |e| e.expires_at == at) {
                        self.bytes = self.bytes.saturating_sub(stored.1.value.size);
                        expired.runs.push(stored);
                    }
                }
                Key::Record(run, id) => {
                    let key = (run, id);
                    if let Some(stored) = self.records.take_if(&key, |e| e.expires_at == at) {
                        let size = record_size(&stored.0, &stored.1.value.json);
                        self.bytes = self.bytes.saturating_sub(size);
                        expired.records.push((key, stored));
                    }
                }
            }
        }
    }

    fn expire_at(&mut self, at: Instant, key: Key) {
        self.expiry.insert((at, self.expiry_seq), key);
        self.expiry_seq += 1;
    }

    /// Fails closed when `size` more bytes would take the store past `max_bytes`, counting only
    /// live keys: what is due is dropped first.
    fn room_for(&mut self, size: u64, max_bytes: u64) -> Result<(), Error> {
        if self.bytes.saturating_add(size) > max_bytes {
            // Rare (a full store): what this drops is freed here, under the lock.
            self.expire(clock::now_ms(), usize::MAX, &mut Expired::default());
        }
        if self.bytes.saturating_add(size) > max_bytes {
            return Err(Error::store(format!(
                "memory store full: {} of {max_bytes} bytes held (store.memory_max_bytes)",
                self.bytes
            )));
        }
        Ok(())
    }

    /// Inserts or replaces the record of `key`, which lies at `at`, keeping the byte count.
    fn put_record(&mut self, at: At, key: (RunId, ToolCallId), record: Expiring<StoredRecord>) {
        self.bytes += record_size(&key, &record.value.json);
        if let Some(old) = self.records.insert_at(at, key.clone(), record) {
            self.bytes = self
                .bytes
                .saturating_sub(record_size(&key, &old.value.json));
        }
    }

    /// The run, if it is live; an expired one is dropped on the way.
    fn run(&mut self, run_id: &RunId, now: Instant) -> Option<&mut RunEntry> {
        match self.runs.lookup(run_id, |e| e.live(now)) {
            Lookup::Kept(e) => Some(&mut e.value),
            Lookup::Removed(e) => {
                self.bytes = self.bytes.saturating_sub(e.value.size);
                None
            }
            Lookup::Missing => None,
        }
    }

    fn record(
        &mut self,
        run_id: &RunId,
        id: &ToolCallId,
        now: Instant,
    ) -> Option<&Expiring<StoredRecord>> {
        let key = (run_id.clone(), id.clone());
        self.record_at(self.records.locate(&key), &key, now)
    }

    /// [`Inner::record`] of `key`, which lies at `at`.
    fn record_at(
        &mut self,
        at: At,
        key: &(RunId, ToolCallId),
        now: Instant,
    ) -> Option<&Expiring<StoredRecord>> {
        match self.records.lookup_at(at, key, |e| e.live(now)) {
            Lookup::Kept(e) => Some(e),
            Lookup::Removed(e) => {
                self.bytes = self.bytes.saturating_sub(record_size(key, &e.value.json));
                None
            }
            Lookup::Missing => None,
        }
    }
}

impl Store for MemoryStore {
    fn create_run(&self, run: NewRun) -> StoreFuture<'_, RunView> {
        Box::pin(async move {
            let now = clock::now_ms();
            let mut inner = self.lock();
            if inner.run(&run.run_id, now).is_some() {
                return Err(Code::RunExists.into());
            }
            let view = RunView::new(run);
            let size = RUN_OVERHEAD + view.run_id.len() as u64;
            inner.room_for(size, self.max_bytes)?;
            let ttl = view.key_ttl_ms(self.record_ttl_ms);
            inner.bytes += size;
            inner.runs.insert(
                view.run_id.clone(),
                Expiring {
                    value: RunEntry {
                        run: view.clone(),
                        progress: Chunked::default(),
                        size,
                    },
                    expires_at: now + ttl,
                },
            );
            inner.expire_at(now + ttl, Key::Run(view.run_id.clone()));
            Ok(view)
        })
    }

    fn get_run<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Ok(inner.run(run_id, clock::now_ms()).map(|e| e.run.clone()))
        })
    }

    fn close_run<'a>(&'a self, run_id: &'a RunId, how: Close) -> StoreFuture<'a, Option<RunView>> {
        Box::pin(async move {
            let mut inner = self.lock();
            Ok(inner.run(run_id, clock::now_ms()).map(|e| {
                if e.run.state == RunState::Active {
                    e.run.state = how.state();
                }
                e.run.clone()
            }))
        })
    }

    fn reserve<'a>(&'a self, record: &'a Record, now_ms: u64) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            check_projecting(record)?;
            let body = record.to_json()?;
            let now = clock::now_ms();
            let mut inner = self.lock();
            let key = (record.run_id.clone(), record.tool_call_id.clone());
            // The record, and its id in the progress list later.
            let size = record_size(&key, &body) + PROGRESS_OVERHEAD + key.1.len() as u64;
            inner.room_for(size, self.max_bytes)?;
            // Hashed once, for the duplicate check and the insert.
            let at = inner.records.locate(&key);
            let duplicate = inner.record_at(at, &key, now).is_some();
            let Some(entry) = inner.run(&record.run_id, now) else {
                return Err(Code::RunInactive.into());
            };
            entry.run.admit(&record.tool, now_ms, duplicate)?;
            entry.run.calls_used += 1;
            *entry
                .run
                .calls_per_tool
                .entry(record.tool.to_string())
                .or_insert(0) += 1;
            let expires_at = now + self.record_ttl_ms;
            inner.expire_at(expires_at, Key::Record(key.0.clone(), key.1.clone()));
            inner.put_record(
                at,
                key,
                Expiring {
                    value: StoredRecord {
                        json: body,
                        projecting: true,
                    },
                    expires_at,
                },
            );
            Ok(())
        })
    }

    fn finalize<'a>(&'a self, record: &'a Record, record_bytes: u64) -> StoreFuture<'a, Finalized> {
        Box::pin(async move {
            let body = FinalBody::new(record, record_bytes, &self.sealer)?;
            let now = clock::now_ms();
            let mut inner = self.lock();
            let key = (record.run_id.clone(), record.tool_call_id.clone());
            // Hashed once, for the read and the write.
            let at = inner.records.locate(&key);
            let Some(current) = inner.record_at(at, &key, now) else {
                return Err(Error::with_cause(Code::RecordExpired, "record vanished"));
            };
            if !current.value.projecting {
                return Err(Error::internal("record is no longer PROJECTING"));
            }
            let expires_at = current.expires_at;
            let Some(entry) = inner.run(&record.run_id, now) else {
                return Err(Error::with_cause(Code::RecordExpired, "run vanished"));
            };
            let size = body.size();
            let (body, outcome) =
                if entry.run.record_bytes_used + size > entry.run.budget.max_record_bytes {
                    (
                        body.run_fallback(record, &self.sealer),
                        Finalized::TooLarge(SizeStage::Run),
                    )
                } else {
                    entry.run.record_bytes_used += size;
                    let outcome = body.written();
                    (body.text, outcome)
                };
            entry.progress.push(record.tool_call_id.clone());
            let grown = PROGRESS_OVERHEAD + record.tool_call_id.len() as u64;
            entry.size += grown;
            inner.bytes += grown;
            // A final record may be larger than its reservation: it is written all the same
            // (what was acknowledged must be readable), so the bound can be passed by at most
            // the calls in flight times their record_bytes.
            inner.put_record(
                at,
                key,
                Expiring {
                    value: StoredRecord {
                        json: body,
                        projecting: false,
                    },
                    expires_at,
                },
            );
            Ok(outcome)
        })
    }

    fn get_record<'a>(
        &'a self,
        run_id: &'a RunId,
        tool_call_id: &'a ToolCallId,
    ) -> StoreFuture<'a, Option<(Record, u64)>> {
        Box::pin(async move {
            let now = clock::now_ms();
            let mut inner = self.lock();
            let Some(e) = inner.record(run_id, tool_call_id, now) else {
                return Ok(None);
            };
            let ttl = e.expires_at.saturating_sub(now);
            Ok(Some((Record::from_json(&e.value.json)?, ttl)))
        })
    }

    fn progress<'a>(&'a self, run_id: &'a RunId) -> StoreFuture<'a, Option<Vec<ProgressEntry>>> {
        Box::pin(async move {
            let now = clock::now_ms();
            let mut inner = self.lock();
            let Some(ids) = inner
                .run(run_id, now)
                .map(|e| e.progress.iter().cloned().collect::<Vec<_>>())
            else {
                return Ok(None);
            };
            let mut out = Vec::with_capacity(ids.len());
            for id in ids {
                let record = match inner.record(run_id, &id, now) {
                    Some(e) => Some(Record::from_json(&e.value.json)?),
                    None => None,
                };
                out.push((id, record));
            }
            Ok(Some(out))
        })
    }

    fn ping(&self) -> StoreFuture<'_, ()> {
        Box::pin(async { Ok(()) })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sealer() -> Arc<Sealer> {
        Arc::new(Sealer::derive(b"the memory store tests' run-token key"))
    }
    use crate::ids::ToolName;
    use crate::store::Budget;
    use serde_json::json;
    use std::time::Duration;

    #[test]
    fn keys_of_one_shard_keep_distinct_tags_and_positions() {
        use std::collections::HashSet;
        let table: Sharded<u64, ()> = Sharded::default();
        let mut tags = vec![HashSet::new(); SHARDS];
        let mut positions = vec![HashSet::new(); SHARDS];
        for key in 0..20_000u64 {
            let At { hash, shard } = table.locate(&key);
            // What the table tags a slot with (the top seven bits) and places it by (low bits).
            tags[shard].insert(hash >> 57);
            positions[shard].insert(hash & 0x3f);
        }
        for shard in 0..SHARDS {
            assert!(
                tags[shard].len() >= 24,
                "shard {shard}: {} tags",
                tags[shard].len()
            );
            assert!(
                positions[shard].len() >= 24,
                "shard {shard}: {} positions",
                positions[shard].len()
            );
        }
    }

    /// Creates run `r`, due 500 ms from `now`, that may take `max_calls` calls.
    async fn create_run(store: &MemoryStore, now: Instant, max_calls: u64) -> RunId {
        let run_id = RunId::parse("r").unwrap();
        let run = NewRun {
            run_id: run_id.clone(),
            created_ms: now,
            deadline_ms: now + 500,
            budget: Budget {
                max_calls,
                max_calls_per_tool: Default::default(),
                max_record_bytes: 1 << 20,
            },
            tools: None,
            paths: Default::default(),
        };
        store.create_run(run).await.unwrap();
        run_id
    }

    /// Reserves a record of tool `t` in run `run_id` for each of `ids`.
    async fn reserve_each(store: &MemoryStore, run_id: &RunId, now: Instant, ids: &[&str]) {
        for id in ids {
            let record = Record::projecting(
                run_id.clone(),
                ToolCallId::parse(id).unwrap(),
                ToolName::parse("t").unwrap(),
                json!({}),
                now,
            );
            store.reserve(&record, now + 1).await.unwrap();
        }
    }

    /// The keys held: the runs and the records.
    fn held(store: &MemoryStore) -> (usize, usize) {
        let inner = store.inner.lock().unwrap();
        (inner.runs.len(), inner.records.len())
    }

    #[tokio::test(start_paused = true)]
    async fn calls_leave_due_keys_to_expiry_which_drops_a_bounded_batch() {
        let store = MemoryStore::new(1_000, sealer());
        let now = clock::now_ms();
        let run_id = create_run(&store, now, 1000).await;
        let ids: Vec<ToolCallId> = (0..200)
            .map(|i| ToolCallId::parse(&format!("c{i}")).unwrap())
            .collect();
        for id in &ids {
            let record = Record::projecting(
                run_id.clone(),
                id.clone(),
                ToolName::parse("t").unwrap(),
                json!({}),
                now,
            );
            store.reserve(&record, now + 1).await.unwrap();
        }
        assert_eq!(held(&store), (1, 200));
        tokio::time::advance(Duration::from_millis(1_001)).await;
        store
            .get_run(&RunId::parse("other").unwrap())
            .await
            .unwrap();
        assert_eq!(
            held(&store),
            (1, 200),
            "a call drops no key it did not ask for"
        );
        let expired = take_due(&store.inner, clock::now_ms(), EXPIRE_PER_BATCH);
        assert_eq!(expired.len(), EXPIRE_PER_BATCH);
        assert_eq!(held(&store), (1, 200 - EXPIRE_PER_BATCH));
        for id in &ids {
            assert!(
                store.get_record(&run_id, id).await.unwrap().is_none(),
                "a due record is never read, dropped or not"
            );
        }
        assert_eq!(held(&store), (1, 0), "a read drops the due key it finds");
        assert_eq!(store.bytes(), RUN_OVERHEAD + 1);
    }

    #[tokio::test(start_paused = true)]
    async fn expired_keys_are_freed_after_the_lock_is_released() {
        let store = MemoryStore::new(1_000, sealer());
        let now = clock::now_ms();
        let run_id = create_run(&store, now, 10).await;
        reserve_each(&store, &run_id, now, &["a", "b", "c"]).await;
        tokio::time::advance(Duration::from_millis(1_001)).await;
        let expired = take_due(&store.inner, clock::now_ms(), EXPIRE_PER_BATCH);
        assert!(store.inner.try_lock().is_ok(), "the lock is free");
        assert_eq!(held(&store), (1, 0), "out of the store");
        let ids: Vec<&str> = expired.records.iter().map(|(k, _)| k.1.as_str()).collect();
        assert_eq!(ids, ["a", "b", "c"], "not yet freed: the caller holds them");
        // The run (TTL 500 + 1000 ms) goes the same way, with its progress list.
        tokio::time::advance(Duration::from_millis(500)).await;
        let expired = take_due(&store.inner, clock::now_ms(), EXPIRE_PER_BATCH);
        assert!(store.inner.try_lock().is_ok());
        assert_eq!(held(&store), (0, 0));
        let ids: Vec<&str> = expired.runs.iter().map(|(id, _)| id.as_str()).collect();
        assert_eq!(ids, ["r"]);
    }

    /// Waits until the store holds `want` (runs, records), for at most 10 s of real time: the
    /// expiry thread reads the test's paused clock but sleeps its ticks on the real one.
    fn wait_until_held(store: &MemoryStore, want: (usize, usize)) {
        for _ in 0..1000 {
            if held(store) == want {
                return;
            }
            // The thread sleeps on the real clock; this test's runtime has nothing else to run.
            #[allow(clippy::disallowed_methods)]
            std::thread::sleep(EXPIRY_TICK);
        }
        panic!("held {:?}, want {want:?}", held(store));
    }

    #[tokio::test(start_paused = true)]
    async fn expired_keys_leave_memory_without_any_operation() {
        let store = MemoryStore::new(1_000, sealer())
            .expire_in_background()
            .unwrap();
        let now = clock::now_ms();
        let run_id = create_run(&store, now, 10).await;
        reserve_each(&store, &run_id, now, &["a", "b", "c"]).await;
        assert_eq!(held(&store), (1, 3));
        // No operation runs while the clock moves past the records' instant; the run (TTL
        // 500 + 1000 ms) is not due yet.
        tokio::time::advance(Duration::from_millis(1_001)).await;
        wait_until_held(&store, (1, 0));
        tokio::time::advance(Duration::from_millis(500)).await;
        wait_until_held(&store, (0, 0));
        assert!(store.lock().expiry.is_empty());
        assert_eq!(store.bytes(), 0, "expired keys give their bytes back");
    }

    #[tokio::test(start_paused = true)]
    async fn the_expiry_thread_works_through_a_backlog_and_ends_with_the_store() {
        let mut store = MemoryStore::new(1_000, sealer())
            .expire_in_background()
            .unwrap();
        let now = clock::now_ms();
        let run_id = create_run(&store, now, 1000).await;
        let ids: Vec<String> = (0..10 * EXPIRE_PER_BATCH)
            .map(|i| format!("c{i}"))
            .collect();
        let ids: Vec<&str> = ids.iter().map(String::as_str).collect();
        reserve_each(&store, &run_id, now, &ids).await;
        tokio::time::advance(Duration::from_millis(1_001)).await;
        wait_until_held(&store, (1, 0));
        let thread = store.expiry_thread.take().unwrap();
        assert!(!thread.is_finished());
        drop(store);
        thread.join().expect("ends once the store is gone");
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_store_fails_closed_and_frees_space_on_expiry() {
        let store = MemoryStore::bounded(1_000, 4_000, sealer());
        let now = clock::now_ms();
        let run_id = create_run(&store, now, 1000).await;
        let record = |id: &str| {
            Record::projecting(
                run_id.clone(),
                ToolCallId::parse(id).unwrap(),
                ToolName::parse("t").unwrap(),
                json!({"pad": "x".repeat(500)}),
                now,
            )
        };
        let mut reserved = 0;
        let err = loop {
            match store
                .reserve(&record(&format!("c{reserved}")), now + 1)
                .await
            {
                Ok(()) => reserved += 1,
                Err(e) => break e,
            }
        };
        assert!(reserved >= 2, "room for a few records, got {reserved}");
        assert_eq!(err.code, Code::StoreUnavailable);
        assert!(err.cause.contains("memory_max_bytes"), "{}", err.cause);
        assert!(store.bytes() <= 4_000, "{}", store.bytes());
        let view = store.get_run(&run_id).await.unwrap().unwrap();
        assert_eq!(
            view.calls_used, reserved,
            "a refused reservation spends nothing"
        );
        for i in 0..reserved {
            let id = ToolCallId::parse(&format!("c{i}")).unwrap();
            assert!(
                store.get_record(&run_id, &id).await.unwrap().is_some(),
                "nothing evicted"
            );
        }
        tokio::time::advance(Duration::from_millis(1_001)).await;
        store
            .reserve(&record("after"), now + 1)
            .await
            .expect("room again once records expired: a full store drops what is due first");
        assert_eq!(held(&store), (1, 1), "only the new record is left");
        assert!(store.bytes() < 2_000, "expired records free their space");
    }
}
