//! The canonical path rule and the containment check on arbitrary paths: a canonical path is
//! absolute, normalized (no empty, `.` or `..` segment, no trailing slash) and a fixed point of
//! both `canonical` and `normalize`; `contains` is exactly "the root itself or below it".
#![no_main]

mod common;

use libfuzzer_sys::arbitrary::{Result, Unstructured};
use libfuzzer_sys::fuzz_target;
use toolgate::config::run_path;
use toolgate::paths::{Malformed, canonical, contains, normalize};

const PIECES: &[&str] = &["/", "//", ".", "..", "~", "~/", "a", "b", "\0", "ws", ""];

/// A path-like string: mostly pieces that matter to the rule, sometimes arbitrary text.
fn path(u: &mut Unstructured<'_>) -> Result<String> {
    let mut s = String::new();
    for _ in 0..u.int_in_range(0..=8)? {
        s.push_str(&common::pick_str(u, PIECES)?);
    }
    Ok(s)
}

fn is_normal(p: &str) -> bool {
    p.starts_with('/')
        && (p == "/" || !p.ends_with('/'))
        && !p.contains("//")
        && !p.split('/').any(|s| s == "." || s == "..")
}

fn run(data: &[u8]) -> Result<()> {
    let mut u = Unstructured::new(data);
    let raw = path(&mut u)?;
    // A run's workspace and home are absolute, normalized and not `/` (`run_path`).
    let workspace = run_path(&format!("/{}", path(&mut u)?)).unwrap_or("/workspace".into());
    let home = run_path(&format!("/{}", path(&mut u)?)).unwrap_or("/home/agent".into());
    let root = normalize(&format!("/{}", path(&mut u)?));
    for p in [&workspace, &home, &root] {
        assert!(is_normal(p), "{p:?}");
        assert_eq!(normalize(p), *p);
    }
    let got = canonical(&raw, &workspace, &home);
    if raw.is_empty() {
        assert_eq!(got, Err(Malformed::Empty));
        return Ok(());
    }
    if raw.contains('\0') {
        assert_eq!(got, Err(Malformed::Nul));
        return Ok(());
    }
    let p = got.expect("a non-empty path without NUL is canonical");
    assert!(is_normal(&p), "{raw:?} -> {p:?}");
    assert_eq!(
        canonical(&p, &workspace, &home).as_ref(),
        Ok(&p),
        "idempotent"
    );
    assert_eq!(normalize(&p), p);
    // A relative path stays in the workspace unless it climbs out with `..`.
    if !raw.starts_with('/') && !raw.starts_with('~') && !raw.split('/').any(|s| s == "..") {
        assert!(
            contains(&workspace, &p),
            "{raw:?} -> {p:?} left {workspace:?}"
        );
    }
    if raw == "~" || (raw.starts_with("~/") && !raw.split('/').any(|s| s == "..")) {
        assert!(contains(&home, &p), "{raw:?} -> {p:?} left {home:?}");
    }
    for r in [&workspace, &home, &root] {
        let under = r == "/" || p == **r || p.starts_with(&format!("{r}/"));
        assert_eq!(contains(r, &p), under, "{p:?} in {r:?}");
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(data);
});
