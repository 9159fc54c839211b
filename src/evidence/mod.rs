//! Signed evidence: the digests and seal every finalized record carries, the Ed25519 key that
//! signs a run's facts, and its JWK Set.
//!
//! - A record's **seal** is an HMAC-SHA256 over its run id, tool call id, tool, status,
//!   evidence status and the SHA-256 digests of its `request`, `raw_response` and
//!   `agent_result` texts ([`SealInput`]). Only a holder of the run-token key can make one, so a
//!   record changed in the store no longer matches its seal and is never a fact.
//! - A run's **bundle** is a JWS (General JSON Serialization, EdDSA) over the facts, which
//!   anyone holding the public key checks offline ([`jws`]).
//!
//! Both keys derive from the run-token key (HKDF-SHA256), so replicas sharing it seal and sign
//! alike; a signing key file replaces the derived signing key. Secret bytes this module holds are
//! zeroized when dropped; ring's key objects keep their own copies, which it does not wipe.

pub mod jws;

use std::path::Path;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use ring::signature::{Ed25519KeyPair, KeyPair};
use ring::{digest, hkdf, hmac};
use zeroize::Zeroizing;

use crate::config::{ConfigError, EvidenceConfig, MAX_SECRET_FILE_BYTES, read_file};

/// HKDF info of the seal key.
const SEAL_INFO: &[u8] = b"toolgate evidence seal v1";
/// HKDF info of the derived Ed25519 seed.
const SIGNING_INFO: &[u8] = b"toolgate evidence ed25519 v1";
/// The first line of every seal's message: a new format gets a new line.
const SEAL_VERSION: &str = "toolgate seal v1";
/// The DER of an Ed25519 SubjectPublicKeyInfo before its 32 key bytes (RFC 8410).
const ED25519_SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// Lowercase hex SHA-256 of `bytes`: the digest form of a record's parts.
pub fn sha256_hex(bytes: &[u8]) -> String {
    hex(digest::digest(&digest::SHA256, bytes).as_ref())
}

fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)] as char);
        out.push(DIGITS[usize::from(b & 0xf)] as char);
    }
    out
}

/// What a record's seal covers. The digests are lowercase hex, `None` for a part that is null.
#[derive(Debug, Clone, Copy)]
pub struct SealInput<'a> {
    pub run_id: &'a str,
    pub tool_call_id: &'a str,
    pub tool: &'a str,
    pub status: &'a str,
    pub evidence_status: &'a str,
    pub request_sha256: Option<&'a str>,
    pub raw_sha256: Option<&'a str>,
    pub result_sha256: Option<&'a str>,
}

impl SealInput<'_> {
    /// The sealed message: the version line, then each field on a line of its own (`null` for
    /// a missing digest). No field can hold a newline: ids, tool names, the states and hex
    /// digests are all checked for their characters before they get here.
    fn message(&self) -> String {
        let fields = [
            SEAL_VERSION,
            self.run_id,
            self.tool_call_id,
            self.tool,
            self.status,
            self.evidence_status,
            self.request_sha256.unwrap_or("null"),
            self.raw_sha256.unwrap_or("null"),
            self.result_sha256.unwrap_or("null"),
        ];
        fields.join("\n")
    }
}

/// Seals records and checks seals: the HMAC key derived from the run-token key.
pub struct Sealer {
    key: hmac::Key,
}

impl Sealer {
    /// The sealer of every replica sharing `run_token_key`.
    pub fn derive(run_token_key: &[u8]) -> Sealer {
        let seed = hkdf_32(run_token_key, SEAL_INFO);
        Sealer {
            key: hmac::Key::new(hmac::HMAC_SHA256, seed.as_ref()),
        }
    }

    /// The seal of `input`, lowercase hex.
    pub fn seal(&self, input: &SealInput<'_>) -> String {
        hex(hmac::sign(&self.key, input.message().as_bytes()).as_ref())
    }

    /// Whether `seal` is `input`'s seal, compared in constant time.
    pub fn check(&self, input: &SealInput<'_>, seal: &str) -> bool {
        let Some(tag) = unhex(seal) else {
            return false;
        };
        hmac::verify(&self.key, input.message().as_bytes(), &tag).is_ok()
    }
}

fn unhex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) {
        return None;
    }
    let digit = |c: u8| match c {
        b'0'..=b'9' => Some(c - b'0'),
        b'a'..=b'f' => Some(c - b'a' + 10),
        _ => None,
    };
    s.as_bytes()
        .chunks(2)
        .map(|p| Some(digit(p[0])? << 4 | digit(p[1])?))
        .collect()
}

/// HKDF-SHA256 with an empty salt, 32 bytes of output.
fn hkdf_32(ikm: &[u8], info: &[u8]) -> Zeroizing<[u8; 32]> {
    let mut out = Zeroizing::new([0u8; 32]);
    let prk = hkdf::Salt::new(hkdf::HKDF_SHA256, &[]).extract(ikm);
    // 32 bytes is within HKDF-SHA256's limit (255 * 32), so neither step can fail.
    if let Ok(okm) = prk.expand(&[info], hkdf::HKDF_SHA256) {
        let _ = okm.fill(out.as_mut());
    }
    out
}

/// The evidence key files of a config, read and checked: what `toolgate check` and `serve`
/// refuse to start without when they are named and bad.
pub struct KeyFiles {
    /// The signing key's PKCS#8 document, when a file names one.
    signing_pkcs8: Option<Zeroizing<Vec<u8>>>,
    /// The raw 32-byte public keys of `evidence.previous_public_keys`, in order.
    previous: Vec<[u8; 32]>,
    issuer: String,
}

impl KeyFiles {
    /// Reads `evidence.signing_key_file` (or `TOOLGATE_EVIDENCE_KEY_FILE`, which the config
    /// already resolved) and every `evidence.previous_public_keys[i]`. Errors name the key.
    pub fn load(cfg: &EvidenceConfig) -> Result<KeyFiles, ConfigError> {
        let signing_pkcs8 = match &cfg.signing_key_file {
            None => None,
            Some(path) => Some(
                signing_key(path)
                    .map_err(|e| ConfigError(format!("evidence.signing_key_file: {e}")))?,
            ),
        };
        let previous = cfg
            .previous_public_keys
            .iter()
            .enumerate()
            .map(|(i, path)| {
                public_key(path)
                    .map_err(|e| ConfigError(format!("evidence.previous_public_keys[{i}]: {e}")))
            })
            .collect::<Result<_, _>>()?;
        Ok(KeyFiles {
            signing_pkcs8,
            previous,
            issuer: cfg.issuer.clone(),
        })
    }

    /// No files: the derived key and the default issuer.
    pub fn none() -> KeyFiles {
        KeyFiles {
            signing_pkcs8: None,
            previous: Vec::new(),
            issuer: EvidenceConfig::default().issuer,
        }
    }
}

fn pem_der(path: &Path) -> Result<Zeroizing<Vec<u8>>, String> {
    let bytes = Zeroizing::new(read_file(path, MAX_SECRET_FILE_BYTES)?);
    let mut reader: &[u8] = bytes.as_ref();
    match rustls_pemfile::read_one(&mut reader) {
        Ok(Some(rustls_pemfile::Item::Pkcs8Key(key))) => {
            Ok(Zeroizing::new(key.secret_pkcs8_der().to_vec()))
        }
        Ok(Some(rustls_pemfile::Item::SubjectPublicKeyInfo(spki))) => {
            Ok(Zeroizing::new(spki.as_ref().to_vec()))
        }
        Ok(Some(_)) => Err(format!(
            "{} holds a PEM block of another kind",
            path.display()
        )),
        Ok(None) | Err(_) => Err(format!("{} holds no PEM block", path.display())),
    }
}

/// An Ed25519 private key file: PKCS#8 PEM (`openssl genpkey -algorithm ed25519`).
fn signing_key(path: &Path) -> Result<Zeroizing<Vec<u8>>, String> {
    let der = pem_der(path)?;
    Ed25519KeyPair::from_pkcs8_maybe_unchecked(&der)
        .map_err(|_| format!("{} is not an Ed25519 private key (PKCS#8)", path.display()))?;
    Ok(der)
}

/// An Ed25519 public key file: SubjectPublicKeyInfo PEM (`openssl pkey -pubout`).
fn public_key(path: &Path) -> Result<[u8; 32], String> {
    let der = pem_der(path)?;
    der.strip_prefix(&ED25519_SPKI_PREFIX[..])
        .and_then(|x| <[u8; 32]>::try_from(x).ok())
        .ok_or_else(|| format!("{} is not an Ed25519 public key", path.display()))
}

/// The signing key, the published public keys, and the seal key.
pub struct Keys {
    pub sealer: std::sync::Arc<Sealer>,
    signer: Ed25519KeyPair,
    kid: String,
    issuer: String,
    /// `GET /.well-known/jwks.json`, serialized once.
    jwks: Vec<u8>,
}

impl Keys {
    /// The keys of a sidecar whose run-token key is `run_token_key`, with `files` in place of
    /// the derived signing key when they name one.
    pub fn new(run_token_key: &[u8], files: &KeyFiles) -> Keys {
        let signer = match &files.signing_pkcs8 {
            Some(der) => Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).ok(),
            None => None,
        };
        let signer = signer.unwrap_or_else(|| {
            let seed = hkdf_32(run_token_key, SIGNING_INFO);
            // A 32-byte seed is always a valid Ed25519 seed.
            Ed25519KeyPair::from_seed_unchecked(seed.as_ref())
                .unwrap_or_else(|_| unreachable!("a 32-byte Ed25519 seed"))
        });
        let public: [u8; 32] = signer
            .public_key()
            .as_ref()
            .try_into()
            .unwrap_or_else(|_| unreachable!("an Ed25519 public key is 32 bytes"));
        // Each key once: a rotation may list the signing key among the previous ones too.
        let mut published: Vec<[u8; 32]> = vec![public];
        for x in &files.previous {
            if !published.contains(x) {
                published.push(*x);
            }
        }
        let keys: Vec<serde_json::Value> = published.iter().map(jws::jwk).collect();
        let jwks = serde_json::to_vec(&serde_json::json!({ "keys": keys })).unwrap_or_default();
        Keys {
            sealer: std::sync::Arc::new(Sealer::derive(run_token_key)),
            kid: jws::thumbprint(&public),
            signer,
            issuer: files.issuer.clone(),
            jwks,
        }
    }

    /// The signing key's id: its RFC 7638 thumbprint.
    pub fn kid(&self) -> &str {
        &self.kid
    }

    /// `iss` of every statement.
    pub fn issuer(&self) -> &str {
        &self.issuer
    }

    /// The JWK Set: the signing key first, then the previous public keys.
    pub fn jwks(&self) -> &[u8] {
        &self.jwks
    }

    /// The bundle of `payload`: a JWS in the General JSON Serialization, one EdDSA signature.
    pub fn sign(&self, payload: &[u8]) -> Vec<u8> {
        jws::sign(&self.signer, &self.kid, payload)
    }
}

/// Unpadded base64url, the JOSE encoding.
fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::path::PathBuf;

    fn input<'a>(raw: Option<&'a str>) -> SealInput<'a> {
        SealInput {
            run_id: "run-1",
            tool_call_id: "call_1",
            tool: "search",
            status: "READY",
            evidence_status: "EVIDENCE_FOUND",
            request_sha256: Some("aa"),
            raw_sha256: raw,
            result_sha256: Some("cc"),
        }
    }

    #[test]
    fn the_seal_message_is_one_field_a_line() {
        assert_eq!(
            input(None).message(),
            "toolgate seal v1\nrun-1\ncall_1\nsearch\nREADY\nEVIDENCE_FOUND\naa\nnull\ncc"
        );
    }

    #[test]
    fn a_seal_checks_only_what_it_sealed() {
        let sealer = Sealer::derive(b"a run-token key of at least thirty-two bytes");
        let seal = sealer.seal(&input(Some("bb")));
        assert_eq!(seal.len(), 64);
        assert!(
            seal.bytes()
                .all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase())
        );
        assert!(sealer.check(&input(Some("bb")), &seal));
        assert!(!sealer.check(&input(Some("bc")), &seal));
        assert!(!sealer.check(&input(None), &seal));
        assert!(!sealer.check(&input(Some("bb")), &seal.to_uppercase()));
        assert!(!sealer.check(&input(Some("bb")), &seal[..62]));
        assert!(!sealer.check(&input(Some("bb")), ""));
        let other = Sealer::derive(b"another run-token key of thirty-two bytes");
        assert!(!other.check(&input(Some("bb")), &seal));
        // Replicas sharing the key agree.
        let again = Sealer::derive(b"a run-token key of at least thirty-two bytes");
        assert_eq!(again.seal(&input(Some("bb"))), seal);
    }

    #[test]
    fn digests_are_lowercase_hex_sha256() {
        assert_eq!(
            sha256_hex(b"abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn the_derived_signing_key_is_the_same_for_the_same_token_key() {
        let a = Keys::new(b"k".repeat(32).as_slice(), &KeyFiles::none());
        let b = Keys::new(b"k".repeat(32).as_slice(), &KeyFiles::none());
        let c = Keys::new(b"j".repeat(32).as_slice(), &KeyFiles::none());
        assert_eq!(a.kid(), b.kid());
        assert_ne!(a.kid(), c.kid());
        assert_eq!(a.issuer(), "toolgate");
        let jwks: serde_json::Value = serde_json::from_slice(a.jwks()).unwrap();
        assert_eq!(jwks["keys"].as_array().unwrap().len(), 1);
        assert_eq!(jwks["keys"][0]["kid"], a.kid());
        assert!(jwks["keys"][0].get("d").is_none(), "never a private part");
    }

    #[test]
    fn key_files_are_checked_and_named() {
        let dir = std::env::temp_dir().join(format!("toolgate-evidence-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        // RFC 8410, section 10.3: an Ed25519 private key and its public key.
        let private = write(
            "sk.pem",
            "-----BEGIN PRIVATE KEY-----\nMC4CAQAwBQYDK2VwBCIEINTuctv5E1hK1bbY8fdp+K06/nwoy/HU++CXqI9EdVhC\n-----END PRIVATE KEY-----\n",
        );
        let public = write(
            "pk.pem",
            "-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEAGb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE=\n-----END PUBLIC KEY-----\n",
        );
        let garbage = write("bad.pem", "not a key");
        let cfg = |signing: Option<PathBuf>, previous: Vec<PathBuf>| EvidenceConfig {
            signing_key_file: signing,
            previous_public_keys: previous,
            ..EvidenceConfig::default()
        };
        let files = KeyFiles::load(&cfg(Some(private.clone()), vec![public.clone()])).unwrap();
        let keys = Keys::new(b"k".repeat(32).as_slice(), &files);
        let jwks: serde_json::Value = serde_json::from_slice(keys.jwks()).unwrap();
        // The file's key signs; its public half is RFC 8410's.
        assert_eq!(
            jwks["keys"][0]["x"],
            "Gb9ECWmEzf6FQbrBZ9w7lshQhqowtrbLDFw4rXAxZuE"
        );
        assert_eq!(
            jwks["keys"].as_array().unwrap().len(),
            1,
            "the signing key listed again as a previous key is published once"
        );

        let err = |c: EvidenceConfig| KeyFiles::load(&c).err().unwrap().0;
        assert!(err(cfg(Some(garbage.clone()), vec![])).starts_with("evidence.signing_key_file: "));
        assert!(err(cfg(Some(public.clone()), vec![])).contains("not an Ed25519 private key"));
        assert!(
            err(cfg(None, vec![public.clone(), private.clone()]))
                .starts_with("evidence.previous_public_keys[1]: ")
        );
        assert!(err(cfg(Some(dir.join("missing")), vec![])).contains("cannot read"));
        let big = write("big.pem", &"x".repeat(70_000));
        assert!(err(cfg(Some(big), vec![])).starts_with("evidence.signing_key_file: "));

        // Rotation: a bundle signed with the file's key, checked after the sidecar moved to
        // another key and lists the old one among its previous public keys.
        let statement = br#"{"typ":"toolgate.evidence.v1","run_id":"run-1","facts":[]}"#;
        let old_bundle = keys.sign(statement);
        let rotated = Keys::new(
            b"k".repeat(32).as_slice(),
            &KeyFiles::load(&cfg(None, vec![public.clone()])).unwrap(),
        );
        assert_ne!(rotated.kid(), keys.kid());
        let served = rotated.jwks();
        let old = jws::verify(&old_bundle, served, None).unwrap();
        assert_eq!(old.kid, keys.kid(), "checked with the previous key");
        let new = jws::verify(&rotated.sign(statement), served, None).unwrap();
        assert_eq!(new.kid, rotated.kid());
        // Without the previous key published, the old bundle names an unknown kid.
        let forgot = Keys::new(b"k".repeat(32).as_slice(), &KeyFiles::none());
        assert!(
            jws::verify(&old_bundle, forgot.jwks(), None)
                .unwrap_err()
                .contains("unknown kid")
        );
        let _ = std::fs::remove_dir_all(&dir);
    }
}
