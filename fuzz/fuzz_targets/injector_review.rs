//! The admission decision (`injector::review`) on arbitrary bodies and on structured
//! mutations of a real pod-creation `AdmissionReview`.
//!
//! Never panics; the status is 200 or 400 and the body is JSON: `{"error"}` for a 400, an
//! `AdmissionReview` echoing the request's uid for a 200. A patch is base64 JSONPatch of `add`
//! operations that applies to the object exactly as sent, marks it injected, and a review of
//! the patched pod allows it without a second patch.
#![no_main]

mod common;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use hyper::StatusCode;
use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use serde_json::{Value, json};
use toolgate::injector::{InjectorSettings, review};

const REVIEW: &str = include_str!("../../tests/fixtures/admission/pod_review.json");

fn settings() -> InjectorSettings {
    InjectorSettings {
        image: "ghcr.io/example/toolgate:1.0".into(),
        config_map: "toolgate".into(),
        admin_secret: "toolgate-admin".into(),
        evidence_secret: Some("toolgate-evidence".into()),
    }
}

const ANNOTATIONS: &[&str] = &[
    "toolgate.dev/inject",
    "toolgate.dev/injected",
    "toolgate.dev/native-sidecar",
    "toolgate.dev/config-map",
    "toolgate.dev/cpu",
    "toolgate.dev/memory",
    "other",
];
const VALUES: &[&str] = &[
    "true",
    "false",
    "",
    "50m",
    "64Mi",
    "1e3",
    "+1",
    "-1",
    ".5",
    "1.",
    "1Mi ",
    "tool-gate",
    "Toolgate",
    "a..b",
    "\u{e9}\u{e9}",
];
/// Where in the review a mutation may write.
const POINTERS: &[&str] = &[
    "/request",
    "/request/uid",
    "/request/operation",
    "/request/kind",
    "/request/kind/kind",
    "/request/kind/group",
    "/request/kind/version",
    "/request/resource",
    "/request/subResource",
    "/request/userInfo",
    "/request/object",
    "/request/object/apiVersion",
    "/request/object/kind",
    "/request/object/metadata",
    "/request/object/metadata/annotations",
    "/request/object/spec",
    "/request/object/spec/containers",
    "/request/object/spec/containers/0",
    "/request/object/spec/containers/0/name",
    "/request/object/spec/initContainers",
    "/request/object/spec/initContainers/0/name",
    "/request/object/spec/volumes",
    "/request/object/spec/volumes/0/name",
    "/request/object/spec/containers/0/resources",
    "/apiVersion",
    "/kind",
];

/// Sets `pointer` in `doc` (its parent must exist); `None` removes it.
fn set(doc: &mut Value, pointer: &str, value: Option<Value>) {
    let Some((parent, key)) = pointer.rsplit_once('/') else {
        return;
    };
    let key = key.replace("~1", "/").replace("~0", "~");
    match (doc.pointer_mut(parent), value) {
        (Some(Value::Object(m)), Some(v)) => {
            m.insert(key, v);
        }
        (Some(Value::Object(m)), None) => {
            m.shift_remove(&key);
        }
        (Some(Value::Array(a)), v) => {
            if let Ok(i) = key.parse::<usize>()
                && i < a.len()
            {
                match v {
                    Some(v) => a[i] = v,
                    None => {
                        a.remove(i);
                    }
                }
            }
        }
        _ => {}
    }
}

fn mutate(u: &mut Unstructured<'_>, doc: &mut Value) -> Result<()> {
    match u.int_in_range(0..=7)? {
        0 | 1 => {
            // An annotation: a known key, a value known or not, sometimes not a string.
            let key = common::pick_str(u, ANNOTATIONS)?
                .replace('~', "~0")
                .replace('/', "~1");
            let value = match u.int_in_range(0..=9)? {
                0 => None,
                1 => Some(common::json_value(u, 1)?),
                _ => Some(Value::String(common::pick_str(u, VALUES)?)),
            };
            set(
                doc,
                &format!("/request/object/metadata/annotations/{key}"),
                value,
            );
        }
        2 => {
            let op = common::pick_str(u, &["CREATE", "UPDATE", "DELETE", "CONNECT", "create"])?;
            set(doc, "/request/operation", Some(Value::String(op)));
        }
        3 => {
            // A container or an init container named like the sidecar, or a volume named
            // like its config volume.
            let (array, name) = *u.choose(&[
                ("containers", "toolgate"),
                ("initContainers", "toolgate"),
                ("volumes", "toolgate-config"),
                ("containers", "x"),
                ("volumes", "x"),
            ])?;
            let item = if array == "volumes" {
                json!({"name": name, "emptyDir": {}})
            } else {
                json!({"name": name, "image": "busybox"})
            };
            let spec = doc.pointer_mut("/request/object/spec");
            if let Some(Value::Object(spec)) = spec {
                match spec.get_mut(array) {
                    Some(Value::Array(a)) => a.push(item),
                    _ => {
                        spec.insert(array.into(), Value::Array(vec![item]));
                    }
                }
            }
        }
        4 => {
            // One of the spec's arrays absent, null, empty, or not an array.
            let array = *u.choose(&["containers", "initContainers", "volumes"])?;
            let value = match u.int_in_range(0..=3)? {
                0 => None,
                1 => Some(Value::Null),
                2 => Some(json!([])),
                _ => Some(common::json_value(u, 2)?),
            };
            set(doc, &format!("/request/object/spec/{array}"), value);
        }
        5 => {
            let pointer = *u.choose(POINTERS)?;
            let value = if u.ratio(1, 4)? {
                None
            } else {
                Some(common::json_value(u, 3)?)
            };
            set(doc, pointer, value);
        }
        6 => {
            let pointer = *u.choose(POINTERS)?;
            let s = common::pick_str(u, &["", "v1", "Pod", "pods", "status", "apps/v1"])?;
            set(doc, pointer, Some(Value::String(s)));
        }
        _ => {
            // Drop the optional fields the webhook fills in itself.
            for key in [
                "userInfo",
                "kind",
                "resource",
                "requestKind",
                "requestResource",
            ] {
                if u.arbitrary()? {
                    set(doc, &format!("/request/{key}"), None);
                }
            }
        }
    }
    Ok(())
}

/// Checks one answer; returns the patched object when the answer carries a patch.
fn check(body: &[u8], status: StatusCode, answer: &[u8]) -> Option<Value> {
    assert!(
        status == StatusCode::OK || status == StatusCode::BAD_REQUEST,
        "status {status}"
    );
    let answer: Value = serde_json::from_slice(answer).expect("the answer is JSON");
    if status == StatusCode::BAD_REQUEST {
        assert!(
            answer["error"].is_string(),
            "a 400 without an error: {answer}"
        );
        return None;
    }
    let sent: Value = serde_json::from_slice(body).expect("a 200 answers JSON");
    assert_eq!(answer["apiVersion"], "admission.k8s.io/v1");
    assert_eq!(answer["kind"], "AdmissionReview");
    let response = &answer["response"];
    assert_eq!(response["uid"], sent["request"]["uid"], "the uid is echoed");
    let allowed = response["allowed"].as_bool().expect("allowed is a bool");
    if !allowed {
        let message = response["status"]["message"]
            .as_str()
            .expect("a denial message");
        assert!(
            message.chars().count() <= 513,
            "a message of {} chars",
            message.chars().count()
        );
        assert!(response.get("patch").is_none());
        return None;
    }
    let patch = response.get("patch")?;
    assert_eq!(response["patchType"], "JSONPatch");
    let patch = BASE64
        .decode(patch.as_str().expect("a base64 string"))
        .expect("base64");
    let ops: Value = serde_json::from_slice(&patch).expect("the patch is JSON");
    for op in ops.as_array().expect("an array of operations") {
        assert_eq!(op["op"], "add", "only add operations: {op}");
    }
    let patch: json_patch::Patch = serde_json::from_value(ops).expect("a JSONPatch");
    let mut object = sent["request"]["object"].clone();
    json_patch::patch(&mut object, &patch).expect("the patch applies to the object as sent");
    assert_eq!(
        object["metadata"]["annotations"]["toolgate.dev/injected"],
        "true"
    );
    Some(object)
}

fn run(data: &[u8]) -> Result<()> {
    let settings = settings();
    let mut u = Unstructured::new(data);
    let body = if u.ratio(1, 4)? {
        u.take_rest().to_vec()
    } else {
        let mut doc: Value = serde_json::from_str(REVIEW).expect("the fixture is JSON");
        for _ in 0..u.int_in_range(0..=6)? {
            mutate(&mut u, &mut doc)?;
        }
        if u.arbitrary()? {
            serde_json::to_vec_pretty(&doc)
        } else {
            serde_json::to_vec(&doc)
        }
        .expect("serializable")
    };
    let (status, answer) = review(&body, &settings);
    let Some(patched) = check(&body, status, &answer) else {
        return Ok(());
    };
    // The patched pod, sent again (a retried or re-run admission), is left alone.
    let mut again: Value = serde_json::from_slice(&body).expect("JSON");
    again["request"]["object"] = patched;
    let body = serde_json::to_vec(&again).expect("serializable");
    let (status, answer) = review(&body, &settings);
    assert!(
        check(&body, status, &answer).is_none(),
        "a patched pod patched again"
    );
    let answer: Value = serde_json::from_slice(&answer).expect("JSON");
    assert_eq!(
        answer["response"]["allowed"], true,
        "a patched pod refused: {answer}"
    );
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
