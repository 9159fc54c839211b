//! Tokens: the admin token and run tokens (`<run_id>.<mac>`), all checked in constant time;
//! and the evidence keys, which derive from the run-token key.

use std::sync::{Arc, Mutex};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hyper::HeaderMap;
use hyper::header::AUTHORIZATION;
use ring::hmac;
use ring::rand::SystemRandom;
use subtle::ConstantTimeEq;

use crate::config::{AdminConfig, ConfigError, MAX_SECRET_FILE_BYTES, read_file, read_text_file};
use crate::evidence::{KeyFiles, Keys};
use crate::ids::{RunId, RunMap};

/// Verifies admin tokens and issues/verifies run tokens.
pub struct Tokens {
    /// A per-process random key: admin tokens are compared as HMAC tags, in constant time.
    compare_key: hmac::Key,
    admin_tag: hmac::Tag,
    run_key: hmac::Key,
    /// The MAC each recently seen run's token must carry, so a run's later calls compare against
    /// it instead of computing it again. Bounded by [`MACS_KEPT`].
    macs: Mutex<RunMap<hmac::Tag>>,
    /// The run-token key's bytes, for the evidence keys derived from it.
    run_key_bytes: zeroize::Zeroizing<Vec<u8>>,
    /// The seal key and the signing key of evidence.
    pub evidence: Arc<Keys>,
}

/// How many runs' MACs are kept; when full, the table is emptied and fills again as calls come.
const MACS_KEPT: usize = 4096;

/// The longest MAC text read: a genuine one is 43 characters (32 bytes, unpadded base64).
const MAC_TEXT_MAX: usize = 64;

impl Tokens {
    /// `token_key`: the shared run-token key; when absent it is derived from the admin token, so
    /// replicas sharing the admin token also share run tokens.
    pub fn new(admin_token: &str, token_key: Option<&[u8]>) -> Result<Tokens, ConfigError> {
        if admin_token.is_empty() {
            return Err(ConfigError("the admin token is empty".into()));
        }
        let compare_key = hmac::Key::generate(hmac::HMAC_SHA256, &SystemRandom::new())
            .map_err(|_| ConfigError("no system randomness".into()))?;
        let admin_tag = hmac::sign(&compare_key, admin_token.as_bytes());
        let run_key_bytes = zeroize::Zeroizing::new(match token_key {
            Some(k) => k.to_vec(),
            None => {
                let derive = hmac::Key::new(hmac::HMAC_SHA256, admin_token.as_bytes());
                hmac::sign(&derive, b"toolgate run token key v1")
                    .as_ref()
                    .to_vec()
            }
        });
        let run_key = hmac::Key::new(hmac::HMAC_SHA256, &run_key_bytes);
        let evidence = Arc::new(Keys::new(&run_key_bytes, &KeyFiles::none()));
        Ok(Tokens {
            compare_key,
            admin_tag,
            run_key,
            macs: Mutex::default(),
            run_key_bytes,
            evidence,
        })
    }

    /// The same tokens, with the evidence key files of the config (a signing key file, the
    /// previous public keys, the issuer) in place of the defaults.
    pub fn with_evidence(mut self, files: &KeyFiles) -> Tokens {
        self.evidence = Arc::new(Keys::new(&self.run_key_bytes, files));
        self
    }

    /// Whether the request carries the admin token.
    pub fn is_admin(&self, headers: &HeaderMap) -> bool {
        bearer(headers).is_some_and(|t| {
            hmac::verify(&self.compare_key, t.as_bytes(), self.admin_tag.as_ref()).is_ok()
        })
    }

    /// The run token for `run_id`.
    pub fn issue(&self, run_id: &RunId) -> String {
        let mac = hmac::sign(&self.run_key, run_id.as_bytes());
        format!("{run_id}.{}", URL_SAFE_NO_PAD.encode(mac.as_ref()))
    }

    /// The run a request's token is bound to, if the token is genuine.
    ///
    /// The MAC a run's token must carry is computed on its first genuine call and kept; every
    /// presented MAC is compared with the expected one in constant time, kept or computed. Only
    /// a genuine token's run is kept, so forged tokens cannot fill or churn the table.
    pub fn run_of(&self, headers: &HeaderMap) -> Option<RunId> {
        let token = bearer(headers)?;
        let (run_id, mac) = token.rsplit_once('.')?;
        if mac.len() > MAC_TEXT_MAX {
            return None;
        }
        let mut presented = [0u8; MAC_TEXT_MAX];
        let n = URL_SAFE_NO_PAD.decode_slice(mac, &mut presented).ok()?;
        let presented = &presented[..n];
        let kept = self
            .lock_macs()
            .get_key_value(run_id)
            .map(|(id, tag)| (id.clone(), *tag));
        if let Some((run_id, expected)) = kept {
            return bool::from(presented.ct_eq(expected.as_ref())).then_some(run_id);
        }
        let run_id = RunId::parse(run_id)?;
        let expected = hmac::sign(&self.run_key, run_id.as_bytes());
        if !bool::from(presented.ct_eq(expected.as_ref())) {
            return None;
        }
        let mut macs = self.lock_macs();
        if macs.len() >= MACS_KEPT {
            macs.clear();
        }
        macs.insert(run_id.clone(), expected);
        Some(run_id)
    }

    fn lock_macs(&self) -> std::sync::MutexGuard<'_, RunMap<hmac::Tag>> {
        self.macs.lock().unwrap_or_else(|p| p.into_inner())
    }
}

fn bearer(headers: &HeaderMap) -> Option<&str> {
    // Read as UTF-8 rather than through `to_str`, which tests every byte for visible ASCII:
    // the value is already free of control characters (hyper's parser refuses them), and a
    // token with any other non-ASCII byte is refused further on all the same (neither a run id
    // nor base64 can hold one).
    let value = std::str::from_utf8(headers.get(AUTHORIZATION)?.as_bytes()).ok()?;
    let (scheme, token) = value.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// Reads the admin token: `TOOLGATE_ADMIN_TOKEN` wins over `admin.token_file`.
pub fn admin_token(cfg: &AdminConfig) -> Result<String, ConfigError> {
    let token = match std::env::var("TOOLGATE_ADMIN_TOKEN") {
        Ok(t) if !t.trim().is_empty() => t,
        _ => match &cfg.token_file {
            Some(path) => read_text_file(path, MAX_SECRET_FILE_BYTES)
                .map_err(|e| ConfigError(format!("admin.token_file: {e}")))?,
            None => String::new(),
        },
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        return Err(ConfigError(
            "admin token is empty: set TOOLGATE_ADMIN_TOKEN or admin.token_file".into(),
        ));
    }
    Ok(token)
}

/// Reads the run-token key: `TOOLGATE_TOKEN_KEY` wins over `admin.token_key_file`. At least 32 bytes.
pub fn token_key(cfg: &AdminConfig) -> Result<Option<Vec<u8>>, ConfigError> {
    let key = match std::env::var("TOOLGATE_TOKEN_KEY") {
        Ok(k) if !k.is_empty() => Some(k.into_bytes()),
        _ => match &cfg.token_key_file {
            Some(path) => Some(
                read_file(path, MAX_SECRET_FILE_BYTES)
                    .map_err(|e| ConfigError(format!("admin.token_key_file: {e}")))?,
            ),
            None => None,
        },
    };
    match key {
        Some(k) if k.trim_ascii().len() < 32 => Err(ConfigError(
            "admin.token_key_file: the run-token key must be at least 32 bytes".into(),
        )),
        Some(k) => Ok(Some(k.trim_ascii().to_vec())),
        None => Ok(None),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::header::HeaderValue;

    fn with_bearer(t: &str) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(
            AUTHORIZATION,
            HeaderValue::from_str(&format!("Bearer {t}")).unwrap(),
        );
        h
    }

    #[test]
    fn run_tokens_are_bound_to_their_run() {
        let tokens = Tokens::new("admin", None).unwrap();
        let t = tokens.issue(&RunId::parse("run-42").unwrap());
        assert!(t.starts_with("run-42."));
        assert_eq!(tokens.run_of(&with_bearer(&t)).as_deref(), Some("run-42"));
        let forged = t.replacen("run-42", "run-43", 1);
        assert!(tokens.run_of(&with_bearer(&forged)).is_none());
        assert!(tokens.run_of(&with_bearer("run-42.AAAA")).is_none());
        assert!(tokens.run_of(&HeaderMap::new()).is_none());
    }

    #[test]
    fn a_token_with_bytes_outside_ascii_is_refused() {
        let tokens = Tokens::new("admin", None).unwrap();
        let t = tokens.issue(&RunId::parse("run-9").unwrap());
        // Kept first, so the later checks meet a kept MAC as well as a computed one.
        assert!(tokens.run_of(&with_bearer(&t)).is_some());
        let (run, mac) = t.rsplit_once('.').unwrap();
        for bad in [
            format!("{run}\u{e9}.{mac}"),
            format!("{run}.{mac}\u{e9}"),
            format!("r\u{fc}n-9.{mac}"),
        ] {
            let mut h = HeaderMap::new();
            h.insert(
                AUTHORIZATION,
                HeaderValue::from_bytes(format!("Bearer {bad}").as_bytes()).unwrap(),
            );
            assert!(tokens.run_of(&h).is_none(), "{bad}");
        }
        // Bytes that are not UTF-8 at all.
        let mut raw = format!("Bearer {t}").into_bytes();
        raw.push(0xff);
        let mut h = HeaderMap::new();
        h.insert(AUTHORIZATION, HeaderValue::from_bytes(&raw).unwrap());
        assert!(tokens.run_of(&h).is_none());
    }

    #[test]
    fn a_kept_mac_refuses_what_a_computed_one_refuses() {
        let tokens = Tokens::new("admin", None).unwrap();
        let t = tokens.issue(&RunId::parse("run-7").unwrap());
        // The first check computes and keeps the MAC; the later ones compare with the kept one.
        for _ in 0..3 {
            assert_eq!(tokens.run_of(&with_bearer(&t)).as_deref(), Some("run-7"));
        }
        let (body, mac) = t.rsplit_once('.').unwrap();
        let mut flipped = mac.as_bytes().to_vec();
        flipped[0] = if flipped[0] == b'A' { b'B' } else { b'A' };
        let flipped = format!("{body}.{}", String::from_utf8(flipped).unwrap());
        assert!(tokens.run_of(&with_bearer(&flipped)).is_none());
        assert!(tokens.run_of(&with_bearer(&format!("{t}A"))).is_none());
        assert!(tokens.run_of(&with_bearer(&t[..t.len() - 1])).is_none());
        assert!(tokens.run_of(&with_bearer("run-7.")).is_none());
        let long = format!("run-7.{}", "A".repeat(200));
        assert!(tokens.run_of(&with_bearer(&long)).is_none());
        // Forged tokens are not kept.
        assert!(tokens.run_of(&with_bearer("run-8.AAAA")).is_none());
        assert_eq!(tokens.lock_macs().len(), 1);
    }

    #[test]
    fn the_kept_macs_stay_bounded() {
        let tokens = Tokens::new("admin", None).unwrap();
        let first = tokens.issue(&RunId::parse("r-first").unwrap());
        assert!(tokens.run_of(&with_bearer(&first)).is_some());
        for i in 0..MACS_KEPT + 10 {
            let t = tokens.issue(&RunId::parse(&format!("r{i}")).unwrap());
            assert!(tokens.run_of(&with_bearer(&t)).is_some());
            assert!(tokens.lock_macs().len() <= MACS_KEPT);
        }
        // A run whose MAC was let go has it computed again.
        assert_eq!(
            tokens.run_of(&with_bearer(&first)).as_deref(),
            Some("r-first")
        );
    }

    #[test]
    fn replicas_sharing_a_key_verify_each_other() {
        let a = Tokens::new("admin", None).unwrap();
        let b = Tokens::new("admin", None).unwrap();
        let t = a.issue(&RunId::parse("r").unwrap());
        assert_eq!(b.run_of(&with_bearer(&t)).as_deref(), Some("r"));
        let other = Tokens::new("other-admin", None).unwrap();
        assert!(other.run_of(&with_bearer(&t)).is_none());
        let keyed = Tokens::new("admin", Some(&[7u8; 32])).unwrap();
        assert!(keyed.run_of(&with_bearer(&t)).is_none());
    }

    #[test]
    fn admin_token_check() {
        let tokens = Tokens::new("s3cret", None).unwrap();
        assert!(tokens.is_admin(&with_bearer("s3cret")));
        assert!(!tokens.is_admin(&with_bearer("s3cre")));
        assert!(!tokens.is_admin(&HeaderMap::new()));
        assert!(Tokens::new("", None).is_err());
    }
}
