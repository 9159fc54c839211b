//! The admission webhook driven with real AdmissionReview documents, and served over real TLS.
//!
//! Every review is built in code from one base document (`tests/fixtures/admission/
//! pod_review.json`, a ReplicaSet's pod annotated for injection): each variant function below
//! makes the one or two edits its case is about.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::{Method, Request, StatusCode};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use k8s_openapi::api::core::v1::Pod;
use serde_json::{Map, Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_rustls::rustls;
use toolgate::injector::{
    InjectorArgs, InjectorError, InjectorSettings, MAX_REVIEW_BYTES, review, serve, serve_on,
    tls_config,
};

const IMAGE: &str = "ghcr.io/example/toolgate:1.4.0";

fn settings() -> InjectorSettings {
    InjectorSettings {
        image: IMAGE.to_owned(),
        config_map: "toolgate".to_owned(),
        admin_secret: "toolgate-admin".to_owned(),
        evidence_secret: None,
    }
}

/// What the chart passes with `evidence.existingSecret` set: `--evidence-secret`.
fn settings_with_evidence() -> InjectorSettings {
    InjectorSettings {
        evidence_secret: Some("toolgate-evidence-2026-12".to_owned()),
        ..settings()
    }
}

fn fixture_path(dir: &str, name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(dir)
        .join(name)
}

// ---------------------------------------------------------------------------------------------
// The reviews.

/// An AdmissionReview document, and its name for the messages of the checks.
struct Review {
    name: &'static str,
    doc: Value,
}

impl Review {
    /// The body the API server would send.
    fn bytes(&self) -> Vec<u8> {
        serde_json::to_vec_pretty(&self.doc).unwrap()
    }

    fn request(&mut self) -> &mut Map<String, Value> {
        self.doc["request"].as_object_mut().unwrap()
    }

    fn pod_spec(&mut self) -> &mut Map<String, Value> {
        self.doc["request"]["object"]["spec"]
            .as_object_mut()
            .unwrap()
    }

    /// Sets (or adds, last) a pod annotation.
    fn annotate(mut self, key: &str, value: &str) -> Review {
        self.doc["request"]["object"]["metadata"]["annotations"][key] = json!(value);
        self
    }
}

/// The base review with its own uid `11111111-0000-4000-8000-<n, 12 digits>`: a CREATE of a
/// ReplicaSet's pod in `agents` annotated `toolgate.dev/inject: "true"`, with two containers
/// (`agent`, `log-shipper`), two init containers and a projected service account volume.
fn base(name: &'static str, n: u32) -> Review {
    let text = std::fs::read(fixture_path("admission", "pod_review.json")).unwrap();
    let mut doc: Value = serde_json::from_slice(&text).unwrap();
    doc["request"]["uid"] = json!(format!("11111111-0000-4000-8000-{n:012}"));
    Review { name, doc }
}

/// To inject as a native sidecar (the default): first of the init containers.
fn inject_native() -> Review {
    base("inject_native", 1)
}

/// To inject, into a pod with neither init containers nor volumes.
fn inject_native_bare() -> Review {
    let mut r = base("inject_native_bare", 2);
    r.pod_spec().shift_remove("volumes");
    r.pod_spec().shift_remove("initContainers");
    r
}

/// To inject as a regular container, appended to the containers.
fn inject_regular() -> Review {
    base("inject_regular", 3).annotate("toolgate.dev/native-sidecar", "false")
}

/// To inject with the sidecar's resources and config map set by annotations.
fn inject_overrides() -> Review {
    base("inject_overrides", 4)
        .annotate("toolgate.dev/cpu", "250m")
        .annotate("toolgate.dev/memory", "128Mi")
        .annotate("toolgate.dev/config-map", "research-toolgate")
}

/// Without the `toolgate.dev/inject` annotation.
fn not_annotated() -> Review {
    let mut r = base("not_annotated", 5);
    r.doc["request"]["object"]["metadata"]["annotations"]
        .as_object_mut()
        .unwrap()
        .shift_remove("toolgate.dev/inject");
    r
}

/// Annotated `toolgate.dev/inject: "false"`.
fn inject_false() -> Review {
    base("inject_false", 6).annotate("toolgate.dev/inject", "false")
}

/// Already marked `toolgate.dev/injected: "true"`.
fn already_injected() -> Review {
    base("already_injected", 7).annotate("toolgate.dev/injected", "true")
}

/// With a container already named `toolgate`.
fn has_toolgate_container() -> Review {
    let mut r = base("has_toolgate_container", 8);
    r.pod_spec()["containers"].as_array_mut().unwrap().push(
        json!({"name": "toolgate", "image": "ghcr.io/example/toolgate:0.9", "resources": {}}),
    );
    r
}

/// With an init container already named `toolgate`.
fn has_toolgate_init_container() -> Review {
    let mut r = base("has_toolgate_init_container", 9);
    r.pod_spec()["initContainers"]
        .as_array_mut()
        .unwrap()
        .insert(
            0,
            json!({"name": "toolgate", "image": "ghcr.io/example/toolgate:0.9", "restartPolicy": "Always"}),
        );
    r
}

/// A memory annotation that is not a quantity.
fn bad_quantity() -> Review {
    base("bad_quantity", 10).annotate("toolgate.dev/memory", "lots")
}

/// A negative cpu annotation.
fn negative_cpu() -> Review {
    base("negative_cpu", 11).annotate("toolgate.dev/cpu", "-100m")
}

/// A pod whose `containers` is a string.
fn malformed_pod() -> Review {
    let mut r = base("malformed_pod", 12);
    r.pod_spec()["containers"] = json!("agent");
    r
}

/// A DELETE: no object, the pod as `oldObject`.
fn delete_operation() -> Review {
    let mut r = base("delete_operation", 13);
    let request = r.request();
    request["operation"] = json!("DELETE");
    request["oldObject"] = request["object"].take();
    request["options"]["kind"] = json!("DeleteOptions");
    r
}

/// The CREATE of an annotated ConfigMap, not a pod.
fn create_configmap() -> Review {
    let mut r = base("create_configmap", 14);
    let request = r.request();
    for field in ["kind", "requestKind"] {
        request[field]["kind"] = json!("ConfigMap");
    }
    for field in ["resource", "requestResource"] {
        request[field]["resource"] = json!("configmaps");
    }
    request["object"] = json!({
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "c", "annotations": {"toolgate.dev/inject": "true"}},
        "data": {"a": "b"},
    });
    r
}

/// An envelope of `admission.k8s.io/v1beta1`.
fn wrong_api_version() -> Review {
    let mut r = base("wrong_api_version", 15);
    r.doc["apiVersion"] = json!("admission.k8s.io/v1beta1");
    r
}

/// A request without a uid.
fn missing_uid() -> Review {
    let mut r = inject_native();
    r.name = "missing_uid";
    r.request().shift_remove("uid");
    r
}

/// A body cut short: not JSON.
const NOT_JSON: &[u8] = br#"{"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "11111111-0000-4000-8000-0000000000"#;

// ---------------------------------------------------------------------------------------------
// Checks.

/// Reviews a document and returns the HTTP status and the parsed body.
fn run(r: &Review) -> (StatusCode, Value) {
    let (status, body) = review(&r.bytes(), &settings());
    let body = serde_json::from_slice(&body).expect("every answer is JSON");
    (status, body)
}

/// Reviews a document that must be answered 200, checks the envelope and the uid echo, and
/// returns the `response` object.
fn answer(r: &Review) -> Value {
    let name = r.name;
    let (status, body) = run(r);
    assert_eq!(status, StatusCode::OK, "{name}: {body}");
    assert_eq!(body["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(body["kind"], "AdmissionReview");
    assert_eq!(
        body["response"]["uid"], r.doc["request"]["uid"],
        "{name}: uid echoed"
    );
    body["response"].clone()
}

fn assert_allowed_without_patch(r: &Review) {
    let name = r.name;
    let response = answer(r);
    assert_eq!(response["allowed"], true, "{name}: {response}");
    assert!(response.get("patch").is_none(), "{name}: no patch");
    assert!(response.get("patchType").is_none(), "{name}: no patch type");
}

fn assert_denied(r: &Review, message_part: &str) {
    let name = r.name;
    let response = answer(r);
    assert_eq!(response["allowed"], false, "{name}: {response}");
    assert!(response.get("patch").is_none());
    let message = response["status"]["message"].as_str().unwrap();
    assert!(
        message.contains(message_part),
        "{name}: {message:?} should mention {message_part:?}"
    );
    assert_eq!(response["status"]["code"], 400);
}

fn assert_bad_request(name: &str, body: &[u8]) {
    let (status, body) = review(body, &settings());
    let body: Value = serde_json::from_slice(&body).expect("every answer is JSON");
    assert_eq!(status, StatusCode::BAD_REQUEST, "{name}: {body}");
    assert!(body["error"].is_string(), "{name}: {body}");
}

/// The JSONPatch operations of an answer.
fn patch_of(response: &Value) -> json_patch::Patch {
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch");
    let encoded = response["patch"]
        .as_str()
        .expect("patch is a base64 string");
    let decoded = BASE64.decode(encoded).unwrap();
    serde_json::from_slice(&decoded).unwrap()
}

/// Applies the answer's patch to the review's pod, as the API server would.
fn patched_pod(r: &Review) -> (Value, Value) {
    let original = r.doc["request"]["object"].clone();
    let patch = patch_of(&answer(r));
    for op in &patch.0 {
        assert!(
            matches!(op, json_patch::PatchOperation::Add(_)),
            "only add ops: {op:?}"
        );
    }
    let mut pod = original.clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    // Still a well-formed Pod after the patch.
    serde_json::from_value::<Pod>(pod.clone()).unwrap();
    (original, pod)
}

enum Placement {
    Native,
    Regular,
}

/// Removes exactly what the injector is allowed to add; what is left must be the original pod.
fn strip_injection(original: &Value, pod: &Value, placement: &Placement) -> Value {
    let mut stripped = pod.clone();
    let spec = stripped["spec"].as_object_mut().unwrap();
    let (field, index) = match placement {
        Placement::Native => ("initContainers", 0),
        Placement::Regular => (
            "containers",
            spec["containers"].as_array().unwrap().len() - 1,
        ),
    };
    spec.get_mut(field)
        .unwrap()
        .as_array_mut()
        .unwrap()
        .remove(index);
    let volumes = spec.get_mut("volumes").unwrap().as_array_mut().unwrap();
    volumes.pop();
    for field in ["initContainers", "volumes"] {
        if original["spec"].get(field).is_none() {
            assert_eq!(spec[field], json!([]), "{field} created with one entry");
            spec.remove(field);
        }
    }
    let annotations = stripped["metadata"]["annotations"].as_object_mut().unwrap();
    assert_eq!(
        annotations.remove("toolgate.dev/injected"),
        Some(json!("true"))
    );
    stripped
}

fn named<'a>(list: &'a Value, name: &str) -> &'a Value {
    list.as_array()
        .unwrap()
        .iter()
        .find(|item| item["name"] == name)
        .unwrap_or_else(|| panic!("no {name} in {list}"))
}

/// Checks the sidecar container field by field.
fn assert_sidecar(container: &Value, placement: &Placement, cpu: &str, memory: &str) {
    assert_eq!(container["name"], "toolgate");
    assert_eq!(container["image"], IMAGE);
    assert_eq!(
        container["args"],
        json!(["serve", "--config", "/etc/toolgate/toolgate.yaml"])
    );
    match placement {
        Placement::Native => assert_eq!(container["restartPolicy"], "Always"),
        Placement::Regular => assert!(container.get("restartPolicy").is_none()),
    }
    assert_eq!(
        container["ports"],
        json!([
            {"name": "agent", "containerPort": 15001, "protocol": "TCP"},
            {"name": "admin", "containerPort": 15002, "protocol": "TCP"},
            {"name": "telemetry", "containerPort": 15090, "protocol": "TCP"},
        ])
    );
    assert_eq!(
        container["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": 15090})
    );
    assert_eq!(
        container["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": 15090})
    );
    assert_eq!(
        container["startupProbe"]["httpGet"],
        json!({"path": "/healthz", "port": 15090})
    );
    let security = &container["securityContext"];
    assert_eq!(security["runAsNonRoot"], true);
    assert_eq!(security["readOnlyRootFilesystem"], true);
    assert_eq!(security["allowPrivilegeEscalation"], false);
    assert_eq!(security["capabilities"], json!({"drop": ["ALL"]}));
    assert_eq!(
        container["env"],
        json!([{
            "name": "TOOLGATE_ADMIN_TOKEN",
            "valueFrom": {"secretKeyRef": {"name": "toolgate-admin", "key": "token"}},
        }])
    );
    assert_eq!(
        container["volumeMounts"],
        json!([{"name": "toolgate-config", "mountPath": "/etc/toolgate", "readOnly": true}])
    );
    assert_eq!(
        container["resources"],
        json!({"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}})
    );
}

fn assert_config_volume(pod: &Value, config_map: &str) {
    let volume = named(&pod["spec"]["volumes"], "toolgate-config");
    assert_eq!(
        volume,
        &json!({"name": "toolgate-config", "configMap": {"name": config_map}})
    );
    assert_eq!(
        pod["spec"]["volumes"].as_array().unwrap().last(),
        Some(volume)
    );
}

#[test]
fn native_sidecar_goes_before_existing_init_containers() {
    let (original, pod) = patched_pod(&inject_native());
    let init = pod["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 3);
    assert_sidecar(&init[0], &Placement::Native, "50m", "64Mi");
    assert_eq!(
        init[1..],
        original["spec"]["initContainers"].as_array().unwrap()[..]
    );
    assert_eq!(pod["spec"]["containers"], original["spec"]["containers"]);
    assert_config_volume(&pod, "toolgate");
    assert_eq!(
        pod["metadata"]["annotations"]["toolgate.dev/injected"],
        "true"
    );
    assert_eq!(
        strip_injection(&original, &pod, &Placement::Native),
        original
    );
}

#[test]
fn native_sidecar_creates_missing_arrays() {
    let (original, pod) = patched_pod(&inject_native_bare());
    assert!(original["spec"].get("initContainers").is_none());
    assert!(original["spec"].get("volumes").is_none());
    let init = pod["spec"]["initContainers"].as_array().unwrap();
    assert_eq!(init.len(), 1);
    assert_sidecar(&init[0], &Placement::Native, "50m", "64Mi");
    assert_eq!(pod["spec"]["volumes"].as_array().unwrap().len(), 1);
    assert_config_volume(&pod, "toolgate");
    assert_eq!(
        strip_injection(&original, &pod, &Placement::Native),
        original
    );
}

#[test]
fn native_sidecar_false_appends_to_containers() {
    let (original, pod) = patched_pod(&inject_regular());
    let containers = pod["spec"]["containers"].as_array().unwrap();
    let original_containers = original["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), original_containers.len() + 1);
    assert_eq!(
        containers[..original_containers.len()],
        original_containers[..]
    );
    assert_sidecar(
        containers.last().unwrap(),
        &Placement::Regular,
        "50m",
        "64Mi",
    );
    assert_eq!(
        pod["spec"]["initContainers"],
        original["spec"]["initContainers"]
    );
    assert_config_volume(&pod, "toolgate");
    assert_eq!(
        strip_injection(&original, &pod, &Placement::Regular),
        original
    );
}

#[test]
fn annotations_override_resources_and_config_map() {
    let (original, pod) = patched_pod(&inject_overrides());
    assert_sidecar(
        &pod["spec"]["initContainers"][0],
        &Placement::Native,
        "250m",
        "128Mi",
    );
    assert_config_volume(&pod, "research-toolgate");
    assert_eq!(
        strip_injection(&original, &pod, &Placement::Native),
        original
    );
}

#[test]
fn evidence_secret_is_mounted_read_only_into_the_sidecar() {
    let evidence_mount = json!({
        "name": "toolgate-evidence",
        "mountPath": "/var/run/secrets/toolgate/evidence",
        "readOnly": true,
    });
    for (r, placement) in [
        (inject_native(), Placement::Native),
        (inject_native_bare(), Placement::Native),
        (inject_regular(), Placement::Regular),
    ] {
        let name = r.name;
        let (status, body) = review(&r.bytes(), &settings_with_evidence());
        assert_eq!(status, StatusCode::OK, "{name}");
        let body: Value = serde_json::from_slice(&body).unwrap();
        let patch = patch_of(&body["response"]);
        let ops: Vec<String> = patch
            .0
            .iter()
            .map(|op| match op {
                json_patch::PatchOperation::Add(add) => add.path.to_string(),
                other => panic!("{name}: unexpected op {other:?}"),
            })
            .collect();
        let original = r.doc["request"]["object"].clone();
        let volume_ops = if original["spec"].get("volumes").is_some() {
            vec!["/spec/volumes/-", "/spec/volumes/-"]
        } else {
            vec!["/spec/volumes"]
        };
        assert_eq!(ops[1..ops.len() - 1], volume_ops, "{name}: {ops:?}");
        let mut pod = original.clone();
        json_patch::patch(&mut pod, &patch).unwrap();
        serde_json::from_value::<Pod>(pod.clone()).unwrap();

        let volumes = pod["spec"]["volumes"].as_array().unwrap();
        let original_volumes = original["spec"]["volumes"]
            .as_array()
            .map_or(&[][..], Vec::as_slice);
        assert_eq!(volumes[..original_volumes.len()], original_volumes[..]);
        assert_eq!(
            volumes[original_volumes.len()..],
            [
                json!({"name": "toolgate-config", "configMap": {"name": "toolgate"}}),
                json!({
                    "name": "toolgate-evidence",
                    "secret": {"secretName": "toolgate-evidence-2026-12"},
                }),
            ],
            "{name}"
        );
        let (sidecar, others) = match placement {
            Placement::Native => (
                &pod["spec"]["initContainers"][0],
                pod["spec"]["containers"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .chain(pod["spec"]["initContainers"].as_array().unwrap()[1..].iter()),
            ),
            Placement::Regular => {
                let containers = pod["spec"]["containers"].as_array().unwrap();
                (
                    containers.last().unwrap(),
                    containers[..containers.len() - 1]
                        .iter()
                        .chain(pod["spec"]["initContainers"].as_array().unwrap()[..].iter()),
                )
            }
        };
        assert_eq!(sidecar["name"], "toolgate", "{name}");
        assert_eq!(
            sidecar["volumeMounts"],
            json!([
                {"name": "toolgate-config", "mountPath": "/etc/toolgate", "readOnly": true},
                evidence_mount,
            ]),
            "{name}"
        );
        for container in others {
            let mounts = container["volumeMounts"]
                .as_array()
                .map_or(&[][..], Vec::as_slice);
            assert!(
                mounts.iter().all(|m| m["name"] != "toolgate-evidence"),
                "{name}: {} mounts the evidence key",
                container["name"]
            );
        }
    }
}

#[test]
fn evidence_secret_refuses_a_pod_with_its_own_evidence_volume() {
    let mut r = base("own_evidence_volume", 30);
    r.pod_spec()["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "toolgate-evidence", "emptyDir": {}}));
    let (status, body) = review(&r.bytes(), &settings_with_evidence());
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).unwrap();
    let response = &body["response"];
    assert_eq!(response["allowed"], false, "{response}");
    assert!(response.get("patch").is_none());
    assert!(
        response["status"]["message"]
            .as_str()
            .unwrap()
            .contains("toolgate-evidence"),
        "{response}"
    );
}

#[test]
fn injected_annotation_pointer_is_escaped() {
    let patch = patch_of(&answer(&inject_native()));
    let paths: Vec<String> = patch
        .0
        .iter()
        .map(|op| match op {
            json_patch::PatchOperation::Add(add) => add.path.to_string(),
            other => panic!("unexpected op {other:?}"),
        })
        .collect();
    assert_eq!(
        paths,
        [
            "/spec/initContainers/0",
            "/spec/volumes/-",
            "/metadata/annotations/toolgate.dev~1injected",
        ]
    );
}

#[test]
fn pods_that_are_not_to_be_injected_pass_unchanged() {
    for r in [
        not_annotated(),
        inject_false(),
        already_injected(),
        has_toolgate_container(),
        has_toolgate_init_container(),
        delete_operation(),
        create_configmap(),
    ] {
        assert_allowed_without_patch(&r);
    }
}

#[test]
fn bad_quantities_are_denied() {
    assert_denied(&bad_quantity(), "toolgate.dev/memory");
    assert_denied(&bad_quantity(), "\"lots\" is not a Kubernetes quantity");
    assert_denied(&negative_cpu(), "toolgate.dev/cpu");
}

#[test]
fn malformed_pod_is_denied_not_rejected() {
    assert_denied(&malformed_pod(), "not a well-formed Pod");
}

#[test]
fn bad_reviews_get_400() {
    assert_bad_request("not_json", NOT_JSON);
    for r in [wrong_api_version(), missing_uid()] {
        assert_bad_request(r.name, &r.bytes());
    }
    let mut numeric_uid = inject_native().doc;
    numeric_uid["request"]["uid"] = json!(42);
    let (status, _) = review(numeric_uid.to_string().as_bytes(), &settings());
    assert_eq!(status, StatusCode::BAD_REQUEST);
    for body in [
        &b""[..],
        b"null",
        b"[]",
        b"\"AdmissionReview\"",
        b"\xff\xfe",
    ] {
        assert_eq!(review(body, &settings()).0, StatusCode::BAD_REQUEST);
    }
}

#[test]
fn odd_but_valid_annotations() {
    let mut review_doc = inject_native().doc;
    let annotations = &mut review_doc["request"]["object"]["metadata"]["annotations"];
    annotations["toolgate.dev/config-map"] = json!("Not_A_Name");
    let (status, body) = review(review_doc.to_string().as_bytes(), &settings());
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["response"]["allowed"], false);
    assert!(
        body["response"]["status"]["message"]
            .as_str()
            .unwrap()
            .contains("toolgate.dev/config-map")
    );

    // A pod that already mounts a volume of our name is refused rather than made invalid.
    let mut review_doc = inject_native().doc;
    review_doc["request"]["object"]["spec"]["volumes"]
        .as_array_mut()
        .unwrap()
        .push(json!({"name": "toolgate-config", "emptyDir": {}}));
    let (_, body) = review(review_doc.to_string().as_bytes(), &settings());
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(body["response"]["allowed"], false);
}

/// The envelope checks (apiVersion `admission.k8s.io/v1`, kind `AdmissionReview`, a request with
/// a string uid), computed independently of the injector.
fn envelope_ok(doc: &Value) -> bool {
    doc["apiVersion"] == "admission.k8s.io/v1"
        && doc["kind"] == "AdmissionReview"
        && doc["request"].is_object()
        && doc["request"]["uid"].is_string()
}

fn pointers(value: &Value, at: String, out: &mut Vec<String>) {
    match value {
        Value::Object(map) => {
            for (key, child) in map {
                let escaped = key.replace('~', "~0").replace('/', "~1");
                pointers(child, format!("{at}/{escaped}"), out);
            }
        }
        Value::Array(items) => {
            for (index, child) in items.iter().enumerate() {
                pointers(child, format!("{at}/{index}"), out);
            }
        }
        _ => {}
    }
    out.push(at);
}

/// Replaces every node of an injectable review, one at a time, with values of every JSON type:
/// the answer is always 400 (exactly when the envelope is broken) or 200 with the uid echoed,
/// and a patch, when there is one, applies cleanly to the object that was sent.
#[test]
fn never_panics_on_mangled_reviews() {
    let original = inject_regular().doc;
    let mut paths = Vec::new();
    pointers(&original, String::new(), &mut paths);
    let replacements = [
        json!(null),
        json!(true),
        json!(0),
        json!(-1),
        json!(1.5),
        json!(""),
        json!("x"),
        json!("true"),
        json!([]),
        json!([1, "a"]),
        json!({}),
        json!({"name": "toolgate"}),
    ];
    let mut patched = 0;
    for path in &paths {
        for replacement in &replacements {
            let mut doc = original.clone();
            *doc.pointer_mut(path).unwrap() = replacement.clone();
            let (status, body) = review(doc.to_string().as_bytes(), &settings());
            let body: Value = serde_json::from_slice(&body).unwrap();
            if !envelope_ok(&doc) {
                assert_eq!(status, StatusCode::BAD_REQUEST, "{path} = {replacement}");
                continue;
            }
            assert_eq!(status, StatusCode::OK, "{path} = {replacement}: {body}");
            let response = &body["response"];
            assert_eq!(response["uid"], doc["request"]["uid"]);
            if response.get("patch").is_some() {
                let mut pod = doc["request"]["object"].clone();
                json_patch::patch(&mut pod, &patch_of(response))
                    .unwrap_or_else(|e| panic!("{path} = {replacement}: {e}"));
                patched += 1;
            }
        }
    }
    assert!(patched > 0);
}

#[test]
fn never_panics_on_truncated_bodies() {
    let body = inject_native().bytes();
    for end in 0..body.len() {
        let (status, _) = review(&body[..end], &settings());
        assert!(
            status == StatusCode::BAD_REQUEST || status == StatusCode::OK,
            "{end}"
        );
    }
}

// ---------------------------------------------------------------------------------------------
// Over TLS.
// ---------------------------------------------------------------------------------------------

fn client_tls() -> rustls::ClientConfig {
    let pem = std::fs::read(fixture_path("tls", "server.pem")).unwrap();
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls_pemfile::certs(&mut pem.as_slice()) {
        roots.add(cert.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth()
}

fn server_tls() -> Arc<rustls::ServerConfig> {
    tls_config(
        &fixture_path("tls", "server.pem"),
        &fixture_path("tls", "server.key"),
    )
    .unwrap()
}

#[tokio::test]
async fn serves_reviews_over_tls() {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = tokio::spawn(serve_on(listener, server_tls(), settings(), async {
        let _ = stopped.await;
    }));

    // A client that does not speak TLS fails its handshake; the server carries on.
    let mut plain = TcpStream::connect(addr).await.unwrap();
    plain
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut ignored = Vec::new();
    let _ = plain.read_to_end(&mut ignored).await;

    let https = hyper_rustls::HttpsConnectorBuilder::new()
        .with_tls_config(client_tls())
        .https_only()
        .enable_http1()
        .build();
    let client: Client<_, Full<Bytes>> = Client::builder(TokioExecutor::new()).build(https);
    let base = format!("https://localhost:{}", addr.port());
    let send = |method: Method, path: &str, body: Vec<u8>| {
        let request = Request::builder()
            .method(method)
            .uri(format!("{base}{path}"))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body)))
            .unwrap();
        let client = client.clone();
        async move {
            let response = client.request(request).await.unwrap();
            let status = response.status();
            let body = response.into_body().collect().await.unwrap().to_bytes();
            (status, body)
        }
    };

    let (status, body) = send(Method::GET, "/healthz", Vec::new()).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(&body[..], b"ok");

    let (status, body) = send(Method::POST, "/mutate?timeout=10s", inject_native().bytes()).await;
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        body["response"]["uid"],
        "11111111-0000-4000-8000-000000000001"
    );
    assert_eq!(body["response"]["allowed"], true);
    assert_eq!(body["response"]["patchType"], "JSONPatch");
    let mut pod = inject_native().doc["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch_of(&body["response"])).unwrap();
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "toolgate");

    let (status, _) = send(Method::POST, "/mutate", NOT_JSON.to_vec()).await;
    assert_eq!(status, StatusCode::BAD_REQUEST);
    let (status, _) = send(Method::GET, "/metrics", Vec::new()).await;
    assert_eq!(status, StatusCode::NOT_FOUND);

    // A declared body over the cap is answered before it is sent.
    let connector = tokio_rustls::TlsConnector::from(Arc::new(client_tls()));
    let tcp = TcpStream::connect(addr).await.unwrap();
    let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
    let mut tls = connector.connect(name, tcp).await.unwrap();
    let head = format!(
        "POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
        MAX_REVIEW_BYTES + 1
    );
    tls.write_all(head.as_bytes()).await.unwrap();
    let mut status_line = [0u8; 12];
    tls.read_exact(&mut status_line).await.unwrap();
    assert_eq!(&status_line, b"HTTP/1.1 413");

    // Shutdown stops the server even with the client's idle keep-alive connection open.
    stop.send(()).unwrap();
    tokio::time::timeout(Duration::from_secs(5), server)
        .await
        .expect("server stops within the drain bound")
        .unwrap();
    drop(client);
}

#[tokio::test]
async fn serve_refuses_bad_settings_and_tls_files() {
    let args = |settings: InjectorSettings, key: &str| InjectorArgs {
        listen: "127.0.0.1:0".parse().unwrap(),
        tls_cert: fixture_path("tls", "server.pem"),
        tls_key: fixture_path("tls", key),
        settings,
    };
    let bad = InjectorSettings {
        config_map: String::new(),
        ..settings()
    };
    assert!(matches!(
        serve(args(bad, "server.key"), async {}).await,
        Err(InjectorError::Settings {
            name: "config-map",
            ..
        })
    ));
    let bad_evidence = InjectorSettings {
        evidence_secret: Some("Toolgate_Evidence".to_owned()),
        ..settings()
    };
    assert!(matches!(
        serve(args(bad_evidence, "server.key"), async {}).await,
        Err(InjectorError::Settings {
            name: "evidence-secret",
            ..
        })
    ));
    assert!(matches!(
        serve(args(settings(), "missing.key"), async {}).await,
        Err(InjectorError::TlsFile { what: "key", .. })
    ));
    // The certificate is no key.
    assert!(matches!(
        serve(args(settings(), "server.pem"), async {}).await,
        Err(InjectorError::TlsFile { what: "key", .. })
    ));
    // Valid everything, immediate shutdown: a clean stop.
    assert!(
        serve(args(settings(), "server.key"), async {})
            .await
            .is_ok()
    );
}

#[test]
fn minimal_hand_written_review_is_judged_on_its_pod() {
    // No userInfo, kind or resource: what a hand-written review or a test tool sends.
    let mut doc = inject_native().doc;
    let request = doc["request"].as_object_mut().unwrap();
    for key in [
        "userInfo",
        "kind",
        "resource",
        "requestKind",
        "requestResource",
    ] {
        request.remove(key);
    }
    let (status, body) = review(doc.to_string().as_bytes(), &settings());
    assert_eq!(status, StatusCode::OK);
    let body: Value = serde_json::from_slice(&body).unwrap();
    let response = &body["response"];
    assert_eq!(response["uid"], doc["request"]["uid"]);
    assert_eq!(response["allowed"], true, "{response}");
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = patch_of(response);
    let mut pod = doc["request"]["object"].clone();
    json_patch::patch(&mut pod, &patch).unwrap();
    assert_eq!(pod["spec"]["initContainers"][0]["name"], "toolgate");
}
