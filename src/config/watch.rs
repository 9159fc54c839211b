//! Hot reload: the file watch that hands over a new policy when a valid new version of the
//! config file appears. Installing it (the swap every call reads) is the call pipeline's
//! (`call::live`); this module only decides what the new policy is.
//!
//! Only `tools`, `limits` and `runs` reload; a change to `listen`, `admin` or `store` needs a
//! restart and is refused (counted as `result="error"`), as is an invalid file.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use super::{Config, Policy};

/// Outcome of one reload attempt, for the reload counter.
pub enum Reload {
    Unchanged,
    Applied,
    Refused(String),
}

/// Watches a config file by content hash (survives Kubernetes' symlink swap of a mounted
/// ConfigMap), together with the upstream token files it names, so a rotated token is picked up
/// like an edited config; calls `install` with each policy that may replace the live one, and
/// `on_reload` with each attempt's outcome.
pub async fn watch(
    path: PathBuf,
    current: Config,
    interval: Duration,
    install: impl Fn(Arc<Policy>) + Send + 'static,
    on_reload: impl Fn(Reload) + Send + 'static,
) {
    let mut files = token_files(&current.policy);
    let mut last = digest(&path, &files);
    let mut tick = tokio::time::interval(interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = digest(&path, &files);
        if now == last {
            on_reload(Reload::Unchanged);
            continue;
        }
        last = now;
        let outcome = match Config::load(&path) {
            Err(e) => Reload::Refused(e.0),
            Ok(next) => match current.restart_needed(&next) {
                Some(section) => Reload::Refused(format!("{section}: changes need a restart")),
                None => {
                    files = token_files(&next.policy);
                    last = digest(&path, &files);
                    install(next.policy);
                    Reload::Applied
                }
            },
        };
        on_reload(outcome);
    }
}

/// The token files the policy's tools read.
fn token_files(policy: &Policy) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = policy
        .tools
        .values()
        .filter_map(|t| t.upstream_token_file.clone())
        .collect();
    files.sort();
    files
}

/// One hash over the config file and the token files (a missing file hashes as absent).
fn digest(path: &Path, token_files: &[PathBuf]) -> Option<Vec<u8>> {
    let mut ctx = ring::digest::Context::new(&ring::digest::SHA256);
    ctx.update(&super::read_file(path, super::MAX_CONFIG_FILE_BYTES).ok()?);
    for file in token_files {
        let bytes = super::read_file(file, super::MAX_SECRET_FILE_BYTES).unwrap_or_default();
        ctx.update(&(bytes.len() as u64).to_le_bytes());
        ctx.update(&bytes);
    }
    Some(ctx.finish().as_ref().to_vec())
}
