//! The one canonical path rule and the one containment check. Every path a tool declares
//! (`path`, `source_path`), every run `workspace` and `home`, and every `read_roots` entry goes
//! through them, so the check and the tool see the same path.
//!
//! The rule is lexical: toolgate does not read the tool's filesystem, so it cannot see symlinks
//! there. Following a symlink out of the workspace is the tool's to refuse.

/// Why a path argument is malformed (`INVALID_INPUT`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Malformed {
    Empty,
    Nul,
}

/// Rules 1–4: a non-empty string without NUL; `~` alone or `~/…` expands to `home` (`~name/…`
/// is a relative path whose first segment is `~name`); an absolute path stays, a relative one is
/// anchored on `workspace`; then lexical normalization.
///
/// `workspace` and `home` are absolute (they went through [`normalize`] when the run was made).
pub fn canonical(raw: &str, workspace: &str, home: &str) -> Result<String, Malformed> {
    if raw.is_empty() {
        return Err(Malformed::Empty);
    }
    if raw.contains('\0') {
        return Err(Malformed::Nul);
    }
    let joined = if raw == "~" {
        home.to_string()
    } else if let Some(rest) = raw.strip_prefix("~/") {
        format!("{home}/{rest}")
    } else if raw.starts_with('/') {
        raw.to_string()
    } else {
        format!("{workspace}/{raw}")
    };
    Ok(normalize(&joined))
}

/// Rule 4, on an absolute path: empty and `.` segments dropped, `..` removes the previous
/// segment and never climbs above `/`, no trailing slash.
pub fn normalize(path: &str) -> String {
    let mut kept: Vec<&str> = Vec::new();
    for segment in path.split('/') {
        match segment {
            "" | "." => {}
            ".." => {
                kept.pop();
            }
            s => kept.push(s),
        }
    }
    let mut out = String::with_capacity(path.len() + 1);
    for segment in &kept {
        out.push('/');
        out.push_str(segment);
    }
    if out.is_empty() {
        out.push('/');
    }
    out
}

/// Rule 5's test: `path` is `root` or inside it. Both are canonical, so `/workspace2` is not
/// inside `/workspace` and `/` holds everything.
pub fn contains(root: &str, path: &str) -> bool {
    root == "/"
        || path == root
        || path
            .strip_prefix(root)
            .is_some_and(|rest| rest.starts_with('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

    const WS: &str = "/workspace/run-42";
    const HOME: &str = "/home/agent";

    fn c(raw: &str) -> Result<String, Malformed> {
        canonical(raw, WS, HOME)
    }

    #[test]
    fn the_canonical_rule() {
        for (raw, want) in [
            ("~", "/home/agent"),
            ("~/", "/home/agent"),
            ("~/x", "/home/agent/x"),
            ("~/.cache/x", "/home/agent/.cache/x"),
            ("~other/x", "/workspace/run-42/~other/x"),
            ("~~", "/workspace/run-42/~~"),
            ("x", "/workspace/run-42/x"),
            ("./a/./b", "/workspace/run-42/a/b"),
            ("a/../b", "/workspace/run-42/b"),
            ("../x", "/workspace/x"),
            ("../../../../../../etc/passwd", "/etc/passwd"),
            ("/etc/passwd", "/etc/passwd"),
            ("/a//b///c", "/a/b/c"),
            ("/a/b/", "/a/b"),
            ("a/b//", "/workspace/run-42/a/b"),
            ("/..", "/"),
            ("/../..", "/"),
            ("/", "/"),
            (".", "/workspace/run-42"),
            ("/workspace/run-42/../run-43", "/workspace/run-43"),
        ] {
            assert_eq!(c(raw).as_deref(), Ok(want), "{raw:?}");
        }
        assert_eq!(c(""), Err(Malformed::Empty));
        assert_eq!(c("a\0b"), Err(Malformed::Nul));
    }

    #[test]
    fn containment() {
        assert!(contains(WS, WS));
        assert!(contains(WS, "/workspace/run-42/a"));
        assert!(!contains("/workspace", "/workspace2"));
        assert!(!contains("/workspace", "/workspace2/x"));
        assert!(!contains("/usr/share/doc", "/usr/share/docs"));
        assert!(contains("/usr/share/doc", "/usr/share/doc/x"));
        assert!(!contains(WS, "/workspace"));
        assert!(contains("/", "/etc"));
        assert!(!contains(WS, &c("~/.cache/x").unwrap()));
    }
}

#[cfg(test)]
mod properties {
    use proptest::prelude::*;

    use super::*;

    /// Path-like strings: segments of letters, dots, tildes and slashes, so `.`, `..`, `~`,
    /// empty segments and prefix tricks all come up often.
    fn raw_path() -> impl Strategy<Value = String> {
        proptest::string::string_regex("(/|~/|~)?([a-c.~]{0,3}/{1,2}){0,6}[a-c.]{0,3}")
            .expect("a valid regex")
    }

    const WS: &str = "/workspace/run-42";
    const HOME: &str = "/home/agent";
    const ROOT: &str = "/usr/share/doc";

    proptest! {
        #[test]
        fn canonical_paths_are_absolute_normalized_and_idempotent(raw in raw_path()) {
            prop_assume!(!raw.is_empty());
            let path = canonical(&raw, WS, HOME).expect("non-empty, no NUL");
            prop_assert!(path.starts_with('/'));
            prop_assert!(path == "/" || !path.ends_with('/'));
            prop_assert!(!path.contains("//"));
            prop_assert!(!path.split('/').any(|s| s == "." || s == ".."));
            prop_assert_eq!(canonical(&path, WS, HOME), Ok(path.clone()));
            prop_assert_eq!(normalize(&path), path);
        }

        #[test]
        fn containment_is_exactly_being_under_a_root(raw in raw_path()) {
            prop_assume!(!raw.is_empty());
            let path = canonical(&raw, WS, HOME).expect("canonical");
            for root in [WS, ROOT] {
                let under = path == root || path.starts_with(&format!("{root}/"));
                prop_assert_eq!(contains(root, &path), under, "{} in {}", path, root);
            }
        }
    }
}
