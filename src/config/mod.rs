//! The config file: raw serde structs (unknown keys refused) → `validate()` → [`Config`], every
//! error naming its key. [`watch`] swaps the hot-reloadable [`Policy`] (tools, limits, runs).
//! Every key, default and reload rule is listed in `docs/configuration.md`.

pub mod watch;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use serde::Deserialize;
use serde_json::Value;

use crate::error::Role;
use crate::ids::ToolName;

pub use watch::Reload;

/// A config that failed to load or validate. The message names the offending key.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ConfigError(pub String);

fn bad(key: &str, why: impl std::fmt::Display) -> ConfigError {
    ConfigError(format!("{key}: {why}"))
}

// ---------------------------------------------------------------------------------------------
// Raw file shape.

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConfig {
    #[serde(default)]
    listen: RawListen,
    #[serde(default)]
    admin: RawAdmin,
    #[serde(default)]
    store: RawStore,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    runs: RawRuns,
    #[serde(default)]
    tools: Vec<RawTool>,
    #[serde(default)]
    paths: RawPaths,
    otel: Option<RawOtel>,
    #[serde(default)]
    evidence: RawEvidence,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawEvidence {
    signing_key_file: Option<PathBuf>,
    #[serde(default)]
    previous_public_keys: Vec<PathBuf>,
    issuer: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawOtel {
    endpoint: Option<String>,
    service_name: Option<String>,
    sample_ratio: Option<f64>,
    headers_file: Option<PathBuf>,
    max_queue_spans: Option<u64>,
    timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawPaths {
    workspace: Option<String>,
    home: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawNetwork {
    allow_hosts: Option<Vec<String>>,
    deny_private: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawListen {
    agent: Option<String>,
    admin: Option<String>,
    telemetry: Option<String>,
    #[serde(default)]
    max_connections: RawConnections,
    idle_timeout_ms: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawConnections {
    agent: Option<u64>,
    admin: Option<u64>,
    telemetry: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawAdmin {
    token_file: Option<PathBuf>,
    token_key_file: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawStore {
    kind: Option<String>,
    nodes: Option<Vec<String>>,
    key_prefix: Option<String>,
    record_ttl_ms: Option<u64>,
    durability: Option<String>,
    timeout_ms: Option<u64>,
    memory_max_bytes: Option<u64>,
}

#[derive(Debug, Default, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawLimits {
    request_bytes: Option<u64>,
    raw_bytes: Option<u64>,
    agent_bytes: Option<u64>,
    record_bytes: Option<u64>,
    json_depth: Option<u64>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawRuns {
    default_timeout_ms: Option<u64>,
    max_timeout_ms: Option<u64>,
    default_max_calls: Option<u64>,
    default_max_record_bytes: Option<u64>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTool {
    name: String,
    upstream: String,
    #[serde(default)]
    read_only: bool,
    timeout_ms: Option<u64>,
    input_schema: Option<Value>,
    #[serde(default)]
    limits: RawLimits,
    #[serde(default)]
    projection: RawProjection,
    description: Option<String>,
    upstream_token_file: Option<PathBuf>,
    protocol: Option<String>,
    remote_name: Option<String>,
    params: Option<std::collections::BTreeMap<String, String>>,
    read_roots: Option<Vec<String>>,
    network: Option<RawNetwork>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct RawProjection {
    select: Option<String>,
    max_items: Option<usize>,
    fields: Option<Vec<String>>,
}

// ---------------------------------------------------------------------------------------------
// Validated config.

/// The whole validated config.
#[derive(Debug, Clone)]
pub struct Config {
    pub listen: ListenConfig,
    pub admin: AdminConfig,
    pub store: StoreConfig,
    pub policy: Arc<Policy>,
    /// `None`: no `otel` key (or `OTEL_SDK_DISABLED=true`), so no tracing at all.
    pub otel: Option<OtelConfig>,
    pub evidence: EvidenceConfig,
}

/// `evidence`: the files of the key that signs bundles, and the statements' issuer. The files
/// are read and checked by `evidence::KeyFiles::load`, not here.
#[derive(Debug, Clone, PartialEq)]
pub struct EvidenceConfig {
    /// `TOOLGATE_EVIDENCE_KEY_FILE`, else `evidence.signing_key_file`; `None`: the key is
    /// derived from the run-token key.
    pub signing_key_file: Option<PathBuf>,
    pub previous_public_keys: Vec<PathBuf>,
    pub issuer: String,
}

impl Default for EvidenceConfig {
    fn default() -> EvidenceConfig {
        EvidenceConfig {
            signing_key_file: None,
            previous_public_keys: Vec::new(),
            issuer: "toolgate".into(),
        }
    }
}

/// `otel`: where and how the spans of tool calls are exported (OTLP/HTTP protobuf).
#[derive(Clone, PartialEq)]
pub struct OtelConfig {
    /// The full URL spans are POSTed to (`…/v1/traces`).
    pub traces_url: hyper::Uri,
    pub service_name: String,
    /// The share of new traces recorded; a call with a `traceparent` follows its sampled flag.
    pub sample_ratio: f64,
    /// Extra request headers from `headers_file` (credentials: never logged).
    pub headers: Vec<(String, String)>,
    /// Spans waiting for export; past it, a finished span is dropped and counted.
    pub max_queue_spans: usize,
    /// The bound on one export request.
    pub timeout: Duration,
}

impl std::fmt::Debug for OtelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let names: Vec<&str> = self.headers.iter().map(|(n, _)| n.as_str()).collect();
        f.debug_struct("OtelConfig")
            .field("traces_url", &self.traces_url)
            .field("service_name", &self.service_name)
            .field("sample_ratio", &self.sample_ratio)
            .field("headers", &names)
            .field("max_queue_spans", &self.max_queue_spans)
            .field("timeout", &self.timeout)
            .finish()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenConfig {
    pub agent: SocketAddr,
    pub admin: SocketAddr,
    pub telemetry: SocketAddr,
    /// Open connections each listener serves at once. At the cap the longest-idle connection is
    /// closed to admit a new one; only when every connection has a request in progress is a new
    /// one refused (`OVERLOADED`).
    pub max_connections: MaxConnections,
    /// `listen.idle_timeout_ms`: a connection with no request in progress for this long is
    /// closed, on every listener.
    pub idle_timeout: Duration,
}

/// The default of `listen.idle_timeout_ms`: a minute, longer than HTTP clients keep an idle
/// connection in their pools (Python's `httpx` 5 s, Node's `undici` 4 s).
pub const DEFAULT_IDLE_TIMEOUT_MS: u64 = 60_000;

/// `listen.max_connections`. The defaults keep the sidecar's connection memory a small part of
/// the 64 MiB the injector gives it (an idle connection costs a few KiB; see docs/behaviour.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MaxConnections {
    pub agent: usize,
    pub admin: usize,
    pub telemetry: usize,
}

impl Default for MaxConnections {
    fn default() -> MaxConnections {
        MaxConnections {
            agent: 512,
            admin: 128,
            telemetry: 32,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct AdminConfig {
    pub token_file: Option<PathBuf>,
    pub token_key_file: Option<PathBuf>,
}

/// `store.kind`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StoreKind {
    Memory,
    RedisCluster,
}

/// `store.durability`: what a READY answer waits for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Durability {
    /// The primary wrote the record.
    Primary,
    /// A replica also acknowledged it (`WAIT 1`).
    Replica,
}

/// A closed set of config words: the one table of each variant's spelling, and the key named
/// when a value is not one of them.
trait Words: Sized + Copy + 'static {
    const KEY: &'static str;
    const WORDS: &'static [(&'static str, Self)];

    /// The variant spelled `word`; `None` (the key absent) gives `default`.
    fn from_word(word: Option<&str>, default: Self) -> Result<Self, ConfigError> {
        let Some(word) = word else {
            return Ok(default);
        };
        Self::WORDS
            .iter()
            .find(|(w, _)| *w == word)
            .map(|(_, v)| *v)
            .ok_or_else(|| {
                let names: Vec<&str> = Self::WORDS.iter().map(|(w, _)| *w).collect();
                bad(
                    Self::KEY,
                    format!("{word:?} is not one of {}", names.join(", ")),
                )
            })
    }
}

impl Words for StoreKind {
    const KEY: &'static str = "store.kind";
    const WORDS: &'static [(&'static str, StoreKind)] = &[
        ("memory", StoreKind::Memory),
        ("redis-cluster", StoreKind::RedisCluster),
    ];
}

impl Words for Durability {
    const KEY: &'static str = "store.durability";
    const WORDS: &'static [(&'static str, Durability)] = &[
        ("primary", Durability::Primary),
        ("replica", Durability::Replica),
    ];
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoreConfig {
    pub kind: StoreKind,
    pub nodes: Vec<String>,
    pub key_prefix: String,
    pub record_ttl_ms: u64,
    pub durability: Durability,
    pub timeout: Duration,
    /// The memory store's bound: a reservation past it fails closed (`STORE_UNAVAILABLE`).
    pub memory_max_bytes: u64,
}

/// `store.memory_max_bytes` by default: 128 MiB.
pub const DEFAULT_MEMORY_MAX_BYTES: u64 = 128 << 20;

/// Byte limits; each may be overridden per tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub request_bytes: u64,
    pub raw_bytes: u64,
    pub agent_bytes: u64,
    pub record_bytes: u64,
    /// The deepest nesting of arrays and objects accepted in the agent's input and in a raw
    /// response. A record nests them two levels deeper, so with at most [`MAX_JSON_DEPTH`] every
    /// record written stays readable.
    pub json_depth: usize,
}

/// The largest `json_depth` accepted: records nest the input and the raw response two levels
/// deeper, well within the 128 levels every reader parses.
pub const MAX_JSON_DEPTH: u64 = 100;

/// Defaults and bounds for new runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RunDefaults {
    pub default_timeout_ms: u64,
    pub max_timeout_ms: u64,
    pub default_max_calls: u64,
    pub default_max_record_bytes: u64,
}

/// The declarative projection of a tool: `select`, `max_items`, `fields`.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Projection {
    /// JSON Pointer into the raw document; empty selects the whole document.
    pub select: String,
    /// Arrays keep their first N items.
    pub max_items: Option<usize>,
    /// Objects keep only these keys.
    pub fields: Option<Vec<String>>,
}

impl Projection {
    /// `select` with `max_items` as the [`crate::compact::Select`] of the compacting pass;
    /// `None` when `select` is not a JSON Pointer.
    pub fn plan(&self) -> Option<crate::compact::Select> {
        crate::compact::Select::new(&self.select, self.max_items.unwrap_or(usize::MAX))
    }
}

/// `protocol`: how a tool's upstream is spoken to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Protocol {
    /// `POST` of the input object; the body is the raw response.
    Http,
    /// An MCP server (Streamable HTTP): a JSON-RPC `tools/call` of `remote_name`.
    Mcp { remote_name: String },
}

/// One declared argument role: where in the input (a JSON Pointer whose `*` segments match
/// every element of an array) and what it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The pointer as written, for logs.
    pub pointer: String,
    pub segments: Vec<Segment>,
    pub role: Role,
}

/// One segment of a [`Param`] pointer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Segment {
    Key(String),
    /// `*`: every element of an array.
    Each,
}

/// What a tool's `network_target` arguments may reach.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Network {
    /// Hosts exempt from the address rule (the list restricts nothing).
    pub allow_hosts: Vec<HostPattern>,
    /// Refuse hosts that are, or resolve to, loopback, private, link-local and the like.
    pub deny_private: bool,
}

impl Default for Network {
    fn default() -> Network {
        Network {
            allow_hosts: Vec::new(),
            deny_private: true,
        }
    }
}

/// An `allow_hosts` entry: lowercase, trailing dot dropped.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostPattern {
    Exact(String),
    /// `*.example.com`, kept as `.example.com`: every subdomain, not the domain itself.
    Subdomains(String),
}

impl HostPattern {
    /// Whether `host` (as the URL parser serialized it) matches.
    pub fn matches(&self, host: &str) -> bool {
        let host = host.trim_end_matches('.').to_ascii_lowercase();
        match self {
            HostPattern::Exact(h) => host == *h,
            HostPattern::Subdomains(suffix) => host.len() > suffix.len() && host.ends_with(suffix),
        }
    }
}

/// The `workspace` and `home` a run's paths are judged against.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunPaths {
    pub workspace: String,
    pub home: String,
}

impl Default for RunPaths {
    fn default() -> RunPaths {
        RunPaths {
            workspace: "/workspace".into(),
            home: "/home/agent".into(),
        }
    }
}

/// A run's `workspace` or `home`: absolute, normalized, and not `/`.
pub fn run_path(value: &str) -> Option<String> {
    if !value.starts_with('/') || value.contains('\0') {
        return None;
    }
    let path = crate::paths::normalize(value);
    (path != "/").then_some(path)
}

/// One configured tool, with its schema compiled and its limits resolved.
pub struct Tool {
    pub name: ToolName,
    pub upstream: hyper::Uri,
    /// The `Host` header of every request to `upstream`, made once at load: the host, and the
    /// port when it is not the scheme's default.
    pub upstream_host: hyper::header::HeaderValue,
    pub protocol: Protocol,
    pub read_only: bool,
    pub timeout: Duration,
    /// The `input_schema` as written, shown to MCP clients.
    pub input_schema: Option<Value>,
    pub schema: Option<jsonschema::Validator>,
    pub limits: Limits,
    pub projection: Projection,
    /// `projection` as the compacting pass resolves it, made once at load.
    pub select: crate::compact::Select,
    /// Shown in MCP `tools/list`.
    pub description: String,
    /// `Authorization: Bearer <upstream_token_file>`, sent to this tool's upstream only. Marked
    /// sensitive, and left out of `Debug`, so it is never logged.
    pub upstream_auth: Option<hyper::header::HeaderValue>,
    /// Where that token is read from (watched for rotation; the path is not secret).
    pub upstream_token_file: Option<PathBuf>,
    /// Argument roles, checked at preflight step 9b.
    pub params: Vec<Param>,
    /// Absolute, normalized roots a path may also be in, besides the run's workspace.
    pub read_roots: Vec<String>,
    pub network: Network,
}

impl std::fmt::Debug for Tool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tool")
            .field("name", &self.name)
            .field("protocol", &self.protocol)
            .field("read_only", &self.read_only)
            .finish_non_exhaustive()
    }
}

/// The hot-reloadable part of the config: replaced as a whole, never edited in place.
#[derive(Debug)]
pub struct Policy {
    pub limits: Limits,
    pub runs: RunDefaults,
    pub tools: HashMap<ToolName, Arc<Tool>>,
    /// The read cap for a request body whose tool is not known yet: the largest limit + 1.
    pub max_request_bytes: u64,
    /// Defaults for runs created while this policy is live.
    pub paths: RunPaths,
}

impl Policy {
    pub fn tool(&self, name: &str) -> Option<&Arc<Tool>> {
        self.tools.get(name)
    }
}

const DEFAULT_LIMITS: Limits = Limits {
    request_bytes: 65_536,
    raw_bytes: 1_048_576,
    agent_bytes: 16_384,
    record_bytes: 1_179_648,
    json_depth: 64,
};

/// The largest config file toolgate reads.
pub const MAX_CONFIG_FILE_BYTES: u64 = 1 << 20;
/// The largest token or key file toolgate reads (admin token, run-token key, upstream tokens).
pub const MAX_SECRET_FILE_BYTES: u64 = 64 << 10;

/// Reads a whole file of at most `max` bytes, reading no further than `max + 1`: a file that is
/// larger (or a device that never ends) is an error, never a large allocation. The message
/// names the file, never its content.
pub fn read_file(path: &Path, max: u64) -> Result<Vec<u8>, String> {
    use std::io::Read;
    let cannot = |e: std::io::Error| format!("cannot read {}: {e}", path.display());
    let file = std::fs::File::open(path).map_err(cannot)?;
    let mut bytes = Vec::new();
    file.take(max + 1).read_to_end(&mut bytes).map_err(cannot)?;
    if bytes.len() as u64 > max {
        return Err(format!("{} is larger than {max} bytes", path.display()));
    }
    Ok(bytes)
}

/// [`read_file`] for a text file.
pub fn read_text_file(path: &Path, max: u64) -> Result<String, String> {
    String::from_utf8(read_file(path, max)?)
        .map_err(|_| format!("{} is not valid UTF-8", path.display()))
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = read_text_file(path, MAX_CONFIG_FILE_BYTES).map_err(ConfigError)?;
        Config::parse(&text)
    }

    /// Parses and validates config text.
    pub fn parse(text: &str) -> Result<Config, ConfigError> {
        Config::parse_env(text, &|name: &str| std::env::var(name).ok())
    }

    /// [`Config::parse`] with `env` in place of the process environment.
    fn parse_env(text: &str, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        raw_config(text)?.validate(env)
    }

    /// Whether a reload from `self` to `next` is allowed: listeners, admin, store, otel and
    /// evidence need a restart.
    pub fn restart_needed(&self, next: &Config) -> Option<&'static str> {
        if self.listen != next.listen {
            Some("listen")
        } else if self.admin != next.admin {
            Some("admin")
        } else if self.store != next.store {
            Some("store")
        } else if self.otel != next.otel {
            Some("otel")
        } else if self.evidence != next.evidence {
            Some("evidence")
        } else {
            None
        }
    }
}

/// The listeners' default ports (the injector puts the same ones on the sidecar container).
pub const AGENT_PORT: u16 = 15001;
pub const ADMIN_PORT: u16 = 15002;
pub const TELEMETRY_PORT: u16 = 15090;

/// The file's YAML as [`RawConfig`], with exact scalar types (YAML 1.2): the document is read
/// into a tree first, where a quoted scalar stays a string and only `true`/`false` (any case)
/// are booleans, and the tree is then taken as the config, so a string where a boolean or a
/// number is expected is a type error, named by its key (`tools[0].read_only: …`).
fn raw_config(text: &str) -> Result<RawConfig, ConfigError> {
    let tree = if text.trim().is_empty() {
        Value::Object(serde_json::Map::new())
    } else {
        let mut options = serde_saphyr::Options::default();
        options.strict_booleans = true;
        serde_saphyr::from_str_with_options::<Value>(text, options)
            .map_err(|e| ConfigError(e.to_string()))?
    };
    serde_path_to_error::deserialize(tree).map_err(|e| {
        let path = e.path().to_string();
        let inner = e.into_inner();
        match path.as_str() {
            "." => ConfigError(inner.to_string()),
            _ => ConfigError(format!("{path}: {inner}")),
        }
    })
}

fn addr(key: &str, v: Option<String>, default: SocketAddr) -> Result<SocketAddr, ConfigError> {
    let Some(s) = v else {
        return Ok(default);
    };
    s.parse()
        .map_err(|_| bad(key, format!("{s:?} is not an IP:port address")))
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

fn positive(key: &str, v: Option<u64>, default: u64) -> Result<u64, ConfigError> {
    match v.unwrap_or(default) {
        0 => Err(bad(key, "must be greater than 0")),
        n => Ok(n),
    }
}

impl RawLimits {
    fn resolve(&self, prefix: &str, base: &Limits) -> Result<Limits, ConfigError> {
        Ok(Limits {
            request_bytes: positive(
                &format!("{prefix}.request_bytes"),
                self.request_bytes,
                base.request_bytes,
            )?,
            raw_bytes: positive(
                &format!("{prefix}.raw_bytes"),
                self.raw_bytes,
                base.raw_bytes,
            )?,
            agent_bytes: positive(
                &format!("{prefix}.agent_bytes"),
                self.agent_bytes,
                base.agent_bytes,
            )?,
            record_bytes: positive(
                &format!("{prefix}.record_bytes"),
                self.record_bytes,
                base.record_bytes,
            )?,
            json_depth: match self.json_depth {
                None => base.json_depth,
                Some(d @ 1..=MAX_JSON_DEPTH) => d as usize,
                Some(_) => {
                    return Err(bad(
                        &format!("{prefix}.json_depth"),
                        format!("must be between 1 and {MAX_JSON_DEPTH}"),
                    ));
                }
            },
        })
    }
}

impl RawConfig {
    /// `env` reads an environment variable (the `OTEL_*` ones `otel` honours).
    fn validate(self, env: &dyn Fn(&str) -> Option<String>) -> Result<Config, ConfigError> {
        let listen = ListenConfig {
            agent: addr("listen.agent", self.listen.agent, loopback(AGENT_PORT))?,
            admin: addr("listen.admin", self.listen.admin, loopback(ADMIN_PORT))?,
            telemetry: addr(
                "listen.telemetry",
                self.listen.telemetry,
                SocketAddr::from(([0, 0, 0, 0], TELEMETRY_PORT)),
            )?,
            max_connections: {
                let d = MaxConnections::default();
                let m = &self.listen.max_connections;
                MaxConnections {
                    agent: positive("listen.max_connections.agent", m.agent, d.agent as u64)?
                        as usize,
                    admin: positive("listen.max_connections.admin", m.admin, d.admin as u64)?
                        as usize,
                    telemetry: positive(
                        "listen.max_connections.telemetry",
                        m.telemetry,
                        d.telemetry as u64,
                    )? as usize,
                }
            },
            idle_timeout: Duration::from_millis(positive(
                "listen.idle_timeout_ms",
                self.listen.idle_timeout_ms,
                DEFAULT_IDLE_TIMEOUT_MS,
            )?),
        };
        let admin = AdminConfig {
            token_file: self.admin.token_file,
            token_key_file: self.admin.token_key_file,
        };
        let store = self.store.validate()?;
        let limits = self.limits.resolve("limits", &DEFAULT_LIMITS)?;
        let runs = RunDefaults {
            default_timeout_ms: positive(
                "runs.default_timeout_ms",
                self.runs.default_timeout_ms,
                600_000,
            )?,
            max_timeout_ms: positive("runs.max_timeout_ms", self.runs.max_timeout_ms, 86_400_000)?,
            default_max_calls: self.runs.default_max_calls.unwrap_or(100),
            default_max_record_bytes: positive(
                "runs.default_max_record_bytes",
                self.runs.default_max_record_bytes,
                8_388_608,
            )?,
        };
        if runs.default_timeout_ms > runs.max_timeout_ms {
            return Err(bad(
                "runs.default_timeout_ms",
                "must not exceed runs.max_timeout_ms",
            ));
        }
        let mut tools = HashMap::new();
        let mut max_request_bytes = limits.request_bytes;
        for (i, raw) in self.tools.into_iter().enumerate() {
            let tool = raw.validate(i, &limits)?;
            max_request_bytes = max_request_bytes.max(tool.limits.request_bytes);
            if tools.contains_key(&tool.name) {
                return Err(bad(&format!("tools[{i}].name"), "duplicate tool name"));
            }
            tools.insert(tool.name.clone(), Arc::new(tool));
        }
        let otel = match self.otel {
            None => None,
            Some(raw) => raw.validate(env)?,
        };
        let evidence = EvidenceConfig {
            signing_key_file: env("TOOLGATE_EVIDENCE_KEY_FILE")
                .filter(|v| !v.is_empty())
                .map(PathBuf::from)
                .or(self.evidence.signing_key_file),
            previous_public_keys: self.evidence.previous_public_keys,
            issuer: match self.evidence.issuer {
                None => EvidenceConfig::default().issuer,
                Some(i) if i.trim().is_empty() || i.chars().any(char::is_control) => {
                    return Err(bad("evidence.issuer", "must be a non-empty line of text"));
                }
                Some(i) => i,
            },
        };
        Ok(Config {
            listen,
            admin,
            store,
            otel,
            evidence,
            policy: Arc::new(Policy {
                limits,
                runs,
                tools,
                max_request_bytes,
                paths: self.paths.validate()?,
            }),
        })
    }
}

/// The path OTLP/HTTP receivers take traces on.
const TRACES_PATH: &str = "/v1/traces";

impl RawOtel {
    /// Each setting: the config key, else its standard `OTEL_*` variable, else the OTLP default.
    fn validate(
        self,
        env: &dyn Fn(&str) -> Option<String>,
    ) -> Result<Option<OtelConfig>, ConfigError> {
        const DISABLED: &str = "OTEL_SDK_DISABLED";
        if env(DISABLED).is_some_and(|v| v.trim().eq_ignore_ascii_case("true")) {
            return Ok(None);
        }
        let (key, endpoint) = match (self.endpoint, env("OTEL_EXPORTER_OTLP_ENDPOINT")) {
            (Some(e), _) => ("otel.endpoint", e),
            (None, Some(e)) if !e.trim().is_empty() => ("OTEL_EXPORTER_OTLP_ENDPOINT", e),
            (None, _) => ("otel.endpoint", "http://localhost:4318".to_string()),
        };
        let traces_url = traces_url(endpoint.trim()).ok_or_else(|| {
            bad(
                key,
                format!("{endpoint:?} is not an http:// or https:// URL"),
            )
        })?;
        let (key, service_name) = match (self.service_name, env("OTEL_SERVICE_NAME")) {
            (Some(n), _) => ("otel.service_name", n),
            (None, Some(n)) => ("OTEL_SERVICE_NAME", n),
            (None, None) => ("otel.service_name", "toolgate".to_string()),
        };
        if service_name.trim().is_empty() {
            return Err(bad(key, "must not be empty"));
        }
        let (key, sample_ratio) = match (self.sample_ratio, env("OTEL_TRACES_SAMPLER_ARG")) {
            (Some(r), _) => ("otel.sample_ratio", r),
            (None, Some(arg)) => (
                "OTEL_TRACES_SAMPLER_ARG",
                arg.trim()
                    .parse::<f64>()
                    .map_err(|_| bad("OTEL_TRACES_SAMPLER_ARG", "is not a number"))?,
            ),
            (None, None) => ("otel.sample_ratio", 1.0),
        };
        if !(0.0..=1.0).contains(&sample_ratio) {
            return Err(bad(key, "must be between 0 and 1"));
        }
        let headers = match &self.headers_file {
            None => Vec::new(),
            Some(path) => otlp_headers("otel.headers_file", path)?,
        };
        Ok(Some(OtelConfig {
            traces_url,
            service_name: service_name.trim().to_string(),
            sample_ratio,
            headers,
            max_queue_spans: positive("otel.max_queue_spans", self.max_queue_spans, 2048)? as usize,
            timeout: Duration::from_millis(positive("otel.timeout_ms", self.timeout_ms, 10_000)?),
        }))
    }
}

/// A collector's OTLP/HTTP base URL with `/v1/traces` appended, unless it already ends so.
fn traces_url(endpoint: &str) -> Option<hyper::Uri> {
    let base: hyper::Uri = endpoint.parse().ok()?;
    match (base.scheme_str(), base.host()) {
        (Some("http" | "https"), Some(_)) => {}
        _ => return None,
    }
    if base.path().ends_with(TRACES_PATH) {
        return Some(base);
    }
    let trimmed = endpoint.trim_end_matches('/');
    format!("{trimmed}{TRACES_PATH}").parse().ok()
}

/// `otel.headers_file`: one `Name: value` header a line; blank lines and `#` comments skipped.
/// Messages name the file and the line, never a value.
fn otlp_headers(key: &str, path: &Path) -> Result<Vec<(String, String)>, ConfigError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| bad(key, format!("cannot read {}: {e}", path.display())))?;
    let mut headers = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let parsed = line.split_once(':').and_then(|(name, value)| {
            let name = hyper::header::HeaderName::from_bytes(name.trim().as_bytes()).ok()?;
            let value = value.trim();
            hyper::header::HeaderValue::from_str(value).ok()?;
            Some((name.as_str().to_string(), value.to_string()))
        });
        match parsed {
            Some(header) => headers.push(header),
            None => {
                return Err(bad(
                    key,
                    format!(
                        "{} line {} is not a `Name: value` header",
                        path.display(),
                        i + 1
                    ),
                ));
            }
        }
    }
    Ok(headers)
}

impl RawPaths {
    fn validate(self) -> Result<RunPaths, ConfigError> {
        let defaults = RunPaths::default();
        let path = |key: &str, v: Option<String>, default: String| match v {
            None => Ok(default),
            Some(v) => {
                run_path(&v).ok_or_else(|| bad(key, "must be an absolute path other than /"))
            }
        };
        Ok(RunPaths {
            workspace: path("paths.workspace", self.workspace, defaults.workspace)?,
            home: path("paths.home", self.home, defaults.home)?,
        })
    }
}

impl RawNetwork {
    fn validate(self, key: &str) -> Result<Network, ConfigError> {
        let mut allow_hosts = Vec::new();
        for (i, host) in self.allow_hosts.unwrap_or_default().into_iter().enumerate() {
            let entry_key = format!("{key}.allow_hosts[{i}]");
            let lower = host.trim_end_matches('.').to_ascii_lowercase();
            let pattern = match lower.strip_prefix("*.") {
                Some(domain) => HostPattern::Subdomains(format!(".{domain}")),
                None => HostPattern::Exact(lower.clone()),
            };
            let name = lower.trim_start_matches("*.");
            let plain = !name.is_empty()
                && name
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._:[]".contains(&b));
            if !plain || name.contains('*') {
                return Err(bad(
                    &entry_key,
                    "must be a host name, an IP literal, or *.domain",
                ));
            }
            allow_hosts.push(pattern);
        }
        Ok(Network {
            allow_hosts,
            deny_private: self.deny_private.unwrap_or(true),
        })
    }
}

/// A `params` key: a JSON Pointer (RFC 6901) into the input, `*` for every array element.
fn param(key: &str, pointer: &str, role: &str) -> Result<Param, ConfigError> {
    let role = match role {
        "path" => Role::Path,
        "source_path" => Role::SourcePath,
        "network_target" => Role::NetworkTarget,
        other => {
            return Err(bad(
                key,
                format!("{other:?} is not one of path, source_path, network_target"),
            ));
        }
    };
    let Some(rest) = pointer.strip_prefix('/') else {
        return Err(bad(key, "must be a JSON Pointer starting with /"));
    };
    let mut segments = Vec::new();
    for raw in rest.split('/') {
        if raw == "*" {
            segments.push(Segment::Each);
            continue;
        }
        let mut segment = String::with_capacity(raw.len());
        let mut chars = raw.chars();
        while let Some(c) = chars.next() {
            match c {
                '~' => match chars.next() {
                    Some('0') => segment.push('~'),
                    Some('1') => segment.push('/'),
                    _ => return Err(bad(key, "has a ~ that is not ~0 or ~1")),
                },
                c => segment.push(c),
            }
        }
        segments.push(Segment::Key(segment));
    }
    Ok(Param {
        pointer: pointer.to_string(),
        segments,
        role,
    })
}

impl RawStore {
    fn validate(self) -> Result<StoreConfig, ConfigError> {
        let kind = StoreKind::from_word(self.kind.as_deref(), StoreKind::Memory)?;
        let nodes = self.nodes.unwrap_or_default();
        if kind == StoreKind::RedisCluster && nodes.is_empty() {
            return Err(bad("store.nodes", "redis-cluster needs at least one node"));
        }
        for (i, n) in nodes.iter().enumerate() {
            if !(n.starts_with("redis://") || n.starts_with("rediss://")) {
                return Err(bad(
                    &format!("store.nodes[{i}]"),
                    "must be a redis:// or rediss:// URL",
                ));
            }
        }
        let key_prefix = self.key_prefix.unwrap_or_else(|| "toolgate".to_string());
        if key_prefix.is_empty()
            || !key_prefix
                .bytes()
                .all(|c| c.is_ascii_alphanumeric() || b"._-".contains(&c))
        {
            return Err(bad("store.key_prefix", "must be non-empty [A-Za-z0-9._-]"));
        }
        let durability = Durability::from_word(self.durability.as_deref(), Durability::Primary)?;
        Ok(StoreConfig {
            kind,
            nodes,
            key_prefix,
            record_ttl_ms: positive("store.record_ttl_ms", self.record_ttl_ms, 86_400_000)?,
            durability,
            timeout: Duration::from_millis(positive("store.timeout_ms", self.timeout_ms, 500)?),
            memory_max_bytes: positive(
                "store.memory_max_bytes",
                self.memory_max_bytes,
                DEFAULT_MEMORY_MAX_BYTES,
            )?,
        })
    }
}

/// The `Host` header for `uri`: its host, with its port unless that is the scheme's default
/// (80 for http, 443 for https).
fn host_header(uri: &hyper::Uri) -> Option<hyper::header::HeaderValue> {
    let host = uri.host()?;
    let default = match uri.scheme_str() {
        Some("https") => 443,
        _ => 80,
    };
    let value = match uri.port() {
        Some(port) if port.as_u16() != default => format!("{host}:{}", port.as_str()),
        _ => host.to_string(),
    };
    hyper::header::HeaderValue::from_str(&value).ok()
}

impl RawTool {
    fn validate(self, i: usize, base: &Limits) -> Result<Tool, ConfigError> {
        let key = |k: &str| format!("tools[{i}].{k}");
        let Some(name) = ToolName::from_string(self.name) else {
            return Err(bad(
                &key("name"),
                "must match ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$",
            ));
        };
        let upstream: hyper::Uri = self
            .upstream
            .parse()
            .map_err(|_| bad(&key("upstream"), "is not a URL"))?;
        match (upstream.scheme_str(), upstream.host()) {
            (Some("http" | "https"), Some(_)) => {}
            _ => return Err(bad(&key("upstream"), "must be an http:// or https:// URL")),
        }
        let upstream_host = host_header(&upstream)
            .ok_or_else(|| bad(&key("upstream"), "has a host that is not a valid header"))?;
        let schema = match &self.input_schema {
            None => None,
            Some(s) => Some(
                jsonschema::validator_for(s)
                    .map_err(|e| bad(&key("input_schema"), format!("invalid JSON Schema: {e}")))?,
            ),
        };
        let select = self.projection.select.unwrap_or_default();
        if !(select.is_empty() || select.starts_with('/')) {
            return Err(bad(
                &key("projection.select"),
                "must be a JSON Pointer (empty or starting with /)",
            ));
        }
        let protocol = match (self.protocol.as_deref(), self.remote_name) {
            (None | Some("http"), None) => Protocol::Http,
            (None | Some("http"), Some(_)) => {
                return Err(bad(&key("remote_name"), "needs protocol: mcp"));
            }
            (Some("mcp"), remote) => Protocol::Mcp {
                remote_name: match remote {
                    None => name.to_string(),
                    Some(r) if !r.is_empty() => r,
                    Some(_) => return Err(bad(&key("remote_name"), "must not be empty")),
                },
            },
            (Some(other), _) => {
                return Err(bad(
                    &key("protocol"),
                    format!("{other:?} is not one of http, mcp"),
                ));
            }
        };
        let mut params = Vec::new();
        for (pointer, role) in self.params.unwrap_or_default() {
            params.push(param(&key(&format!("params.{pointer}")), &pointer, &role)?);
        }
        let mut read_roots = Vec::new();
        for (n, root) in self.read_roots.unwrap_or_default().into_iter().enumerate() {
            if !root.starts_with('/') || root.contains('\0') {
                return Err(bad(
                    &key(&format!("read_roots[{n}]")),
                    "must be an absolute path",
                ));
            }
            read_roots.push(crate::paths::normalize(&root));
        }
        let network = self.network.unwrap_or_default().validate(&key("network"))?;
        let upstream_auth = match &self.upstream_token_file {
            None => None,
            Some(path) => Some(bearer_from_file(&key("upstream_token_file"), path)?),
        };
        let projection = Projection {
            select,
            max_items: self.projection.max_items,
            fields: self.projection.fields,
        };
        let plan = projection.plan().ok_or_else(|| {
            ConfigError(format!("{}: not a JSON Pointer", key("projection.select")))
        })?;
        Ok(Tool {
            limits: self.limits.resolve(&key("limits"), base)?,
            timeout: Duration::from_millis(positive(&key("timeout_ms"), self.timeout_ms, 10_000)?),
            name,
            upstream_host,
            protocol,
            read_only: self.read_only,
            input_schema: self.input_schema,
            schema,
            select: plan,
            projection,
            description: self.description.unwrap_or_default(),
            upstream_auth,
            upstream_token_file: self.upstream_token_file,
            params,
            read_roots,
            network,
            upstream,
        })
    }
}

/// The `Authorization` value for a token file: the file's content, trimmed. The message names
/// the key and the file, never the content.
fn bearer_from_file(key: &str, path: &Path) -> Result<hyper::header::HeaderValue, ConfigError> {
    let text = read_text_file(path, MAX_SECRET_FILE_BYTES).map_err(|e| bad(key, e))?;
    let token = text.trim();
    if token.is_empty() {
        return Err(bad(key, format!("{} is empty", path.display())));
    }
    let mut value =
        hyper::header::HeaderValue::from_str(&format!("Bearer {token}")).map_err(|_| {
            bad(
                key,
                format!("{} holds characters a header cannot carry", path.display()),
            )
        })?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_host_header_is_what_the_pooled_client_would_set() {
        for (uri, host) in [
            ("http://127.0.0.1:8080/x", "127.0.0.1:8080"),
            ("http://tool.example/", "tool.example"),
            ("http://tool.example:80/", "tool.example"),
            ("http://tool.example:443/", "tool.example:443"),
            ("https://tool.example:443/a", "tool.example"),
            ("https://tool.example:80/a", "tool.example:80"),
            ("http://[::1]:9/", "[::1]:9"),
        ] {
            let uri: hyper::Uri = uri.parse().unwrap();
            assert_eq!(host_header(&uri).unwrap(), host, "{uri}");
        }
    }

    #[test]
    fn defaults_apply_to_an_empty_file() {
        let c = Config::parse("").expect("empty config is valid");
        assert_eq!(c.store.kind, StoreKind::Memory);
        assert_eq!(c.policy.limits, DEFAULT_LIMITS);
        assert_eq!(c.listen.agent.to_string(), "127.0.0.1:15001");
        assert_eq!(c.policy.runs.default_max_calls, 100);
    }

    #[test]
    fn scalar_types_are_exact() {
        // YAML 1.2: a quoted scalar is a string, and `yes`/`on` are strings too; none of them is
        // a boolean or a number, and the error names the key.
        for (yaml, key) in [
            (
                "tools: [{name: a, upstream: 'http://x/', read_only: 'true'}]",
                "read_only",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', read_only: \"yes\"}]",
                "read_only",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', read_only: yes}]",
                "read_only",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', read_only: on}]",
                "read_only",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', timeout_ms: '100'}]",
                "timeout_ms",
            ),
            ("limits: {raw_bytes: \"1024\"}", "raw_bytes"),
            ("runs: {default_max_calls: '5'}", "default_max_calls"),
            ("store: {record_ttl_ms: \"1000\"}", "record_ttl_ms"),
            ("otel: {sample_ratio: '0.5'}", "sample_ratio"),
            (
                "tools: [{name: a, upstream: 'http://x/', projection: {max_items: '3'}}]",
                "max_items",
            ),
        ] {
            let e = Config::parse(yaml).expect_err(yaml);
            assert!(e.0.contains(key), "{yaml}: {e}");
        }
        // The plain spellings are what they look like.
        let c = Config::parse(
            "tools: [{name: a, upstream: 'http://x/', read_only: true, timeout_ms: 100}]",
        )
        .expect("plain scalars");
        let tool = c.policy.tool("a").expect("tool a");
        assert!(tool.read_only);
        assert_eq!(tool.timeout, Duration::from_millis(100));
        let c = Config::parse("tools: [{name: a, upstream: 'http://x/', read_only: True}]")
            .expect("YAML 1.2 core spelling");
        assert!(c.policy.tool("a").expect("tool a").read_only);
    }

    #[test]
    fn unknown_keys_are_named() {
        let e = Config::parse("store: {kind: memory, colour: red}").unwrap_err();
        assert!(e.0.contains("colour"), "{e}");
        let e = Config::parse("tools: [{name: a, upstream: 'http://x/', bogus: 1}]").unwrap_err();
        assert!(e.0.contains("bogus"), "{e}");
    }

    #[test]
    fn invalid_values_are_named() {
        for (yaml, key) in [
            ("store: {record_ttl_ms: 0}", "store.record_ttl_ms"),
            ("store: {kind: redis-cluster}", "store.nodes"),
            ("store: {durability: sometimes}", "store.durability"),
            ("listen: {agent: nowhere}", "listen.agent"),
            ("limits: {raw_bytes: 0}", "limits.raw_bytes"),
            ("limits: {json_depth: 0}", "limits.json_depth"),
            ("limits: {json_depth: 101}", "limits.json_depth"),
            (
                "tools: [{name: 'a b', upstream: 'http://x/'}]",
                "tools[0].name",
            ),
            (
                "tools: [{name: a, upstream: 'ftp://x/'}]",
                "tools[0].upstream",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', input_schema: {type: 7}}]",
                "tools[0].input_schema",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', projection: {select: results}}]",
                "tools[0].projection.select",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/'}, {name: a, upstream: 'http://y/'}]",
                "tools[1].name",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', params: {/x: file}}]",
                "tools[0].params./x",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', params: {x: path}}]",
                "tools[0].params.x",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', params: {/a~2: path}}]",
                "tools[0].params./a~2",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', read_roots: [usr/share]}]",
                "tools[0].read_roots[0]",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', network: {allow_hosts: ['a b']}}]",
                "tools[0].network.allow_hosts[0]",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', network: {allow_hosts: ['a.*.com']}}]",
                "tools[0].network.allow_hosts[0]",
            ),
            ("paths: {workspace: relative}", "paths.workspace"),
            ("paths: {home: /}", "paths.home"),
        ] {
            let e = Config::parse(yaml).unwrap_err();
            assert!(e.0.starts_with(key), "{yaml}: {e}");
        }
    }

    #[test]
    fn tool_limits_override_and_raise_the_read_cap() {
        let c = Config::parse(
            "limits: {request_bytes: 100}\ntools: [{name: a, upstream: 'http://x/', read_only: true, limits: {request_bytes: 500}}]",
        )
        .expect("valid");
        let a = c.policy.tool("a").expect("tool a");
        assert_eq!(a.limits.request_bytes, 500);
        assert_eq!(a.limits.raw_bytes, DEFAULT_LIMITS.raw_bytes);
        assert_eq!(c.policy.max_request_bytes, 500);
        assert!(a.read_only);
    }

    #[test]
    fn files_are_read_no_further_than_their_cap() {
        let dir = std::env::temp_dir().join(format!("toolgate-caps-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let big = dir.join("big-token");
        let secret = "s".repeat(MAX_SECRET_FILE_BYTES as usize + 1);
        std::fs::write(&big, &secret).unwrap();
        let e = Config::parse(&format!(
            "tools: [{{name: a, upstream: 'http://x/', upstream_token_file: {}}}]",
            big.display()
        ))
        .unwrap_err();
        assert!(e.0.starts_with("tools[0].upstream_token_file"), "{e}");
        assert!(e.0.contains("is larger than 65536 bytes"), "{e}");
        assert!(!e.0.contains("sss"), "the message shows the content: {e}");
        // A device that never ends costs max + 1 bytes, not the machine.
        let e = read_file(Path::new("/dev/zero"), 1024).unwrap_err();
        assert!(e.contains("is larger than 1024 bytes"), "{e}");
        let e = Config::load(Path::new("/dev/zero")).unwrap_err();
        assert!(e.0.contains("is larger than"), "{e}");
        let exact = dir.join("exact");
        std::fs::write(&exact, "x".repeat(1024)).unwrap();
        assert_eq!(read_file(&exact, 1024).unwrap().len(), 1024);
        std::fs::write(&exact, [0xff, 0xfe]).unwrap();
        let e = read_text_file(&exact, 1024).unwrap_err();
        assert!(e.contains("is not valid UTF-8"), "{e}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn mcp_and_credential_keys() {
        let dir = std::env::temp_dir().join(format!("toolgate-config-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token = dir.join("token");
        std::fs::write(&token, "s3cret-upstream-token\n").unwrap();
        let c = Config::parse(&format!(
            "tools:\n  - {{name: docs, upstream: 'http://x/mcp', protocol: mcp, read_only: true, description: Docs., upstream_token_file: {}}}\n  - {{name: plain, upstream: 'http://x/', remote_name: r}}",
            token.display()
        ))
        .unwrap_err();
        assert!(c.0.starts_with("tools[1].remote_name"), "{c}");
        let c = Config::parse(&format!(
            "tools:\n  - {{name: docs, upstream: 'http://x/mcp', protocol: mcp, read_only: true, description: Docs., upstream_token_file: {}}}",
            token.display()
        ))
        .expect("valid");
        let docs = c.policy.tool("docs").expect("docs");
        assert_eq!(
            docs.protocol,
            Protocol::Mcp {
                remote_name: "docs".into()
            }
        );
        assert_eq!(docs.description, "Docs.");
        let auth = docs.upstream_auth.as_ref().expect("auth");
        assert_eq!(auth.to_str().unwrap(), "Bearer s3cret-upstream-token");
        assert!(auth.is_sensitive());
        assert!(
            !format!("{docs:?}").contains("s3cret"),
            "Debug shows the token"
        );
        for (yaml, key) in [
            (
                "tools: [{name: a, upstream: 'http://x/', protocol: grpc}]",
                "tools[0].protocol",
            ),
            (
                "tools: [{name: a, upstream: 'http://x/', upstream_token_file: /nonexistent/t}]",
                "tools[0].upstream_token_file",
            ),
        ] {
            let e = Config::parse(yaml).unwrap_err();
            assert!(e.0.starts_with(key), "{yaml}: {e}");
        }
        let empty = dir.join("empty");
        std::fs::write(&empty, " \n").unwrap();
        let e = Config::parse(&format!(
            "tools: [{{name: a, upstream: 'http://x/', upstream_token_file: {}}}]",
            empty.display()
        ))
        .unwrap_err();
        assert!(!e.0.contains("s3cret") && e.0.contains("empty"), "{e}");
    }

    #[test]
    fn roles_are_parsed_at_load() {
        let c = Config::parse(
            "paths: {workspace: /srv/ws/, home: /home/u/../agent}\ntools: [{name: a, upstream: 'http://x/', params: {/files/*/p~1q: path, /url: network_target}, read_roots: [/usr/share/doc/], network: {allow_hosts: ['*.Example.COM.', '10.0.0.1'], deny_private: false}}]",
        )
        .expect("valid");
        assert_eq!(c.policy.paths.workspace, "/srv/ws");
        assert_eq!(c.policy.paths.home, "/home/agent");
        let a = c.policy.tool("a").expect("a");
        assert_eq!(a.read_roots, ["/usr/share/doc"]);
        let files = a
            .params
            .iter()
            .find(|p| p.role == Role::Path)
            .expect("path");
        assert_eq!(
            files.segments,
            [
                Segment::Key("files".into()),
                Segment::Each,
                Segment::Key("p/q".into())
            ]
        );
        assert!(!a.network.deny_private);
        assert!(a.network.allow_hosts[0].matches("docs.example.com"));
        assert!(!a.network.allow_hosts[0].matches("example.com"));
        assert!(a.network.allow_hosts[1].matches("10.0.0.1"));
        let e = Config::parse("tools: [{name: a, upstream: 'http://x/', network: {deny: 1}}]")
            .unwrap_err();
        assert!(e.0.contains("deny"), "{e}");
    }

    #[test]
    fn otel_keys_and_their_environment_variables() {
        let none = |_: &str| None;
        let c = Config::parse_env("", &none).expect("valid");
        assert!(c.otel.is_none(), "no otel key, no tracing");
        let c = Config::parse_env("otel: {}", &none).expect("valid");
        let o = c.otel.expect("otel");
        assert_eq!(o.traces_url.to_string(), "http://localhost:4318/v1/traces");
        assert_eq!((o.service_name.as_str(), o.sample_ratio), ("toolgate", 1.0));
        assert_eq!(o.max_queue_spans, 2048);
        let env = |name: &str| match name {
            "OTEL_EXPORTER_OTLP_ENDPOINT" => Some("https://collector.example:4318/".to_string()),
            "OTEL_SERVICE_NAME" => Some("agent-sidecar".to_string()),
            "OTEL_TRACES_SAMPLER_ARG" => Some("0.25".to_string()),
            _ => None,
        };
        let o = Config::parse_env("otel: {}", &env).unwrap().otel.unwrap();
        assert_eq!(
            o.traces_url.to_string(),
            "https://collector.example:4318/v1/traces"
        );
        assert_eq!(
            (o.service_name.as_str(), o.sample_ratio),
            ("agent-sidecar", 0.25)
        );
        let o = Config::parse_env(
            "otel: {endpoint: 'http://c:4318/v1/traces', service_name: tg, sample_ratio: 0.5}",
            &env,
        )
        .unwrap()
        .otel
        .unwrap();
        assert_eq!(o.traces_url.to_string(), "http://c:4318/v1/traces");
        assert_eq!((o.service_name.as_str(), o.sample_ratio), ("tg", 0.5));
        let disabled = |name: &str| (name == "OTEL_SDK_DISABLED").then(|| "true".to_string());
        assert!(
            Config::parse_env("otel: {}", &disabled)
                .unwrap()
                .otel
                .is_none()
        );
        let bad_arg = |name: &str| (name == "OTEL_TRACES_SAMPLER_ARG").then(|| "most".to_string());
        let e = Config::parse_env("otel: {}", &bad_arg).unwrap_err();
        assert!(e.0.starts_with("OTEL_TRACES_SAMPLER_ARG"), "{e}");
        for (yaml, key) in [
            ("otel: {endpoint: 'grpc://c:4317'}", "otel.endpoint"),
            ("otel: {sample_ratio: 1.5}", "otel.sample_ratio"),
            ("otel: {service_name: ''}", "otel.service_name"),
            ("otel: {max_queue_spans: 0}", "otel.max_queue_spans"),
            ("otel: {headers_file: /nonexistent/h}", "otel.headers_file"),
            ("otel: {colour: red}", "colour"),
        ] {
            let e = Config::parse_env(yaml, &none).unwrap_err();
            assert!(e.0.contains(key), "{yaml}: {e}");
        }
    }

    #[test]
    fn otel_headers_file_is_read_and_never_shown() {
        let dir = std::env::temp_dir().join(format!("toolgate-otel-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("headers");
        std::fs::write(
            &file,
            "# collector credentials\nAuthorization: Basic c2VjcmV0\n\nx-tenant: a\n",
        )
        .unwrap();
        let c = Config::parse_env(
            &format!("otel: {{headers_file: {}}}", file.display()),
            &|_| None,
        )
        .unwrap();
        let o = c.otel.as_ref().unwrap();
        assert_eq!(
            o.headers,
            [
                ("authorization".to_string(), "Basic c2VjcmV0".to_string()),
                ("x-tenant".to_string(), "a".to_string())
            ]
        );
        assert!(
            !format!("{c:?}").contains("c2VjcmV0"),
            "Debug shows a header value"
        );
        std::fs::write(&file, "Authorization Basic c2VjcmV0\n").unwrap();
        let e = Config::parse_env(
            &format!("otel: {{headers_file: {}}}", file.display()),
            &|_| None,
        )
        .unwrap_err();
        assert!(e.0.contains("line 1") && !e.0.contains("c2VjcmV0"), "{e}");
    }

    #[test]
    fn store_words_are_enums() {
        let c = Config::parse(
            "store: {kind: redis-cluster, nodes: ['redis://a:1'], durability: replica}",
        )
        .expect("valid");
        assert_eq!(c.store.kind, StoreKind::RedisCluster);
        assert_eq!(c.store.durability, Durability::Replica);
        let e = Config::parse("store: {kind: etcd}").unwrap_err();
        assert!(e.0.starts_with("store.kind"), "{e}");
    }
}
