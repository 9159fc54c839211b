//! The Kubernetes mutating admission webhook of SPEC §9: injects the toolgate sidecar into pods
//! annotated `toolgate.dev/inject: "true"`.
//!
//! [`review`] is the whole decision, a pure function from an `AdmissionReview` body to an HTTP
//! status and body; [`serve`] and [`serve_on`] put it behind HTTPS (rustls) as `POST /mutate`
//! next to `GET /healthz`.
//!
//! The patch holds only `add` operations computed against the object exactly as the API server
//! sent it, so every field the webhook does not own is left as it was.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::future::Future;
use std::io::BufReader;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full, LengthLimitError, Limited};
use hyper::body::{Body, Incoming};
use hyper::header::{ALLOW, CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, ContainerPort, EnvVar, EnvVarSource,
    HTTPGetAction, Pod, Probe, ResourceRequirements, SeccompProfile, SecretKeySelector,
    SecurityContext, Volume, VolumeMount,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::{DynamicObject, Status};
use serde::{Deserialize as _, Serialize};
use serde_json::{Map, Value, json};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio_rustls::TlsAcceptor;
use tokio_rustls::rustls;
use tracing::{debug, info, warn};

/// Opt-in annotation: only pods carrying it with the value `"true"` are injected.
pub const ANNOTATION_INJECT: &str = "toolgate.dev/inject";
/// Set to `"true"` by the patch; a pod carrying it is never injected again.
pub const ANNOTATION_INJECTED: &str = "toolgate.dev/injected";
/// `"false"` puts the sidecar in `containers` instead of a native sidecar in `initContainers`.
pub const ANNOTATION_NATIVE_SIDECAR: &str = "toolgate.dev/native-sidecar";
/// Per-pod override of the ConfigMap holding `toolgate.yaml`.
pub const ANNOTATION_CONFIG_MAP: &str = "toolgate.dev/config-map";
/// Per-pod override of the sidecar's CPU request.
pub const ANNOTATION_CPU: &str = "toolgate.dev/cpu";
/// Per-pod override of the sidecar's memory request, which is also its limit.
pub const ANNOTATION_MEMORY: &str = "toolgate.dev/memory";

/// Name of the injected container.
pub const CONTAINER_NAME: &str = "toolgate";
/// Name of the injected ConfigMap volume.
pub const CONFIG_VOLUME: &str = "toolgate-config";
/// Where the config volume is mounted in the sidecar.
pub const CONFIG_MOUNT_PATH: &str = "/etc/toolgate";
/// Sidecar CPU request unless the pod overrides it.
pub const DEFAULT_CPU_REQUEST: &str = "50m";
/// Sidecar memory request and limit unless the pod overrides it.
pub const DEFAULT_MEMORY: &str = "64Mi";
/// Largest `POST /mutate` body read. A CREATE review carries one object, itself capped well
/// below this by etcd; a bigger body is answered 413 without being read to the end.
pub const MAX_REVIEW_BYTES: usize = 3 * 1024 * 1024;

const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
const ADMISSION_KIND: &str = "AdmissionReview";
const ADMIN_TOKEN_ENV: &str = "TOOLGATE_ADMIN_TOKEN";
const ADMIN_TOKEN_KEY: &str = "token";
const PORT_AGENT: i32 = 15001;
const PORT_ADMIN: i32 = 15002;
const PORT_TELEMETRY: i32 = 15090;
/// With a 1 s period: how long toolgate may take to start before the kubelet restarts it.
const STARTUP_PROBE_FAILURES: i32 = 60;
/// A denial message is shown to whoever created the pod; keep it readable.
const MAX_MESSAGE_CHARS: usize = 512;
/// Annotation values quoted in a message are cut to this many characters.
const MAX_QUOTED_CHARS: usize = 64;
/// Longer than any quantity a pod spec would hold; keeps the validator's input small.
const MAX_QUANTITY_LEN: usize = 64;
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// The API server gives a webhook at most 30 s; a body slower than this is not worth waiting for.
const BODY_READ_TIMEOUT: Duration = Duration::from_secs(10);
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
const ACCEPT_BACKOFF: Duration = Duration::from_millis(100);

/// What the webhook puts into every injected pod.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InjectorSettings {
    /// Image of the sidecar container.
    pub image: String,
    /// ConfigMap holding `toolgate.yaml`, unless the pod names another one.
    pub config_map: String,
    /// Secret whose key `token` becomes `TOOLGATE_ADMIN_TOKEN`.
    pub admin_secret: String,
}

impl InjectorSettings {
    /// Refuses settings that would make every injected pod invalid, so the injector can exit
    /// with a bad-usage code before it binds its port.
    pub fn validate(&self) -> Result<(), InjectorError> {
        if self.image.is_empty() || self.image.chars().any(char::is_whitespace) {
            return Err(InjectorError::Settings {
                name: "image",
                reason: "must be a non-empty image reference without whitespace".to_owned(),
            });
        }
        for (name, value) in [
            ("config-map", &self.config_map),
            ("admin-secret", &self.admin_secret),
        ] {
            if !is_dns_subdomain(value) {
                return Err(InjectorError::Settings {
                    name,
                    reason: "must be a Kubernetes object name (lowercase DNS-1123 subdomain)"
                        .to_owned(),
                });
            }
        }
        Ok(())
    }
}

/// Command-line arguments of `toolgate injector`.
#[derive(Clone, Debug)]
pub struct InjectorArgs {
    /// Address of the HTTPS listener.
    pub listen: SocketAddr,
    /// PEM certificate chain served to the API server.
    pub tls_cert: PathBuf,
    /// PEM private key of that certificate.
    pub tls_key: PathBuf,
    /// What gets injected.
    pub settings: InjectorSettings,
}

/// Why the injector could not start.
#[derive(Debug, thiserror::Error)]
pub enum InjectorError {
    /// A command-line setting is unusable.
    #[error("invalid --{name}: {reason}")]
    Settings {
        /// The flag, without dashes.
        name: &'static str,
        /// What is wrong with it.
        reason: String,
    },
    /// A TLS file could not be read or holds no usable PEM item.
    #[error("TLS {what} {path}: {reason}")]
    TlsFile {
        /// `certificate` or `key`.
        what: &'static str,
        /// The file named on the command line.
        path: PathBuf,
        /// What went wrong.
        reason: String,
    },
    /// rustls refused the certificate and key.
    #[error("invalid TLS certificate or key: {0}")]
    Tls(#[from] rustls::Error),
    /// The listen address could not be bound.
    #[error("cannot listen on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// The OS error.
        source: std::io::Error,
    },
}

// ---------------------------------------------------------------------------------------------
// Review: AdmissionReview in, AdmissionReview out.
// ---------------------------------------------------------------------------------------------

/// Answers one `POST /mutate` body. Never panics.
///
/// A body that is not JSON, not an `admission.k8s.io/v1` `AdmissionReview`, or without a
/// `request` carrying a string `uid` gets `400` and `{"error": "..."}`. Everything else gets
/// `200` and an `AdmissionReview` response echoing the uid.
pub fn review(body: &[u8], settings: &InjectorSettings) -> (StatusCode, Vec<u8>) {
    let (uid, request) = match envelope(body) {
        Ok(parts) => parts,
        Err(reason) => {
            debug!(reason, "admission review refused");
            return error_body(StatusCode::BAD_REQUEST, reason);
        }
    };
    let verdict = decide(request, settings);
    match &verdict {
        Verdict::Allow(why) => debug!(uid, why, "admission allowed without patch"),
        Verdict::Inject { .. } => info!(uid, "toolgate sidecar injected"),
        Verdict::Deny(message) => info!(uid, message, "admission denied"),
        Verdict::Internal(cause) => warn!(uid, cause, "admission failed"),
    }
    match response_body(&uid, verdict) {
        Ok(body) => (StatusCode::OK, body),
        Err(cause) => {
            warn!(uid, %cause, "cannot serialize admission response");
            error_body(StatusCode::INTERNAL_SERVER_ERROR, "internal error")
        }
    }
}

/// The webhook's answer before it is serialized.
#[derive(Debug)]
enum Verdict {
    /// Allowed, no patch; the reason is only logged.
    Allow(&'static str),
    /// Allowed with these JSONPatch operations.
    Inject { ops: Vec<Value> },
    /// Refused, with a message for whoever created the object.
    Deny(String),
    /// A bug on our side; refused so that a pod never starts half-injected.
    Internal(String),
}

/// Checks the `AdmissionReview` envelope and returns the request's uid and its JSON object.
fn envelope(body: &[u8]) -> Result<(String, Map<String, Value>), &'static str> {
    let document: Value = serde_json::from_slice(body).map_err(|_| "body is not JSON")?;
    let Value::Object(mut document) = document else {
        return Err("body is not an admission.k8s.io/v1 AdmissionReview");
    };
    let is_review = document.get("apiVersion").and_then(Value::as_str)
        == Some(ADMISSION_API_VERSION)
        && document.get("kind").and_then(Value::as_str) == Some(ADMISSION_KIND);
    if !is_review {
        return Err("body is not an admission.k8s.io/v1 AdmissionReview");
    }
    let Some(Value::Object(request)) = document.remove("request") else {
        return Err("AdmissionReview has no request object");
    };
    let Some(uid) = request.get("uid").and_then(Value::as_str) else {
        return Err("AdmissionReview request has no string uid");
    };
    Ok((uid.to_owned(), request))
}

/// Parses the request in two steps, so that a malformed object is a denial (the uid is known)
/// rather than a 400: first the request without its objects, then the object as a Pod.
fn decide(mut request: Map<String, Value>, settings: &InjectorSettings) -> Verdict {
    let object = request.remove("object").unwrap_or(Value::Null);
    request.remove("oldObject");
    fill_optional_fields(&mut request, &object);
    let meta = match AdmissionRequest::<DynamicObject>::deserialize(Value::Object(request)) {
        Ok(meta) => meta,
        Err(e) => return Verdict::Deny(format!("malformed admission request: {e}")),
    };
    if meta.operation != Operation::Create || !is_pod(&meta) {
        return Verdict::Allow("not a pod creation");
    }
    if object.is_null() {
        return Verdict::Deny("admission request has no object".to_owned());
    }
    let pod = match Pod::deserialize(&object) {
        Ok(pod) => pod,
        Err(e) => return Verdict::Deny(format!("request.object is not a well-formed Pod: {e}")),
    };
    plan(&pod, &object, settings)
}

/// API servers always send `userInfo`, `kind` and `resource`; hand-written reviews (tests,
/// tooling) often omit them. Fill what can be known so such a review is judged on its object.
fn fill_optional_fields(request: &mut Map<String, Value>, object: &Value) {
    request
        .entry("userInfo")
        .or_insert_with(|| Value::Object(Map::new()));
    if !request.contains_key("kind") {
        let (api_version, kind) = (
            object
                .get("apiVersion")
                .and_then(Value::as_str)
                .unwrap_or(""),
            object.get("kind").and_then(Value::as_str).unwrap_or(""),
        );
        let (group, version) = api_version.rsplit_once('/').unwrap_or(("", api_version));
        request.insert(
            "kind".into(),
            serde_json::json!({"group": group, "version": version, "kind": kind}),
        );
    }
    if !request.contains_key("resource") {
        let kind = &request["kind"];
        let resource = match kind.get("kind").and_then(Value::as_str) {
            Some("Pod") => "pods".to_owned(),
            Some(other) => format!("{}s", other.to_lowercase()),
            None => String::new(),
        };
        let resource = serde_json::json!({
            "group": kind.get("group").cloned().unwrap_or_default(),
            "version": kind.get("version").cloned().unwrap_or_default(),
            "resource": resource,
        });
        request.insert("resource".into(), resource);
    }
}

/// Core `v1` Pod itself; subresources (`pods/binding`, `pods/eviction`…) are left alone.
fn is_pod(meta: &AdmissionRequest<DynamicObject>) -> bool {
    meta.kind.group.is_empty()
        && meta.kind.version == "v1"
        && meta.kind.kind == "Pod"
        && meta.sub_resource.as_deref().unwrap_or("").is_empty()
}

/// Decides on a well-formed pod: `pod` answers the questions, `raw` (the same object as sent)
/// tells where the `add` operations go.
fn plan(pod: &Pod, raw: &Value, settings: &InjectorSettings) -> Verdict {
    let empty = BTreeMap::new();
    let annotations = pod.metadata.annotations.as_ref().unwrap_or(&empty);
    let annotation = |key: &str| annotations.get(key).map(String::as_str);

    if annotation(ANNOTATION_INJECT) != Some("true") {
        return Verdict::Allow("pod not annotated for injection");
    }
    if annotation(ANNOTATION_INJECTED) == Some("true") {
        return Verdict::Allow("pod already injected");
    }
    let Some(spec) = pod.spec.as_ref() else {
        return Verdict::Deny("pod has no spec".to_owned());
    };
    let has_sidecar = spec
        .containers
        .iter()
        .chain(spec.init_containers.iter().flatten())
        .any(|c| c.name == CONTAINER_NAME);
    if has_sidecar {
        return Verdict::Allow("pod already has a toolgate container");
    }
    if spec
        .volumes
        .iter()
        .flatten()
        .any(|v| v.name == CONFIG_VOLUME)
    {
        return Verdict::Deny(format!(
            "pod already has a volume named {CONFIG_VOLUME}; toolgate cannot be injected"
        ));
    }

    let cpu = annotation(ANNOTATION_CPU).unwrap_or(DEFAULT_CPU_REQUEST);
    let memory = annotation(ANNOTATION_MEMORY).unwrap_or(DEFAULT_MEMORY);
    for (key, value) in [(ANNOTATION_CPU, cpu), (ANNOTATION_MEMORY, memory)] {
        if !is_quantity(value) {
            return Verdict::Deny(format!(
                "annotation {key}: {} is not a Kubernetes quantity",
                quoted(value)
            ));
        }
    }
    let config_map = annotation(ANNOTATION_CONFIG_MAP).unwrap_or(&settings.config_map);
    if !is_dns_subdomain(config_map) {
        return Verdict::Deny(format!(
            "annotation {ANNOTATION_CONFIG_MAP}: {} is not a ConfigMap name",
            quoted(config_map)
        ));
    }
    let native = annotation(ANNOTATION_NATIVE_SIDECAR) != Some("false");

    let container = sidecar(settings, cpu, memory, native);
    let volume = Volume {
        name: CONFIG_VOLUME.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_owned(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    };
    let (container, volume) = match (
        serde_json::to_value(container),
        serde_json::to_value(volume),
    ) {
        (Ok(c), Ok(v)) => (c, v),
        (Err(e), _) | (_, Err(e)) => return Verdict::Internal(e.to_string()),
    };

    let spec_raw = raw.get("spec");
    let is_array = |field: &str| {
        spec_raw
            .and_then(|s| s.get(field))
            .is_some_and(Value::is_array)
    };
    let mut ops = Vec::with_capacity(3);
    ops.push(if native {
        // Index 0: the sidecar must start before the pod's own init containers.
        insert(
            is_array("initContainers"),
            "/spec/initContainers",
            "0",
            container,
        )
    } else {
        insert(is_array("containers"), "/spec/containers", "-", container)
    });
    ops.push(insert(is_array("volumes"), "/spec/volumes", "-", volume));
    // The inject annotation is present, so `metadata.annotations` exists in the raw object.
    ops.push(add(
        format!(
            "/metadata/annotations/{}",
            escape_pointer(ANNOTATION_INJECTED)
        ),
        Value::from("true"),
    ));
    Verdict::Inject { ops }
}

/// The sidecar container, ready to be serialized into the patch.
fn sidecar(settings: &InjectorSettings, cpu: &str, memory: &str, native: bool) -> Container {
    let port = |name: &str, number: i32| ContainerPort {
        name: Some(name.to_owned()),
        container_port: number,
        protocol: Some("TCP".to_owned()),
        ..ContainerPort::default()
    };
    let probe = |path: &str| Probe {
        http_get: Some(HTTPGetAction {
            path: Some(path.to_owned()),
            port: IntOrString::Int(PORT_TELEMETRY),
            ..HTTPGetAction::default()
        }),
        ..Probe::default()
    };
    // A native sidecar counts as started, and the next container is started, once its startup
    // probe passes: this makes the agent wait until toolgate answers, not merely until it runs.
    let startup = Probe {
        period_seconds: Some(1),
        failure_threshold: Some(STARTUP_PROBE_FAILURES),
        ..probe("/healthz")
    };
    Container {
        name: CONTAINER_NAME.to_owned(),
        image: Some(settings.image.clone()),
        args: Some(
            ["serve", "--config", "/etc/toolgate/toolgate.yaml"]
                .map(str::to_owned)
                .to_vec(),
        ),
        // `Always` on an init container is what makes it a native sidecar (Kubernetes ≥ 1.29).
        restart_policy: native.then(|| "Always".to_owned()),
        ports: Some(vec![
            port("agent", PORT_AGENT),
            port("admin", PORT_ADMIN),
            port("telemetry", PORT_TELEMETRY),
        ]),
        readiness_probe: Some(probe("/readyz")),
        liveness_probe: Some(probe("/healthz")),
        startup_probe: Some(startup),
        security_context: Some(SecurityContext {
            run_as_non_root: Some(true),
            read_only_root_filesystem: Some(true),
            allow_privilege_escalation: Some(false),
            capabilities: Some(Capabilities {
                drop: Some(vec!["ALL".to_owned()]),
                ..Capabilities::default()
            }),
            // Keeps the sidecar within the `restricted` Pod Security Standard whatever the pod sets.
            seccomp_profile: Some(SeccompProfile {
                type_: "RuntimeDefault".to_owned(),
                ..SeccompProfile::default()
            }),
            ..SecurityContext::default()
        }),
        env: Some(vec![EnvVar {
            name: ADMIN_TOKEN_ENV.to_owned(),
            value_from: Some(EnvVarSource {
                secret_key_ref: Some(SecretKeySelector {
                    name: settings.admin_secret.clone(),
                    key: ADMIN_TOKEN_KEY.to_owned(),
                    ..SecretKeySelector::default()
                }),
                ..EnvVarSource::default()
            }),
            ..EnvVar::default()
        }]),
        volume_mounts: Some(vec![VolumeMount {
            name: CONFIG_VOLUME.to_owned(),
            mount_path: CONFIG_MOUNT_PATH.to_owned(),
            read_only: Some(true),
            ..VolumeMount::default()
        }]),
        resources: Some(ResourceRequirements {
            requests: Some(BTreeMap::from([
                ("cpu".to_owned(), Quantity(cpu.to_owned())),
                ("memory".to_owned(), Quantity(memory.to_owned())),
            ])),
            limits: Some(BTreeMap::from([(
                "memory".to_owned(),
                Quantity(memory.to_owned()),
            )])),
            ..ResourceRequirements::default()
        }),
        ..Container::default()
    }
}

/// Adds `item` to the array at `array` (at `position`), or creates the array when the pod has
/// none (absent or `null`).
fn insert(exists: bool, array: &str, position: &str, item: Value) -> Value {
    if exists {
        add(format!("{array}/{position}"), item)
    } else {
        add(array.to_owned(), Value::Array(vec![item]))
    }
}

fn add(path: String, value: Value) -> Value {
    json!({"op": "add", "path": path, "value": value})
}

/// RFC 6901 escaping of one reference token.
fn escape_pointer(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

/// The `response` part of an `AdmissionReview`. Written here rather than taken from kube,
/// whose `AdmissionResponse` serializes the patch as an array of numbers; the contract is base64.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct ResponseOut<'a> {
    uid: &'a str,
    allowed: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    status: Option<Status>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch_type: Option<&'static str>,
}

fn response_body(uid: &str, verdict: Verdict) -> Result<Vec<u8>, serde_json::Error> {
    let denied = |message: &str, reason: &str, code: u16| ResponseOut {
        uid,
        allowed: false,
        status: Some(Status::failure(&shorten(message, MAX_MESSAGE_CHARS), reason).with_code(code)),
        patch: None,
        patch_type: None,
    };
    let response = match verdict {
        Verdict::Allow(_) => ResponseOut {
            uid,
            allowed: true,
            status: None,
            patch: None,
            patch_type: None,
        },
        Verdict::Inject { ops } => ResponseOut {
            uid,
            allowed: true,
            status: None,
            patch: Some(BASE64.encode(serde_json::to_vec(&ops)?)),
            patch_type: Some("JSONPatch"),
        },
        Verdict::Deny(message) => denied(&message, "BadRequest", 400),
        Verdict::Internal(_) => denied("toolgate injector internal error", "InternalError", 500),
    };
    serde_json::to_vec(&json!({
        "apiVersion": ADMISSION_API_VERSION,
        "kind": ADMISSION_KIND,
        "response": response,
    }))
}

fn error_body(status: StatusCode, message: &str) -> (StatusCode, Vec<u8>) {
    let body = json!({ "error": message }).to_string().into_bytes();
    (status, body)
}

/// `s` cut to at most `max` characters, marked when cut.
fn shorten(s: &str, max: usize) -> String {
    match s.char_indices().nth(max) {
        Some((end, _)) => format!("{}…", &s[..end]),
        None => s.to_owned(),
    }
}

/// An annotation value as shown in a message: quoted, escaped, and short.
fn quoted(value: &str) -> String {
    format!("{:?}", shorten(value, MAX_QUOTED_CHARS))
}

// ---------------------------------------------------------------------------------------------
// Validators.
// ---------------------------------------------------------------------------------------------

/// Whether `s` is a Kubernetes resource quantity: an unsigned (or `+`) decimal number followed
/// by a binary-SI suffix, a decimal-SI suffix, a decimal exponent, or nothing.
/// Negative values are refused: they are never a valid request or limit.
pub fn is_quantity(s: &str) -> bool {
    if s.len() > MAX_QUANTITY_LEN {
        return false;
    }
    let unsigned = s.strip_prefix('+').unwrap_or(s);
    let number_len = unsigned
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(unsigned.len());
    let (number, suffix) = unsigned.split_at(number_len);
    is_decimal(number) && is_suffix(suffix)
}

/// `digits`, `digits.digits`, `digits.` or `.digits`.
fn is_decimal(number: &str) -> bool {
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    let all_digits = |part: &str| part.bytes().all(|b| b.is_ascii_digit());
    !(whole.is_empty() && fraction.is_empty()) && all_digits(whole) && all_digits(fraction)
}

fn is_suffix(suffix: &str) -> bool {
    const SUFFIXES: [&str; 15] = [
        "", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "n", "u", "m", "k", "M", "G", "T", "P",
    ];
    if SUFFIXES.contains(&suffix) || suffix == "E" {
        return true;
    }
    let Some(exponent) = suffix.strip_prefix(['e', 'E']) else {
        return false;
    };
    let digits = exponent.strip_prefix(['+', '-']).unwrap_or(exponent);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

/// Whether `name` is a DNS-1123 subdomain, the rule for ConfigMap and Secret names.
pub fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |label: &str| {
        let bytes = label.as_bytes();
        let alnum = |b: &u8| b.is_ascii_lowercase() || b.is_ascii_digit();
        bytes.first().is_some_and(alnum)
            && bytes.last().is_some_and(alnum)
            && bytes.iter().all(|b| alnum(b) || *b == b'-')
    };
    !name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)
}

// ---------------------------------------------------------------------------------------------
// HTTPS server.
// ---------------------------------------------------------------------------------------------

/// Loads a PEM certificate chain and private key into a rustls server config (ring provider,
/// HTTP/1.1 only).
pub fn tls_config(cert: &Path, key: &Path) -> Result<Arc<rustls::ServerConfig>, InjectorError> {
    let file_error = |what: &'static str, path: &Path, reason: String| InjectorError::TlsFile {
        what,
        path: path.to_owned(),
        reason,
    };
    let cert_pem =
        std::fs::read(cert).map_err(|e| file_error("certificate", cert, e.to_string()))?;
    let chain = rustls_pemfile::certs(&mut BufReader::new(cert_pem.as_slice()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| file_error("certificate", cert, e.to_string()))?;
    if chain.is_empty() {
        return Err(file_error(
            "certificate",
            cert,
            "no PEM certificate".to_owned(),
        ));
    }
    let key_pem = std::fs::read(key).map_err(|e| file_error("key", key, e.to_string()))?;
    let private_key = rustls_pemfile::private_key(&mut BufReader::new(key_pem.as_slice()))
        .map_err(|e| file_error("key", key, e.to_string()))?
        .ok_or_else(|| file_error("key", key, "no PEM private key".to_owned()))?;

    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()?
        .with_no_client_auth()
        .with_single_cert(chain, private_key)?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(Arc::new(config))
}

/// Runs `toolgate injector`: validates the settings, loads the TLS files, binds `args.listen`
/// and serves until `shutdown` completes.
pub async fn serve(
    args: InjectorArgs,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), InjectorError> {
    args.settings.validate()?;
    let tls = tls_config(&args.tls_cert, &args.tls_key)?;
    let listener = TcpListener::bind(args.listen)
        .await
        .map_err(|source| InjectorError::Bind {
            addr: args.listen,
            source,
        })?;
    info!(listen = %args.listen, "toolgate injector listening");
    serve_on(listener, tls, args.settings, shutdown).await;
    Ok(())
}

/// Serves the webhook on an already bound listener until `shutdown` completes, then stops
/// accepting and gives open connections a bounded time to finish their request.
pub async fn serve_on(
    listener: TcpListener,
    tls: Arc<rustls::ServerConfig>,
    settings: InjectorSettings,
    shutdown: impl Future<Output = ()> + Send + 'static,
) {
    let acceptor = TlsAcceptor::from(tls);
    let settings = Arc::new(settings);
    let (drain_tx, drain_rx) = watch::channel(false);
    let mut connections = JoinSet::new();
    tokio::pin!(shutdown);
    loop {
        tokio::select! {
            () = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok((tcp, peer)) => {
                    let task = connection(tcp, peer, acceptor.clone(), Arc::clone(&settings), drain_rx.clone());
                    connections.spawn(task);
                }
                Err(e) => {
                    // Usually out of file descriptors: back off instead of spinning.
                    warn!(error = %e, "accept failed");
                    tokio::time::sleep(ACCEPT_BACKOFF).await;
                }
            },
            Some(done) = connections.join_next(), if !connections.is_empty() => {
                if let Err(e) = done {
                    warn!(error = %e, "connection task failed");
                }
            }
        }
    }
    drop(listener);
    // Receivers only wait for the value; a send error means none is left.
    let _ = drain_tx.send(true);
    let drained = tokio::time::timeout(DRAIN_TIMEOUT, async {
        while connections.join_next().await.is_some() {}
    })
    .await;
    if drained.is_err() {
        warn!(
            open = connections.len(),
            "connections still open after drain timeout; closing them"
        );
    }
    info!("toolgate injector stopped");
}

/// One TCP connection: TLS handshake, then HTTP/1.1 until the peer closes or we drain.
async fn connection(
    tcp: TcpStream,
    peer: SocketAddr,
    acceptor: TlsAcceptor,
    settings: Arc<InjectorSettings>,
    mut drain: watch::Receiver<bool>,
) {
    let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await {
        Ok(Ok(tls)) => tls,
        Ok(Err(e)) => {
            warn!(%peer, error = %e, "TLS handshake failed");
            return;
        }
        Err(_) => {
            warn!(%peer, "TLS handshake timed out");
            return;
        }
    };
    let service = service_fn(move |request: Request<Incoming>| {
        let settings = Arc::clone(&settings);
        async move { Ok::<_, Infallible>(handle(request, &settings).await) }
    });
    let conn = http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .serve_connection(TokioIo::new(tls), service);
    tokio::pin!(conn);
    let result = tokio::select! {
        result = conn.as_mut() => result,
        // The guard `wait_for` returns must not live across the await below.
        () = async { drop(drain.wait_for(|draining| *draining).await) } => {
            conn.as_mut().graceful_shutdown();
            conn.await
        }
    };
    if let Err(e) = result {
        debug!(%peer, error = %e, "connection ended with an error");
    }
}

/// Routes one request. Generic over the body so tests can drive it without a socket.
async fn handle<B>(request: Request<B>, settings: &InjectorSettings) -> Response<Full<Bytes>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match (request.method(), request.uri().path()) {
        (&Method::POST, "/mutate") => mutate(request.into_body(), settings).await,
        (&Method::GET, "/healthz") => {
            respond(StatusCode::OK, "text/plain; charset=utf-8", b"ok".to_vec())
        }
        (_, "/mutate") => not_allowed("POST"),
        (_, "/healthz") => not_allowed("GET"),
        _ => json_error(StatusCode::NOT_FOUND, "not found"),
    }
}

async fn mutate<B>(body: B, settings: &InjectorSettings) -> Response<Full<Bytes>>
where
    B: Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    // A declared length over the cap is refused before reading anything.
    if body.size_hint().lower() > MAX_REVIEW_BYTES as u64 {
        return too_large();
    }
    let read = tokio::time::timeout(
        BODY_READ_TIMEOUT,
        Limited::new(body, MAX_REVIEW_BYTES).collect(),
    );
    let bytes = match read.await {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) if e.is::<LengthLimitError>() => return too_large(),
        Ok(Err(e)) => {
            debug!(error = %e, "cannot read admission review body");
            return json_error(StatusCode::BAD_REQUEST, "cannot read body");
        }
        Err(_) => return json_error(StatusCode::REQUEST_TIMEOUT, "body read timed out"),
    };
    let (status, body) = review(&bytes, settings);
    respond(status, "application/json", body)
}

fn too_large() -> Response<Full<Bytes>> {
    json_error(StatusCode::PAYLOAD_TOO_LARGE, "body too large")
}

fn not_allowed(allow: &'static str) -> Response<Full<Bytes>> {
    let mut response = json_error(StatusCode::METHOD_NOT_ALLOWED, "method not allowed");
    response
        .headers_mut()
        .insert(ALLOW, HeaderValue::from_static(allow));
    response
}

fn json_error(status: StatusCode, message: &str) -> Response<Full<Bytes>> {
    let (status, body) = error_body(status, message);
    respond(status, "application/json", body)
}

fn respond(status: StatusCode, content_type: &'static str, body: Vec<u8>) -> Response<Full<Bytes>> {
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
        .headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static(content_type));
    response
}

#[cfg(test)]
mod tests {
    use std::pin::Pin;
    use std::task::{Context, Poll};

    use hyper::body::Frame;

    use super::*;

    #[test]
    fn quantities() {
        for ok in [
            "0", "1", "50m", "0.5", ".5", "1.", "64Mi", "1Gi", "1Ki", "2Ei", "100n", "3u", "1k",
            "1M", "1G", "1T", "1P", "1E", "1e3", "1E3", "1e-3", "1e+3", "+1", "250m", "1.5Gi",
        ] {
            assert!(is_quantity(ok), "{ok} should be a quantity");
        }
        for bad in [
            "", "-1", "-50m", "lots", "Mi", "1 Mi", " 1", "1Mi ", "1mi", "1KI", "1K", "1.2.3", ".",
            "+", "1e", "1e-", "1ee3", "1Mib", "0x10", "1,5", "1e3Mi", "∞", "1m\n",
        ] {
            assert!(!is_quantity(bad), "{bad:?} should not be a quantity");
        }
        assert!(!is_quantity(&"1".repeat(MAX_QUANTITY_LEN + 1)));
    }

    #[test]
    fn dns_subdomains() {
        for ok in ["toolgate", "toolgate-config", "a", "a.b-c.d", "0abc"] {
            assert!(is_dns_subdomain(ok), "{ok}");
        }
        for bad in ["", "Toolgate", "-a", "a-", "a..b", ".a", "a.", "a_b", "a b"] {
            assert!(!is_dns_subdomain(bad), "{bad:?}");
        }
        assert!(!is_dns_subdomain(&"a".repeat(254)));
    }

    #[test]
    fn pointer_escaping() {
        assert_eq!(
            escape_pointer("toolgate.dev/injected"),
            "toolgate.dev~1injected"
        );
        assert_eq!(escape_pointer("a~/b"), "a~0~1b");
    }

    #[test]
    fn shorten_respects_char_boundaries() {
        assert_eq!(shorten("ééé", 2), "éé…");
        assert_eq!(shorten("abc", 3), "abc");
    }

    #[test]
    fn settings_validation() {
        let good = InjectorSettings {
            image: "ghcr.io/example/toolgate:1.0".to_owned(),
            config_map: "toolgate".to_owned(),
            admin_secret: "toolgate-admin".to_owned(),
        };
        assert!(good.validate().is_ok());
        let bad_image = InjectorSettings {
            image: String::new(),
            ..good.clone()
        };
        assert!(bad_image.validate().is_err());
        let bad_secret = InjectorSettings {
            admin_secret: "Not_A_Name".to_owned(),
            ..good
        };
        assert!(bad_secret.validate().is_err());
    }

    /// A body of unknown length, like a chunked request.
    struct Chunked(Option<Bytes>);

    impl Body for Chunked {
        type Data = Bytes;
        type Error = Infallible;

        fn poll_frame(
            mut self: Pin<&mut Self>,
            _: &mut Context<'_>,
        ) -> Poll<Option<Result<Frame<Bytes>, Infallible>>> {
            Poll::Ready(self.0.take().map(|bytes| Ok(Frame::data(bytes))))
        }
    }

    fn settings() -> InjectorSettings {
        InjectorSettings {
            image: "toolgate:test".to_owned(),
            config_map: "toolgate".to_owned(),
            admin_secret: "toolgate-admin".to_owned(),
        }
    }

    fn post(
        body: impl Body<Data = Bytes, Error = Infallible>,
    ) -> Request<impl Body<Data = Bytes, Error = Infallible>> {
        let mut request = Request::new(body);
        *request.method_mut() = Method::POST;
        *request.uri_mut() = hyper::Uri::from_static("/mutate?timeout=10s");
        request
    }

    #[tokio::test]
    async fn body_over_the_cap_is_refused_with_or_without_a_length() {
        let big = Bytes::from(vec![b' '; MAX_REVIEW_BYTES + 1]);
        let declared = handle(post(Full::new(big.clone())), &settings()).await;
        assert_eq!(declared.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let chunked = handle(post(Chunked(Some(big))), &settings()).await;
        assert_eq!(chunked.status(), StatusCode::PAYLOAD_TOO_LARGE);
        let small = handle(post(Chunked(Some(Bytes::from_static(b"{}")))), &settings()).await;
        assert_eq!(small.status(), StatusCode::BAD_REQUEST);
    }

    #[tokio::test]
    async fn routes() {
        let mut get = Request::new(Full::new(Bytes::new()));
        *get.uri_mut() = hyper::Uri::from_static("/mutate");
        let response = handle(get, &settings()).await;
        assert_eq!(response.status(), StatusCode::METHOD_NOT_ALLOWED);
        assert_eq!(response.headers()[ALLOW], "POST");

        let mut other = Request::new(Full::new(Bytes::new()));
        *other.uri_mut() = hyper::Uri::from_static("/mutate/x");
        assert_eq!(
            handle(other, &settings()).await.status(),
            StatusCode::NOT_FOUND
        );

        let mut health = Request::new(Full::new(Bytes::new()));
        *health.uri_mut() = hyper::Uri::from_static("/healthz");
        let response = handle(health, &settings()).await;
        assert_eq!(response.status(), StatusCode::OK);
        let body = response.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"ok");
    }
}
