//! The bundle's JOSE: Ed25519 JWKs and their RFC 7638 thumbprints, signing a statement as a JWS
//! in the General JSON Serialization (RFC 7515, RFC 8037), and checking one offline
//! (`toolgate verify`).

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{self, Ed25519KeyPair};
use serde::Deserialize;
use serde_json::{Value, json};

use super::{b64, sha256_hex};
use crate::ids::ToolCallId;

/// The protected header's `typ`.
pub const TYP_HEADER: &str = "toolgate-evidence+json";
/// The statement's `typ`.
pub const TYP_STATEMENT: &str = "toolgate.evidence.v1";
/// The largest bundle, JWKS or record file `verify` reads.
const MAX_FILE_BYTES: u64 = 64 << 20;

/// The public JWK of an Ed25519 key.
pub fn jwk(x: &[u8; 32]) -> Value {
    json!({
        "kty": "OKP",
        "crv": "Ed25519",
        "x": b64(x),
        "kid": thumbprint(x),
        "alg": "EdDSA",
        "use": "sig",
    })
}

/// The RFC 7638 thumbprint of an Ed25519 public key: unpadded base64url of SHA-256 over its
/// required members in lexicographic order, without whitespace.
pub fn thumbprint(x: &[u8; 32]) -> String {
    let members = format!(r#"{{"crv":"Ed25519","kty":"OKP","x":"{}"}}"#, b64(x));
    b64(ring::digest::digest(&ring::digest::SHA256, members.as_bytes()).as_ref())
}

/// The protected header of every bundle, exactly.
fn protected_header(kid: &str) -> String {
    let mut out = String::with_capacity(80 + kid.len());
    out.push_str(r#"{"alg":"EdDSA","kid":"#);
    crate::log::push_json_string(&mut out, kid);
    out.push_str(r#","typ":""#);
    out.push_str(TYP_HEADER);
    out.push_str(r#""}"#);
    out
}

/// `payload` signed with `key`: `{"payload","signatures":[{"protected","signature"}]}`.
pub fn sign(key: &Ed25519KeyPair, kid: &str, payload: &[u8]) -> Vec<u8> {
    let protected = b64(protected_header(kid).as_bytes());
    let payload = b64(payload);
    let input = format!("{protected}.{payload}");
    let signature = b64(key.sign(input.as_bytes()).as_ref());
    let bundle = json!({
        "payload": payload,
        "signatures": [{"protected": protected, "signature": signature}],
    });
    serde_json::to_vec(&bundle).unwrap_or_default()
}

/// What a valid bundle says.
#[derive(Debug)]
pub struct Verified {
    pub run_id: String,
    pub facts: usize,
    pub kid: String,
    /// The statement, parsed.
    pub statement: Value,
}

/// Checks `bundle` against the keys of `jwks`, and, given `records` (a directory of
/// `<tool_call_id>.json` invocation bodies), every fact's digests against the texts there. The
/// error names the first failure.
pub fn verify(bundle: &[u8], jwks: &[u8], records: Option<&Path>) -> Result<Verified, String> {
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Bundle {
        payload: String,
        signatures: Vec<Signature>,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Signature {
        protected: String,
        signature: String,
    }
    #[derive(Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Protected {
        alg: String,
        kid: String,
        typ: String,
    }

    let bundle: Bundle =
        serde_json::from_slice(bundle).map_err(|e| format!("malformed bundle: {e}"))?;
    let [sig] = bundle.signatures.as_slice() else {
        return Err(format!(
            "malformed bundle: {} signatures, not exactly one",
            bundle.signatures.len()
        ));
    };
    let header = unb64(&sig.protected, "protected header")?;
    let protected: Protected = serde_json::from_slice(&header)
        .map_err(|e| format!("malformed bundle: protected header: {e}"))?;
    if protected.alg != "EdDSA" {
        return Err(format!("unsupported alg {:?}", protected.alg));
    }
    if protected.typ != TYP_HEADER {
        return Err(format!(
            "wrong typ {:?} in the protected header",
            protected.typ
        ));
    }
    let x = public_key(jwks, &protected.kid)?;
    let signature = unb64(&sig.signature, "signature")?;
    let input = format!("{}.{}", sig.protected, bundle.payload);
    signature::UnparsedPublicKey::new(&signature::ED25519, x)
        .verify(input.as_bytes(), &signature)
        .map_err(|_| format!("bad signature for key {}", protected.kid))?;

    let payload = unb64(&bundle.payload, "payload")?;
    let statement: Value =
        serde_json::from_slice(&payload).map_err(|e| format!("malformed bundle: payload: {e}"))?;
    if statement["typ"] != TYP_STATEMENT {
        return Err(format!("wrong typ {} in the statement", statement["typ"]));
    }
    let run_id = statement["run_id"]
        .as_str()
        .ok_or("malformed statement: no run_id")?
        .to_string();
    let facts = statement["facts"]
        .as_array()
        .ok_or("malformed statement: no facts")?;
    if let Some(dir) = records {
        for fact in facts {
            check_record(dir, &run_id, fact)?;
        }
    }
    Ok(Verified {
        run_id,
        facts: facts.len(),
        kid: protected.kid,
        statement: statement.clone(),
    })
}

fn unb64(text: &str, what: &str) -> Result<Vec<u8>, String> {
    URL_SAFE_NO_PAD
        .decode(text)
        .map_err(|_| format!("malformed bundle: {what} is not unpadded base64url"))
}

/// The 32-byte key of `kid` in a JWK Set, checked against its own thumbprint.
fn public_key(jwks: &[u8], kid: &str) -> Result<[u8; 32], String> {
    let set: Value = serde_json::from_slice(jwks).map_err(|e| format!("malformed JWKS: {e}"))?;
    let keys = set["keys"].as_array().ok_or("malformed JWKS: no keys")?;
    for key in keys {
        if key["kid"] != kid {
            continue;
        }
        if key["kty"] != "OKP" || key["crv"] != "Ed25519" {
            return Err(format!("key {kid} is not an Ed25519 key"));
        }
        let x = key["x"]
            .as_str()
            .and_then(|x| URL_SAFE_NO_PAD.decode(x).ok())
            .and_then(|x| <[u8; 32]>::try_from(x).ok())
            .ok_or_else(|| format!("key {kid} has no valid x"))?;
        if thumbprint(&x) != kid {
            return Err(format!("key {kid} is not the key its kid names"));
        }
        return Ok(x);
    }
    Err(format!("unknown kid {kid}"))
}

/// The parts of an invocation body the digests cover. A body as served is the compact JSON
/// serde_json writes (checked: it serializes back to itself), so each part's text in it is the
/// part's value serialized again.
#[derive(Deserialize)]
struct RecordParts {
    run_id: String,
    tool_call_id: String,
    tool: String,
    request: Value,
    raw_response: Value,
    agent_result: Value,
}

fn digest_of(part: &Value) -> Value {
    match part {
        Value::Null => Value::Null,
        part => Value::String(sha256_hex(part.to_string().as_bytes())),
    }
}

fn check_record(dir: &Path, run_id: &str, fact: &Value) -> Result<(), String> {
    let id = fact["tool_call_id"]
        .as_str()
        .and_then(ToolCallId::parse)
        .ok_or("malformed statement: a fact without a safe tool_call_id")?;
    let path = dir.join(format!("{id}.json"));
    let body = crate::config::read_file(&path, MAX_FILE_BYTES)?;
    let value: Value = serde_json::from_slice(&body)
        .map_err(|e| format!("record {id}: not an invocation body: {e}"))?;
    if value.to_string().as_bytes() != body.trim_ascii_end() {
        return Err(format!(
            "record {id}: not an invocation body as served (it was serialized again)"
        ));
    }
    let record: RecordParts = serde_json::from_value(value)
        .map_err(|e| format!("record {id}: not an invocation body: {e}"))?;
    if record.run_id != run_id || record.tool_call_id != id.as_str() || fact["tool"] != record.tool
    {
        return Err(format!("record {id}: belongs to another run or call"));
    }
    for (name, part) in [
        ("request_sha256", &record.request),
        ("raw_sha256", &record.raw_response),
        ("result_sha256", &record.agent_result),
    ] {
        if digest_of(part) != fact[name] {
            return Err(format!("record {id}: {name} does not match the record"));
        }
    }
    Ok(())
}

/// Reads a file for `verify`, bounded.
pub fn read(path: &Path) -> Result<Vec<u8>, String> {
    crate::config::read_file(path, MAX_FILE_BYTES)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8037, appendix A: the Ed25519 key, its thumbprint, and the JWS of "Example of
    /// Ed25519 signing" with the protected header `{"alg":"EdDSA"}`.
    const D: &str = "nWGxne_9WmC6hEr0kuwsxERJxWl7MmkZcDusAxyuf2A";
    const X: &str = "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo";
    const KID: &str = "kPrK_qmxVWaYVA9wwBF6Iuo3vVzz7TxHCTwXBygrS4k";
    const SIGNATURE: &str =
        "hgyY0il_MGCjP0JzlnLWG1PPOt7-09PGcvMg3AIbQR6dWbhijcNR4ki4iylGjg5BhVsPt9g7sVvpAr_MuM0KAg";

    fn rfc_key() -> Ed25519KeyPair {
        let d = URL_SAFE_NO_PAD.decode(D).unwrap();
        Ed25519KeyPair::from_seed_unchecked(&d).unwrap()
    }

    #[test]
    fn rfc8037_key_thumbprint_and_signature() {
        use ring::signature::KeyPair;
        let key = rfc_key();
        let x: [u8; 32] = key.public_key().as_ref().try_into().unwrap();
        assert_eq!(b64(&x), X);
        assert_eq!(thumbprint(&x), KID);
        let input = format!(
            "eyJhbGciOiJFZERTQSJ9.{}",
            b64(b"Example of Ed25519 signing")
        );
        assert_eq!(
            input,
            "eyJhbGciOiJFZERTQSJ9.RXhhbXBsZSBvZiBFZDI1NTE5IHNpZ25pbmc"
        );
        assert_eq!(b64(key.sign(input.as_bytes()).as_ref()), SIGNATURE);
    }

    fn statement() -> Vec<u8> {
        serde_json::to_vec(&json!({"typ": TYP_STATEMENT, "run_id": "run-1", "facts": []})).unwrap()
    }

    fn jwks(x: &[u8; 32]) -> Vec<u8> {
        serde_json::to_vec(&json!({ "keys": [jwk(x)] })).unwrap()
    }

    #[test]
    fn a_signed_bundle_verifies_and_names_its_first_failure() {
        use ring::signature::KeyPair;
        let key = rfc_key();
        let x: [u8; 32] = key.public_key().as_ref().try_into().unwrap();
        let bundle = sign(&key, KID, &statement());
        let parsed: Value = serde_json::from_slice(&bundle).unwrap();
        let header = URL_SAFE_NO_PAD
            .decode(parsed["signatures"][0]["protected"].as_str().unwrap())
            .unwrap();
        assert_eq!(
            String::from_utf8(header).unwrap(),
            format!(r#"{{"alg":"EdDSA","kid":"{KID}","typ":"toolgate-evidence+json"}}"#)
        );
        let ok = verify(&bundle, &jwks(&x), None).unwrap();
        assert_eq!(
            (ok.run_id.as_str(), ok.facts, ok.kid.as_str()),
            ("run-1", 0, KID)
        );

        // Another key's JWKS: unknown kid.
        let other = Ed25519KeyPair::from_seed_unchecked(&[7; 32]).unwrap();
        let ox: [u8; 32] = other.public_key().as_ref().try_into().unwrap();
        assert!(
            verify(&bundle, &jwks(&ox), None)
                .unwrap_err()
                .contains("unknown kid")
        );
        // A JWK whose x is not its kid's key.
        let mut lying = jwk(&ox);
        lying["kid"] = json!(KID);
        let set = serde_json::to_vec(&json!({ "keys": [lying] })).unwrap();
        assert!(
            verify(&bundle, &set, None)
                .unwrap_err()
                .contains("not the key its kid names")
        );

        let edit = |f: &dyn Fn(&mut Value)| {
            let mut b = parsed.clone();
            f(&mut b);
            verify(&serde_json::to_vec(&b).unwrap(), &jwks(&x), None).unwrap_err()
        };
        let forged = b64(br#"{"typ":"toolgate.evidence.v1","run_id":"run-2","facts":[]}"#);
        assert!(edit(&|b| b["payload"] = json!(forged)).contains("bad signature"));
        assert!(
            edit(&|b| b["signatures"][0]["signature"] = json!(b64(&[0; 64])))
                .contains("bad signature")
        );
        let wrong_typ = b64(format!(r#"{{"alg":"EdDSA","kid":"{KID}","typ":"JWT"}}"#).as_bytes());
        assert!(
            edit(&|b| b["signatures"][0]["protected"] = json!(wrong_typ)).contains("wrong typ")
        );
        assert!(
            edit(&|b| b["signatures"][0]["protected"] = json!("a="))
                .contains("not unpadded base64url")
        );
        let two = parsed["signatures"][0].clone();
        assert!(
            edit(&|b| b["signatures"].as_array_mut().unwrap().push(two.clone()))
                .contains("not exactly one")
        );
        assert!(
            verify(b"[]", &jwks(&x), None)
                .unwrap_err()
                .starts_with("malformed bundle")
        );

        // A statement of another kind, signed by the right key.
        let wrong = sign(&key, KID, br#"{"typ":"other","run_id":"r","facts":[]}"#);
        assert!(
            verify(&wrong, &jwks(&x), None)
                .unwrap_err()
                .contains("wrong typ")
        );
    }

    /// A record's texts are checked as served: any value a tool answered (here an object whose
    /// first key is the name serde_json's raw-value feature reserves) verifies, and a body
    /// re-indented by another program is named as such.
    #[test]
    fn a_record_as_served_matches_its_digests() {
        let dir = std::env::temp_dir().join(format!("toolgate-jws-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let raw = r#"{"$serde_json::private::RawValue":"[1,2]","n":3.0261999441573207e-52}"#;
        let body = format!(
            r#"{{"run_id":"r","tool_call_id":"c","tool":"t","request":{{"q":"é"}},"raw_response":{raw},"agent_result":null,"ttl_ms":5}}"#
        );
        let fact = json!({
            "tool_call_id": "c",
            "tool": "t",
            "request_sha256": sha256_hex(r#"{"q":"é"}"#.as_bytes()),
            "raw_sha256": sha256_hex(raw.as_bytes()),
            "result_sha256": null,
        });
        let path = dir.join("c.json");
        std::fs::write(&path, format!("{body}\n")).unwrap();
        assert_eq!(check_record(&dir, "r", &fact), Ok(()));
        let changed = body.replace("[1,2]", "[1,3]");
        std::fs::write(&path, &changed).unwrap();
        assert_eq!(
            check_record(&dir, "r", &fact),
            Err("record c: raw_sha256 does not match the record".into())
        );
        let pretty = serde_json::to_string_pretty(&serde_json::from_str::<Value>(&body).unwrap());
        std::fs::write(&path, pretty.unwrap()).unwrap();
        let err = check_record(&dir, "r", &fact).unwrap_err();
        assert!(err.contains("not an invocation body as served"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
