//! `Config::parse` on arbitrary text: never panics; an accepted config satisfies the rules
//! validation promises (positive limits, bounded depth, safe names, canonical paths), and
//! parsing the same text again gives the same config, or the same error.
#![no_main]

use std::fmt::Write as _;

use libfuzzer_sys::fuzz_target;
use toolgate::config::{Config, Limits, MAX_JSON_DEPTH};
use toolgate::ids::ToolName;
use toolgate::paths::normalize;

/// Everything a config holds, in a stable order, as text.
fn describe(c: &Config) -> String {
    let p = &c.policy;
    let mut out = format!(
        "{:?}\n{:?}\n{:?}\n{:?}\n{:?}\n{}\n{:?}\n",
        c.listen, c.admin, c.store, p.limits, p.runs, p.max_request_bytes, p.paths
    );
    let mut names: Vec<&ToolName> = p.tools.keys().collect();
    names.sort();
    for name in names {
        let t = &p.tools[name];
        let _ = writeln!(
            out,
            "{name}: {} {:?} ro={} {:?} schema={:?}/{} {:?} {:?} {:?} file={:?} auth={} {:?} {:?} {:?}",
            t.upstream,
            t.protocol,
            t.read_only,
            t.timeout,
            t.input_schema,
            t.schema.is_some(),
            t.limits,
            t.projection,
            t.description,
            t.upstream_token_file,
            t.upstream_auth.is_some(),
            t.params,
            t.read_roots,
            t.network,
        );
    }
    out
}

fn check_limits(l: &Limits) {
    assert!(l.request_bytes > 0 && l.raw_bytes > 0 && l.agent_bytes > 0 && l.record_bytes > 0);
    assert!(
        (1..=MAX_JSON_DEPTH as usize).contains(&l.json_depth),
        "json_depth {}",
        l.json_depth
    );
}

fn is_canonical(path: &str) -> bool {
    path.starts_with('/') && normalize(path) == path
}

fn check(c: &Config) {
    let p = &c.policy;
    check_limits(&p.limits);
    assert!(p.runs.default_timeout_ms > 0);
    assert!(p.runs.default_timeout_ms <= p.runs.max_timeout_ms);
    assert!(c.store.record_ttl_ms > 0 && c.store.memory_max_bytes > 0);
    assert!(!c.store.timeout.is_zero());
    assert!(!c.store.key_prefix.is_empty());
    for path in [&p.paths.workspace, &p.paths.home] {
        assert!(is_canonical(path) && path != "/", "run path {path:?}");
    }
    let mut max_request = p.limits.request_bytes;
    for (name, tool) in &p.tools {
        assert_eq!(*name, tool.name);
        assert!(
            ToolName::parse(name.as_str()).is_some(),
            "unsafe tool name {name:?}"
        );
        check_limits(&tool.limits);
        assert!(!tool.timeout.is_zero());
        assert!(matches!(tool.upstream.scheme_str(), Some("http" | "https")));
        assert!(tool.upstream.host().is_some());
        let select = &tool.projection.select;
        assert!(
            select.is_empty() || select.starts_with('/'),
            "select {select:?}"
        );
        assert_eq!(tool.schema.is_some(), tool.input_schema.is_some());
        for root in &tool.read_roots {
            assert!(is_canonical(root), "read root {root:?}");
        }
        for param in &tool.params {
            assert!(param.pointer.starts_with('/') && !param.segments.is_empty());
        }
        max_request = max_request.max(tool.limits.request_bytes);
    }
    assert_eq!(p.max_request_bytes, max_request);
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // `upstream_token_file` is read at parse time: keep the target away from device files
    // (an endless /dev/zero, a blocking /dev/stdin), whose reading says nothing about parsing.
    if text.contains("/dev") || text.contains("/proc") || text.contains("/sys") {
        return;
    }
    match Config::parse(text) {
        Ok(config) => {
            check(&config);
            let again = Config::parse(text).expect("a config that parsed parses again");
            assert_eq!(describe(&config), describe(&again));
            assert!(config.restart_needed(&again).is_none());
        }
        Err(e) => {
            let again = Config::parse(text).expect_err("a config that failed fails again");
            assert_eq!(e.0, again.0);
        }
    }
});
