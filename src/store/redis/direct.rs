//! Connections straight to the cluster's primaries, for the two writes of every tool call
//! (reserve, and finalize with `durability: primary`).
//!
//! The cluster client routes every command through a task of its own, which then hands it to
//! the node's connection task: two hops each way. A write whose slot owner is known here goes
//! on that primary's own pipelined connection ([`super::resp`]) and drives it itself: no hop. The
//! slot owners come from `CLUSTER SLOTS`, asked in the background; until they are known, and
//! after any failure on a direct connection, writes go through the cluster client, which
//! follows `MOVED`/`ASK`, waits out a failover and reconnects. So the direct path is only a
//! shortcut: a redirect, a dead node or a timeout there forgets the whole map (and with it the
//! primaries' connections), and the same command is sent once through the cluster client,
//! within the same store timeout. Redis refuses a command on a node that does not own its slot
//! (`MOVED`, `ASK`, `TRYAGAIN`) before running it, so a stale map never makes a write land on
//! the wrong node.
//!
//! The map and its connections are kept per thread ([`PerThread`]): each thread asks for its own
//! at its first write and opens its own connections on its own runtime, so a reply wakes the
//! thread whose call waits for it. A thread that never writes opens none. A failure forgets
//! only that thread's map.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use redis::cluster_async::ClusterConnection;
use redis::cluster_routing::{RoutingInfo, SingleNodeRoutingInfo};
use redis::{ConnectionAddr, IntoConnectionInfo, Value};

use super::resp::{Handshake, Node, Reply};
use crate::workers::PerThread;

/// Redis Cluster's slot count.
const SLOTS: usize = 16384;

/// A map is asked for at most this often, so a cluster in flux (a failover under way, gossip
/// not yet converged) is not asked again on every failed write.
const REFRESH_GAP: Duration = Duration::from_secs(1);

/// The name the direct connections give themselves (`CLIENT SETNAME`), so that `CLIENT LIST`
/// on a node tells them from the cluster client's.
pub const CLIENT_NAME: &str = "toolgate-primary";

/// Marks a slot no known primary serves.
const NO_OWNER: u16 = u16::MAX;

/// The slot of `key`, as Redis Cluster computes it: CRC16 (XMODEM) of the key's hash tag (the
/// text between its first `{` and the next `}`, when that is not empty), else of the whole key,
/// modulo 16384.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let rest = &key[open + 1..];
        let close = rest.iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &rest[..close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS as u16
}

/// The primaries and which slots each owns.
struct SlotMap {
    /// For each slot, an index into `primaries`, or [`NO_OWNER`].
    owners: Box<[u16]>,
    primaries: Vec<Arc<Node>>,
}

/// Direct connections to the primaries, refreshed in the background.
pub struct Primaries {
    /// TLS settings and the commands that open each connection, from the configured nodes.
    /// `None` (a Unix socket, an `#insecure` TLS URL) disables the direct path.
    handshake: Option<Arc<Handshake>>,
    timeout: Duration,
    cluster: ClusterConnection,
    shards: PerThread<Arc<Shard>>,
}

/// One thread's slot map and connections.
#[derive(Default)]
struct Shard {
    map: RwLock<Option<Arc<SlotMap>>>,
    refreshing: AtomicBool,
    last_refresh: Mutex<Option<Instant>>,
}

/// What a direct write came to.
pub enum Outcome {
    /// The script's result code.
    Code(i64),
    /// Not sent, or failed: send it through the cluster client.
    Detour,
}

impl Primaries {
    /// `node` is one configured node URL: its scheme and credentials are used for every
    /// primary. Nothing is asked for yet: each thread asks for its map at its first write.
    pub fn new(node: &str, timeout: Duration, cluster: ClusterConnection) -> Arc<Primaries> {
        let handshake = match handshake(node) {
            Ok(h) => h.map(Arc::new),
            Err(e) => {
                tracing::warn!(cause = %e, "redis-cluster writes go through the cluster client only");
                None
            }
        };
        Arc::new(Primaries {
            handshake,
            timeout,
            cluster,
            shards: PerThread::new(Arc::default),
        })
    }

    /// Runs the command that `pack` writes on the primary that owns `key`'s slot, when the
    /// owner is known; an unknown map is asked for in the background. Any failure (an error
    /// reply, a dead connection, the caller dropping this future) forgets this thread's map,
    /// except `NOSCRIPT`, which only the cluster client's retry (it loads the script) can cure.
    pub async fn write(self: &Arc<Self>, key: &str, pack: impl FnOnce(&mut Vec<u8>)) -> Outcome {
        let shard = self.shards.get();
        let map = shard.map.read().unwrap_or_else(|p| p.into_inner()).clone();
        let Some(map) = map else {
            self.refresh_soon(shard);
            return Outcome::Detour;
        };
        let owner = map.owners[usize::from(slot(key.as_bytes()))];
        let Some(node) = map.primaries.get(usize::from(owner)) else {
            return Outcome::Detour;
        };
        let mut guard = Forget(Some((self, shard)));
        let reply = node.call(pack).await;
        match reply {
            Ok(Reply::Int(code)) => {
                guard.0 = None;
                Outcome::Code(code)
            }
            Ok(Reply::Error(e)) if e.starts_with("NOSCRIPT") => {
                guard.0 = None;
                Outcome::Detour
            }
            Ok(other) => {
                tracing::debug!(reply = ?other, "direct write refused; sent through the cluster client");
                Outcome::Detour
            }
            Err(e) => {
                tracing::debug!(cause = %e, "direct write failed; sent through the cluster client");
                Outcome::Detour
            }
        }
    }

    /// Whether this thread has a slot map in use; when it has none, one is asked for, as a
    /// write would. For tests, which wait for the direct path before they use it.
    pub fn ready(self: &Arc<Self>) -> bool {
        let shard = self.shards.get();
        let ready = shard
            .map
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .is_some();
        if !ready {
            self.refresh_soon(shard);
        }
        ready
    }

    /// Drops a shard's map (its connections close with their last use) and asks for a new one.
    fn forget(self: &Arc<Self>, shard: &Arc<Shard>) {
        *shard.map.write().unwrap_or_else(|p| p.into_inner()) = None;
        self.refresh_soon(shard);
    }

    /// Starts one background refresh of a shard's map, on this thread's runtime, unless one
    /// is under way; it waits out [`REFRESH_GAP`] since that shard's last one.
    fn refresh_soon(self: &Arc<Self>, shard: &Arc<Shard>) {
        if self.handshake.is_none() || shard.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let (primaries, shard) = (self.clone(), shard.clone());
        tokio::spawn(async move {
            let last = *shard.last_refresh.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(wait) = last.and_then(|at| REFRESH_GAP.checked_sub(at.elapsed())) {
                tokio::time::sleep(wait).await;
            }
            *shard.last_refresh.lock().unwrap_or_else(|p| p.into_inner()) = Some(Instant::now());
            match tokio::time::timeout(primaries.timeout * 2, primaries.fetch()).await {
                Ok(Ok(map)) => {
                    *shard.map.write().unwrap_or_else(|p| p.into_inner()) = Some(Arc::new(map))
                }
                Ok(Err(e)) => tracing::debug!(cause = %e, "redis-cluster slot map not refreshed"),
                Err(_) => tracing::debug!("redis-cluster slot map not refreshed in time"),
            }
            shard.refreshing.store(false, Ordering::Release);
        });
    }

    /// Asks a node for the slot owners and opens one connection to each primary. A primary
    /// that cannot be reached now leaves its slots to the cluster client.
    async fn fetch(&self) -> redis::RedisResult<SlotMap> {
        let Some(handshake) = &self.handshake else {
            return Err(redis::RedisError::from((
                redis::ErrorKind::Client,
                "no direct path for this address",
            )));
        };
        let mut cluster = self.cluster.clone();
        let reply = cluster
            .route_command(
                redis::cmd("CLUSTER").arg("SLOTS").clone(),
                RoutingInfo::SingleNode(SingleNodeRoutingInfo::Random),
            )
            .await?;
        let ranges = parse_slots(&reply).ok_or_else(|| {
            redis::RedisError::from((redis::ErrorKind::Parse, "unexpected CLUSTER SLOTS reply"))
        })?;
        let mut owners = vec![NO_OWNER; SLOTS].into_boxed_slice();
        let mut addresses: Vec<(String, u16)> = Vec::new();
        let mut primaries = Vec::new();
        for (start, end, host, port) in ranges {
            let index = match addresses.iter().position(|(h, p)| *h == host && *p == port) {
                Some(i) => Some(i),
                None => match Node::connect(&host, port, handshake).await {
                    Ok(node) => {
                        addresses.push((host, port));
                        primaries.push(Arc::new(node));
                        Some(primaries.len() - 1)
                    }
                    Err(e) => {
                        tracing::debug!(cause = %e, "redis-cluster primary not reached directly");
                        None
                    }
                },
            };
            if let Some(index) = index.and_then(|i| u16::try_from(i).ok()) {
                for owner in &mut owners[usize::from(start)..=usize::from(end)] {
                    *owner = index;
                }
            }
        }
        Ok(SlotMap { owners, primaries })
    }
}

/// Forgets a shard's map when dropped holding it: a direct write that failed, or was cut off.
struct Forget<'a>(Option<(&'a Arc<Primaries>, &'a Arc<Shard>)>);

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        if let Some((primaries, shard)) = self.0 {
            primaries.forget(shard);
        }
    }
}

/// How to open a direct connection, from one configured node URL: TLS for `rediss://`
/// (verified against the system's certificate store, as the cluster client does), then `AUTH`
/// with the URL's credentials and `CLIENT SETNAME`. `None` when the URL is not one the direct
/// path serves: a Unix socket, or TLS marked `#insecure`.
fn handshake(node: &str) -> Result<Option<Handshake>, String> {
    let info = node.into_connection_info().map_err(|e| e.to_string())?;
    let tls = match info.addr() {
        ConnectionAddr::Tcp(..) => None,
        ConnectionAddr::TcpTls {
            insecure: false, ..
        } => Some(tls_connector()?),
        _ => return Ok(None),
    };
    let settings = info.redis_settings();
    let mut commands = Vec::new();
    let mut replies = 1;
    if let Some(password) = settings.password() {
        let mut auth = redis::cmd("AUTH");
        if let Some(user) = settings.username() {
            auth.arg(user);
        }
        auth.arg(password).write_packed_command(&mut commands);
        replies += 1;
    }
    redis::cmd("CLIENT")
        .arg("SETNAME")
        .arg(CLIENT_NAME)
        .write_packed_command(&mut commands);
    Ok(Some(Handshake {
        tls,
        commands,
        replies,
    }))
}

fn tls_connector() -> Result<tokio_rustls::TlsConnector, String> {
    let mut roots = rustls::RootCertStore::empty();
    let native = rustls_native_certs::load_native_certs();
    if let Some(e) = native.errors.first() {
        return Err(format!("system certificates: {e}"));
    }
    roots.add_parsable_certificates(native.certs);
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .map_err(|e| format!("TLS setup failed: {e}"))?
    .with_root_certificates(roots)
    .with_no_client_auth();
    Ok(tokio_rustls::TlsConnector::from(Arc::new(config)))
}

/// The `(first slot, last slot, primary host, primary port)` ranges of a `CLUSTER SLOTS`
/// reply. A range whose primary has no usable address (an empty host or `?`) is left out.
fn parse_slots(reply: &Value) -> Option<Vec<(u16, u16, String, u16)>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut out = Vec::with_capacity(ranges.len());
    for range in ranges {
        let Value::Array(fields) = range else {
            return None;
        };
        let [
            Value::Int(start),
            Value::Int(end),
            Value::Array(primary),
            ..,
        ] = fields.as_slice()
        else {
            return None;
        };
        let [host, Value::Int(port), ..] = primary.as_slice() else {
            return None;
        };
        let host = match host {
            Value::BulkString(b) => String::from_utf8(b.clone()).ok()?,
            Value::SimpleString(s) => s.clone(),
            _ => return None,
        };
        let start = u16::try_from(*start)
            .ok()
            .filter(|&s| usize::from(s) < SLOTS)?;
        let end = u16::try_from(*end)
            .ok()
            .filter(|&e| usize::from(e) < SLOTS && e >= start)?;
        let port = u16::try_from(*port).ok()?;
        if host.is_empty() || host == "?" {
            continue;
        }
        out.push((start, end, host, port));
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_the_ones_redis_computes() {
        // Redis Cluster's own examples and test vectors (cluster spec, `CLUSTER KEYSLOT`).
        assert_eq!(
            crc16::State::<crc16::XMODEM>::calculate(b"123456789"),
            0x31C3
        );
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"bar"), 5061);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"{user1000}.followers"), slot(b"user1000"));
        // An empty tag hashes the whole key; only the first `{` counts.
        assert_eq!(slot(b"foo{}{bar}"), crc16_whole(b"foo{}{bar}"));
        assert_eq!(slot(b"foo{{bar}}zap"), slot(b"{bar"));
        assert_eq!(slot(b"foo{bar}{zap}"), slot(b"bar"));
        assert_eq!(slot(b"toolgate:{run-1}:run"), slot(b"run-1"));
    }

    fn crc16_whole(key: &[u8]) -> u16 {
        crc16::State::<crc16::XMODEM>::calculate(key) % SLOTS as u16
    }

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn slot_ranges_are_read_from_the_reply() {
        let reply = Value::Array(vec![
            Value::Array(vec![
                Value::Int(0),
                Value::Int(5460),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7000), bulk("id0")]),
                Value::Array(vec![bulk("127.0.0.1"), Value::Int(7003), bulk("id3")]),
            ]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(10922),
                Value::Array(vec![bulk("?"), Value::Int(7001)]),
            ]),
        ]);
        assert_eq!(
            parse_slots(&reply),
            Some(vec![(0, 5460, "127.0.0.1".to_string(), 7000)])
        );
        let bad_range = Value::Array(vec![Value::Array(vec![
            Value::Int(9),
            Value::Int(3),
            Value::Array(vec![bulk("h"), Value::Int(1)]),
        ])]);
        assert_eq!(parse_slots(&bad_range), None);
        let past_the_end = Value::Array(vec![Value::Array(vec![
            Value::Int(0),
            Value::Int(16384),
            Value::Array(vec![bulk("h"), Value::Int(1)]),
        ])]);
        assert_eq!(parse_slots(&past_the_end), None);
        assert_eq!(parse_slots(&Value::Nil), None);
    }

    #[test]
    fn the_handshake_carries_the_urls_credentials() {
        let packed = |args: &[&str]| {
            let mut cmd = redis::Cmd::new();
            for a in args {
                cmd.arg(*a);
            }
            cmd.get_packed_command()
        };
        let setname = packed(&["CLIENT", "SETNAME", CLIENT_NAME]);
        let h = handshake("redis://user:secret@10.0.0.1:6379")
            .unwrap()
            .unwrap();
        assert!(h.tls.is_none());
        assert_eq!(h.replies, 2);
        assert_eq!(
            h.commands,
            [packed(&["AUTH", "user", "secret"]), setname.clone()].concat()
        );
        let h = handshake("redis://:secret@10.0.0.1:6379").unwrap().unwrap();
        assert_eq!(
            h.commands,
            [packed(&["AUTH", "secret"]), setname.clone()].concat()
        );
        let h = handshake("redis://10.0.0.1:6379").unwrap().unwrap();
        assert_eq!((h.commands, h.replies), (setname, 1));
        assert!(handshake("rediss://h:6380").unwrap().unwrap().tls.is_some());
        assert!(handshake("rediss://h:6380/#insecure").unwrap().is_none());
        assert!(handshake("not a url").is_err());
    }
}
