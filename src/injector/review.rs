//! The admission decision, a pure function from an `AdmissionReview` body to an HTTP status and
//! body. The patch holds only `add` operations computed against the object exactly as the API
//! server sent it, so every field the webhook does not own is left as it was.

use std::collections::BTreeMap;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hyper::StatusCode;
use k8s_openapi::api::core::v1::{ConfigMapVolumeSource, Pod, SecretVolumeSource, Volume};
use kube::core::admission::{AdmissionRequest, Operation};
use kube::core::{DynamicObject, Status};
use serde::{Deserialize as _, Serialize};
use serde_json::{Map, Value, json};
use tracing::{debug, info, warn};

use super::InjectorSettings;
use super::pod::{
    self, CONFIG_VOLUME, CONTAINER_NAME, DEFAULT_CPU_REQUEST, DEFAULT_MEMORY, EVIDENCE_VOLUME,
};

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

const ADMISSION_API_VERSION: &str = "admission.k8s.io/v1";
const ADMISSION_KIND: &str = "AdmissionReview";
/// A denial message is shown to whoever created the pod; keep it readable.
const MAX_MESSAGE_CHARS: usize = 512;
/// Annotation values quoted in a message are cut to this many characters.
const MAX_QUOTED_CHARS: usize = 64;
/// Longer than any quantity a pod spec would hold; keeps the validator's input small.
const MAX_QUANTITY_LEN: usize = 64;

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
    // The evidence volume's name is only taken when there is an evidence Secret to mount.
    let evidence_secret = settings.evidence_secret.as_deref();
    let taken = [CONFIG_VOLUME]
        .into_iter()
        .chain(evidence_secret.map(|_| EVIDENCE_VOLUME));
    for name in taken {
        if spec.volumes.iter().flatten().any(|v| v.name == name) {
            return Verdict::Deny(format!(
                "pod already has a volume named {name}; toolgate cannot be injected"
            ));
        }
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

    let container = pod::sidecar(settings, cpu, memory, native);
    let mut volumes = Vec::with_capacity(2);
    volumes.push(Volume {
        name: CONFIG_VOLUME.to_owned(),
        config_map: Some(ConfigMapVolumeSource {
            name: config_map.to_owned(),
            ..ConfigMapVolumeSource::default()
        }),
        ..Volume::default()
    });
    if let Some(secret) = evidence_secret {
        // Not optional: a pod without the Secret must not start and sign with a derived key.
        volumes.push(Volume {
            name: EVIDENCE_VOLUME.to_owned(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(secret.to_owned()),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        });
    }
    let (container, volumes) = match (
        serde_json::to_value(container),
        volumes
            .into_iter()
            .map(serde_json::to_value)
            .collect::<Result<Vec<_>, _>>(),
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
    // The sidecar, one op per volume (or one creating `/spec/volumes`), the annotation.
    let mut ops = Vec::with_capacity(2 + volumes.len());
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
    ops.extend(append_all(is_array("volumes"), "/spec/volumes", volumes));
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

/// Adds `item` to the array at `array` (at `position`), or creates the array when the pod has
/// none (absent or `null`).
fn insert(exists: bool, array: &str, position: &str, item: Value) -> Value {
    if exists {
        add(format!("{array}/{position}"), item)
    } else {
        add(array.to_owned(), Value::Array(vec![item]))
    }
}

/// Appends `items`, in order, to the array at `array`: one `add` per item at `-` when the array
/// exists, else a single `add` creating it with all of them (a second `add` of the whole array
/// would replace the first).
fn append_all(exists: bool, array: &str, items: Vec<Value>) -> Vec<Value> {
    if exists {
        items
            .into_iter()
            .map(|item| add(format!("{array}/-"), item))
            .collect()
    } else {
        vec![add(array.to_owned(), Value::Array(items))]
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

pub(super) fn error_body(status: StatusCode, message: &str) -> (StatusCode, Vec<u8>) {
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

#[cfg(test)]
mod tests {
    use super::super::pod::EVIDENCE_MOUNT_PATH;
    use super::*;

    fn settings(evidence_secret: Option<&str>) -> InjectorSettings {
        InjectorSettings {
            image: "toolgate:test".to_owned(),
            config_map: "toolgate".to_owned(),
            admin_secret: "toolgate-admin".to_owned(),
            evidence_secret: evidence_secret.map(str::to_owned),
        }
    }

    /// A CREATE review of a pod annotated for injection, with these volumes (`None`: no
    /// `volumes` field at all).
    fn pod_review(volumes: Option<Value>, native: bool) -> Value {
        let mut annotations = json!({ ANNOTATION_INJECT: "true" });
        if !native {
            annotations[ANNOTATION_NATIVE_SIDECAR] = json!("false");
        }
        let mut spec = json!({
            "containers": [{
                "name": "agent",
                "image": "agent:1",
                "volumeMounts": [{"name": "data", "mountPath": "/data"}],
            }],
        });
        if let Some(volumes) = volumes {
            spec["volumes"] = volumes;
        }
        json!({
            "apiVersion": ADMISSION_API_VERSION,
            "kind": ADMISSION_KIND,
            "request": {
                "uid": "0b9c7b8e-6f57-4c1e-9d55-1c0f3e1a2b3c",
                "operation": "CREATE",
                "object": {
                    "apiVersion": "v1",
                    "kind": "Pod",
                    "metadata": {"name": "agent", "namespace": "agents", "annotations": annotations},
                    "spec": spec,
                },
            },
        })
    }

    fn response(review_doc: &Value, settings: &InjectorSettings) -> Value {
        let (status, body) = review(review_doc.to_string().as_bytes(), settings);
        assert_eq!(status, StatusCode::OK);
        let body: Value = serde_json::from_slice(&body).unwrap();
        body["response"].clone()
    }

    /// The patch's operations, and the pod they make.
    fn patched(review_doc: &Value, settings: &InjectorSettings) -> (Vec<Value>, Value) {
        let response = response(review_doc, settings);
        assert_eq!(response["allowed"], true, "{response}");
        let ops = BASE64.decode(response["patch"].as_str().unwrap()).unwrap();
        let ops: Vec<Value> = serde_json::from_slice(&ops).unwrap();
        let patch: json_patch::Patch = serde_json::from_value(Value::Array(ops.clone())).unwrap();
        let mut pod = review_doc["request"]["object"].clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        Pod::deserialize(&pod).expect("still a Pod");
        (ops, pod)
    }

    fn paths(ops: &[Value]) -> Vec<&str> {
        ops.iter().map(|op| op["path"].as_str().unwrap()).collect()
    }

    fn sidecar(pod: &Value, native: bool) -> &Value {
        let list = if native {
            "initContainers"
        } else {
            "containers"
        };
        pod["spec"][list]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == CONTAINER_NAME)
            .expect("a toolgate container")
    }

    const DATA_VOLUME: &str = "data";

    fn data_volume() -> Value {
        json!([{"name": DATA_VOLUME, "emptyDir": {}}])
    }

    #[test]
    fn evidence_secret_is_mounted_read_only_into_the_sidecar_alone() {
        let with = settings(Some("toolgate-evidence-2026"));
        for native in [true, false] {
            for volumes in [Some(data_volume()), None] {
                let had_volumes = volumes.is_some();
                let doc = pod_review(volumes, native);
                let (ops, pod) = patched(&doc, &with);
                let volumes = pod["spec"]["volumes"].as_array().unwrap();
                let tail = &volumes[volumes.len() - 2..];
                assert_eq!(
                    tail,
                    [
                        json!({"name": CONFIG_VOLUME, "configMap": {"name": "toolgate"}}),
                        json!({
                            "name": EVIDENCE_VOLUME,
                            "secret": {"secretName": "toolgate-evidence-2026"},
                        }),
                    ]
                );
                assert_eq!(volumes.len(), if had_volumes { 3 } else { 2 });
                assert_eq!(
                    sidecar(&pod, native)["volumeMounts"],
                    json!([
                        {"name": CONFIG_VOLUME, "mountPath": "/etc/toolgate", "readOnly": true},
                        {"name": EVIDENCE_VOLUME, "mountPath": EVIDENCE_MOUNT_PATH, "readOnly": true},
                    ])
                );
                // The agent container keeps its own mounts and gets no evidence mount.
                let agent = &pod["spec"]["containers"][0];
                assert_eq!(agent["name"], "agent");
                assert_eq!(
                    agent["volumeMounts"],
                    doc["request"]["object"]["spec"]["containers"][0]["volumeMounts"]
                );
                let container_path = if native {
                    "/spec/initContainers"
                } else {
                    "/spec/containers/-"
                };
                let injected = "/metadata/annotations/toolgate.dev~1injected";
                let want: Vec<&str> = if had_volumes {
                    vec![
                        container_path,
                        "/spec/volumes/-",
                        "/spec/volumes/-",
                        injected,
                    ]
                } else {
                    vec![container_path, "/spec/volumes", injected]
                };
                assert_eq!(paths(&ops), want);
            }
        }
    }

    #[test]
    fn no_evidence_volume_without_the_setting() {
        let without = settings(None);
        for volumes in [Some(data_volume()), None] {
            let (ops, pod) = patched(&pod_review(volumes, true), &without);
            assert_eq!(ops.len(), 3, "{ops:?}");
            let volumes = pod["spec"]["volumes"].as_array().unwrap();
            assert!(volumes.iter().all(|v| v["name"] != EVIDENCE_VOLUME));
            assert_eq!(volumes.last().unwrap()["name"], CONFIG_VOLUME);
            let mounts = &sidecar(&pod, true)["volumeMounts"];
            assert_eq!(
                mounts,
                &json!([{"name": CONFIG_VOLUME, "mountPath": "/etc/toolgate", "readOnly": true}])
            );
            assert!(!pod.to_string().contains(EVIDENCE_MOUNT_PATH));
        }
    }

    #[test]
    fn pod_with_its_own_evidence_volume_is_refused() {
        let volumes = json!([
            {"name": DATA_VOLUME, "emptyDir": {}},
            {"name": EVIDENCE_VOLUME, "secret": {"secretName": "theirs"}},
        ]);
        let doc = pod_review(Some(volumes), true);
        let response = response(&doc, &settings(Some("toolgate-evidence")));
        assert_eq!(response["allowed"], false, "{response}");
        assert!(response.get("patch").is_none());
        assert_eq!(response["status"]["code"], 400);
        let message = response["status"]["message"].as_str().unwrap();
        assert!(
            message.contains("already has a volume named toolgate-evidence"),
            "{message}"
        );
        // Without an evidence Secret the name is not the injector's: the pod is injected and
        // keeps its volume.
        let (_, pod) = patched(&doc, &settings(None));
        let theirs: Vec<_> = pod["spec"]["volumes"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|v| v["name"] == EVIDENCE_VOLUME)
            .collect();
        assert_eq!(
            theirs,
            [&json!({"name": EVIDENCE_VOLUME, "secret": {"secretName": "theirs"}})]
        );
    }

    #[test]
    fn pod_with_its_own_config_volume_is_still_refused() {
        let volumes = json!([{"name": CONFIG_VOLUME, "emptyDir": {}}]);
        for evidence in [None, Some("toolgate-evidence")] {
            let response = response(
                &pod_review(Some(volumes.clone()), true),
                &settings(evidence),
            );
            assert_eq!(response["allowed"], false, "{response}");
            let message = response["status"]["message"].as_str().unwrap();
            assert!(message.contains(CONFIG_VOLUME), "{message}");
        }
    }

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
}
