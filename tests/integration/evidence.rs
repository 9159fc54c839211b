//! Signed evidence: the JWK Set, a run's bundle checked offline against it and the records, and
//! records changed in the store: never facts, always counted.

use std::sync::Arc;

use redis::cluster_async::ClusterConnection;
use serde_json::{Value, json};
use toolgate::evidence::jws;
use toolgate::ids::RunId;
use toolgate::store::memory::MemoryStore;
use toolgate::store::{self, Store};

use crate::boundary::{Env, assert_admin_error, assert_ready, on_both_stores};
use crate::redis::{q, raw};
use crate::store::{new_run, projecting, ready, sealer};
use crate::support::redis_cluster;
use crate::support::sidecar::{Reply, Sidecar};

on_both_stores!(bundle_verifies_offline_against_the_jwks);

async fn get(
    sc: &Sidecar,
    listener: std::net::SocketAddr,
    path: &str,
    token: Option<&str>,
) -> Reply {
    sc.send("GET", format!("http://{listener}{path}"), token, &[], "")
        .await
}

/// The bundle is the facts of the moment, signed; `toolgate verify`'s check passes on it, with
/// the invocation bodies as records too.
async fn bundle_verifies_offline_against_the_jwks(store_yaml: String) {
    let env = Env::start(&store_yaml).await;
    let sc = &env.sc;
    let run = env.run(json!({})).await;
    assert_ready(
        &env.call(&run, "call:a", "search", json!({"q": "redis"}))
            .await,
        "call:a",
        "EVIDENCE_FOUND",
    );
    let failed = env.call(&run, "call_b", "fail", json!({})).await;
    assert_eq!(failed.status, 502, "{}", failed.raw);
    assert_ready(
        &env.call(&run, "call_c", "empty", json!({})).await,
        "call_c",
        "NO_EVIDENCE",
    );

    // The JWK Set: public, the same on the admin and the telemetry listener.
    let admin_jwks = get(sc, sc.admin, "/.well-known/jwks.json", None).await;
    assert_eq!(admin_jwks.status, 200, "{}", admin_jwks.raw);
    let telemetry_jwks = get(sc, sc.telemetry, "/.well-known/jwks.json", None).await;
    assert_eq!(telemetry_jwks.raw, admin_jwks.raw);
    let key = &admin_jwks.body["keys"][0];
    let mut members: Vec<&String> = key.as_object().expect("jwk").keys().collect();
    members.sort();
    assert_eq!(
        members,
        ["alg", "crv", "kid", "kty", "use", "x"],
        "never a private part"
    );

    // The bundle, checked the way `toolgate verify` checks it.
    let path = format!("/v1/runs/{}/evidence", run.id);
    let r = sc.admin("GET", &path, None).await;
    assert_eq!(r.status, 200, "{}", r.raw);
    let verified = jws::verify(r.raw.as_bytes(), admin_jwks.raw.as_bytes(), None).expect("valid");
    assert_eq!(
        (verified.run_id.as_str(), verified.facts),
        (run.id.as_str(), 2)
    );
    assert_eq!(verified.kid, key["kid"].as_str().expect("kid"));
    let s = &verified.statement;
    let mut fields: Vec<&String> = s.as_object().expect("statement").keys().collect();
    fields.sort();
    assert_eq!(
        fields,
        [
            "excluded",
            "facts",
            "iss",
            "issued_at",
            "run_id",
            "state",
            "tampered",
            "typ"
        ]
    );
    assert_eq!(
        (s["iss"].as_str(), s["state"].as_str()),
        (Some("toolgate"), Some("ACTIVE"))
    );
    assert_eq!(
        (s["excluded"].as_u64(), s["tampered"].as_u64()),
        (Some(1), Some(0))
    );

    // The same facts, in the same order, as GET …/facts.
    let facts = env.facts(&run.id).await;
    assert_eq!(facts["tampered"], 0);
    let listed = facts["facts"].as_array().expect("facts");
    for (i, (signed, fact)) in s["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .zip(listed)
        .enumerate()
    {
        assert_eq!(signed["seq"], i + 1);
        for field in ["tool_call_id", "tool", "evidence_status", "result"] {
            assert_eq!(signed[field], fact[field], "{field}");
        }
        let record = env
            .record_ok(&run.id, fact["tool_call_id"].as_str().expect("id"))
            .await;
        for field in [
            "request_sha256",
            "raw_sha256",
            "result_sha256",
            "created_at",
            "updated_at",
        ] {
            assert_eq!(signed[field], record[field], "{field}");
        }
    }

    // With the records: the digests match the texts the harness reads.
    let dir = std::env::temp_dir().join(format!("toolgate-records-{}", run.id));
    std::fs::create_dir_all(&dir).expect("dir");
    for id in ["call:a", "call_c"] {
        let body = env.record(&run.id, id).await;
        std::fs::write(dir.join(format!("{id}.json")), body.raw).expect("write");
    }
    jws::verify(r.raw.as_bytes(), admin_jwks.raw.as_bytes(), Some(&dir)).expect("digests match");
    let edited = env.record(&run.id, "call_c").await.raw.replace("[]", "[1]");
    std::fs::write(dir.join("call_c.json"), edited).expect("write");
    let err = jws::verify(r.raw.as_bytes(), admin_jwks.raw.as_bytes(), Some(&dir)).unwrap_err();
    assert!(
        err.contains("call_c") && err.contains("does not match"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);

    // An ended run's bundle says so; an unknown run and a missing token are refused.
    assert_eq!(
        env.admin_post(&format!("/v1/runs/{}/end", run.id))
            .await
            .status,
        200
    );
    let r = sc.admin("GET", &path, None).await;
    let ended = jws::verify(r.raw.as_bytes(), admin_jwks.raw.as_bytes(), None).expect("valid");
    assert_eq!(ended.statement["state"], "ENDED");
    let r = sc
        .admin("GET", "/v1/runs/never-created/evidence", None)
        .await;
    assert_admin_error(&r, 404, "NOT_FOUND");
    let r = get(sc, sc.admin, &path, None).await;
    assert_admin_error(&r, 401, "UNAUTHENTICATED");
}

/// Replaces the first `from` in the text at `key` with `to`, keeping the key's TTL.
async fn edit(conn: &mut ClusterConnection, key: &str, from: &str, to: &str) {
    let text: String = q(conn, &["GET", key]).await;
    assert!(text.contains(from), "{key}: {from} not in {text}");
    let forged = text.replacen(from, to, 1);
    let _: () = q(conn, &["SET", key, &forged, "KEEPTTL"]).await;
}

/// Records changed in Redis, a record copied under another id, and forged progress entries:
/// none is a fact, in `facts`, `end` or the bundle; the seal failures are counted as tampered,
/// logged and metered; every untouched record is still a fact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn records_changed_in_redis_are_never_facts() {
    let nodes = redis_cluster::shared().urls();
    let env = Env::start(&crate::support::store_yaml(Some(&nodes))).await;
    let sc = &env.sc;
    let run = env.run(json!({})).await;
    let ids = ["raw", "result", "status", "seal", "source", "kept"];
    for id in ids {
        assert_ready(
            &env.call(&run, id, "search", json!({"q": "redis"})).await,
            id,
            "EVIDENCE_FOUND",
        );
    }
    let key = |id: &str| format!("toolgate:{{{}}}:{id}", run.id);
    let mut conn = raw(redis_cluster::shared()).await;
    let c = &mut conn;
    edit(c, &key("raw"), r#"{"title":"t0""#, r#"{"title":"forged""#).await;
    edit(
        c,
        &key("result"),
        r#""total_items":7"#,
        r#""total_items":8"#,
    )
    .await;
    edit(
        c,
        &key("status"),
        r#""evidence_status":"EVIDENCE_FOUND""#,
        r#""evidence_status":"NO_EVIDENCE""#,
    )
    .await;
    let sealed: String = q(c, &["GET", &key("seal")]).await;
    let seal = serde_json::from_str::<Value>(&sealed).expect("record")["seal"]
        .as_str()
        .expect("seal")
        .to_string();
    edit(c, &key("seal"), &seal, &"0".repeat(64)).await;
    // `source` copied under a new id, and that id pushed to the progress list.
    let copied: String = q(&mut conn, &["GET", &key("source")]).await;
    let _: () = q(&mut conn, &["SET", &key("copy"), &copied]).await;
    let progress = key("progress");
    let _: i64 = q(&mut conn, &["RPUSH", &progress, "copy"]).await;
    // Progress entries no finalize wrote: an id with no record, and one that is a fact already.
    let _: i64 = q(&mut conn, &["RPUSH", &progress, "never-written", "kept"]).await;

    let before = sc
        .metric("toolgate_evidence_tampered_total", &[])
        .await
        .unwrap_or(0.0);
    let facts = env.facts(&run.id).await;
    let listed: Vec<&str> = facts["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| f["tool_call_id"].as_str().expect("id"))
        .collect();
    assert_eq!(listed, ["source", "kept"], "{facts}");
    // raw, result, status, seal and the copy failed their seal; never-written and the second
    // `kept` are only excluded.
    assert_eq!(
        (facts["excluded"].as_u64(), facts["tampered"].as_u64()),
        (Some(7), Some(5)),
        "{facts}"
    );
    let after = sc
        .metric("toolgate_evidence_tampered_total", &[])
        .await
        .expect("metric");
    assert_eq!(after - before, 5.0);

    let jwks = sc
        .send(
            "GET",
            format!("http://{}/.well-known/jwks.json", sc.admin),
            None,
            &[],
            "",
        )
        .await;
    let bundle = sc
        .admin("GET", &format!("/v1/runs/{}/evidence", run.id), None)
        .await;
    let verified = jws::verify(bundle.raw.as_bytes(), jwks.raw.as_bytes(), None).expect("valid");
    let signed: Vec<&str> = verified.statement["facts"]
        .as_array()
        .expect("facts")
        .iter()
        .map(|f| f["tool_call_id"].as_str().expect("id"))
        .collect();
    assert_eq!(signed, ["source", "kept"]);
    assert_eq!(verified.statement["tampered"], 5);

    let ended = env.admin_post(&format!("/v1/runs/{}/end", run.id)).await;
    assert_eq!(
        ended.body["facts"].as_array().map(Vec::len),
        Some(2),
        "{}",
        ended.raw
    );
    assert_eq!(ended.body["tampered"], 5);
}

/// The memory store reads back exactly what it holds: a record changed there fails its seal too.
#[tokio::test(start_paused = true)]
async fn records_changed_in_the_memory_store_are_never_facts() {
    let store = Arc::new(MemoryStore::new(600_000, sealer()));
    let run = store
        .create_run(new_run("mem-tamper", 10, &[], 1 << 20, 600_000))
        .await
        .expect("run");
    let run_id: RunId = run.run_id.clone();
    for id in ["a", "b", "c"] {
        let p = projecting(&run, id, "search");
        store
            .reserve(&p, toolgate::clock::now_ms())
            .await
            .expect("reserve");
        store.finalize(&ready(&p), 1 << 20).await.expect("finalize");
    }
    let b = store.raw_record(&run_id, "b").expect("b");
    store.put_raw_record(
        &run_id,
        "b",
        b.replacen(r#""status":"READY""#, r#""status":"ERROR""#, 1),
    );
    let entries = store
        .progress(&run_id)
        .await
        .expect("progress")
        .expect("run");
    let facts = store::facts(&run_id, entries, &sealer());
    let listed: Vec<&str> = facts
        .facts
        .iter()
        .map(|f| f.tool_call_id.as_str())
        .collect();
    assert_eq!(listed, ["a", "c"]);
    assert_eq!((facts.excluded, facts.tampered), (1, 1));
}
