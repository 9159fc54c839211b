//! Preflight step 9b: parameter roles. A tool declares what role its arguments play (`params`);
//! every gate dispatches on the role, never on the tool's name:
//!
//! - `path` and `source_path`: the canonical path rule ([`crate::paths`]), then containment in
//!   the run's workspace or one of the tool's `read_roots`;
//! - `network_target`: a WHATWG URL, `http`/`https` without credentials, and a host that is not,
//!   and does not resolve to, a private, loopback, link-local or otherwise internal address.
//!
//! Every argument is parsed before any is judged, so a malformed one answers `INVALID_INPUT`
//! even when another would be denied. The tool then receives exactly what was judged: the
//! canonical path, the normalized URL. What the agent sent is kept as the record's
//! `agent_input` when anything changed.

use std::future::Future;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use serde_json::Value;
use url::{Host, Url};

use crate::config::{Network, Param, RunPaths, Segment, Tool};
use crate::error::{Code, Error, Role};
use crate::paths;

/// A host name gets this long to resolve; past it the target is denied.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// The input to forward, and the agent's own when it differs.
pub struct Checked {
    pub input: Value,
    pub agent_input: Option<Value>,
}

/// Resolves host names. The system resolver in production; a fixed table in tests.
pub trait Resolver: Sync {
    fn resolve(
        &self,
        host: &str,
        port: u16,
    ) -> impl Future<Output = io::Result<Vec<IpAddr>>> + Send;
}

/// The system resolver (`getaddrinfo`, through tokio).
pub struct SystemResolver;

impl Resolver for SystemResolver {
    async fn resolve(&self, host: &str, port: u16) -> io::Result<Vec<IpAddr>> {
        Ok(tokio::net::lookup_host((host, port))
            .await?
            .map(|a| a.ip())
            .collect())
    }
}

/// One argument found in the input: where it is, its role, and what it parsed to.
struct Argument<'p> {
    at: Vec<Step>,
    param: &'p Param,
    parsed: Parsed,
}

/// A step from the input's root to an argument.
#[derive(Clone)]
enum Step {
    Key(String),
    Index(usize),
}

enum Parsed {
    Path(String),
    Url(Url),
}

/// Checks and rewrites `input` by the tool's `params`.
pub async fn check(
    tool: &Tool,
    run: &RunPaths,
    input: Value,
    resolver: &impl Resolver,
) -> Result<Checked, Error> {
    if tool.params.is_empty() {
        return Ok(Checked {
            input,
            agent_input: None,
        });
    }
    // Parse every argument first.
    let mut arguments = Vec::new();
    for param in &tool.params {
        let mut found = Vec::new();
        find(&input, &param.segments, &mut Vec::new(), &mut found)
            .map_err(|why| invalid(param, why))?;
        for (at, raw) in found {
            let parsed = match param.role {
                Role::Path | Role::SourcePath => paths::canonical(raw, &run.workspace, &run.home)
                    .map(Parsed::Path)
                    .map_err(|e| invalid(param, format!("{e:?}")))?,
                Role::NetworkTarget => Url::parse(raw)
                    .map(Parsed::Url)
                    .map_err(|e| invalid(param, e))?,
            };
            arguments.push(Argument { at, param, parsed });
        }
    }
    // Then judge them.
    for argument in &arguments {
        let allowed = match &argument.parsed {
            Parsed::Path(path) => contained(path, &run.workspace, &tool.read_roots),
            Parsed::Url(url) => reachable(url, &tool.network, resolver).await,
        };
        if !allowed {
            return Err(Error::with_cause(
                Code::PolicyDenied(argument.param.role),
                format!(
                    "{} {} is outside what the tool may touch",
                    argument.param.role.as_str(),
                    argument.param.pointer
                ),
            ));
        }
    }
    // The tool acts on what was judged.
    let mut forwarded = input.clone();
    let mut changed = false;
    for argument in arguments {
        let value = match argument.parsed {
            Parsed::Path(p) => p,
            Parsed::Url(u) => String::from(u),
        };
        if let Some(slot) = locate(&mut forwarded, &argument.at)
            && slot.as_str() != Some(value.as_str())
        {
            *slot = Value::String(value);
            changed = true;
        }
    }
    Ok(if changed {
        Checked {
            input: forwarded,
            agent_input: Some(input),
        }
    } else {
        Checked {
            input,
            agent_input: None,
        }
    })
}

fn invalid(param: &Param, why: impl std::fmt::Display) -> Error {
    Error::with_cause(
        Code::InvalidInput,
        format!("{} {}: {why}", param.role.as_str(), param.pointer),
    )
}

/// Every string the pointer reaches. An absent argument is skipped; a present one that is not
/// a string (`null` included), or a container of the wrong kind on the way, is malformed.
fn find<'v>(
    value: &'v Value,
    segments: &[Segment],
    at: &mut Vec<Step>,
    out: &mut Vec<(Vec<Step>, &'v str)>,
) -> Result<(), &'static str> {
    let Some((first, rest)) = segments.split_first() else {
        return match value {
            Value::String(s) => {
                out.push((at.clone(), s));
                Ok(())
            }
            _ => Err("not a string"),
        };
    };
    match (first, value) {
        (Segment::Key(key), Value::Object(map)) => match map.get(key) {
            None => Ok(()),
            Some(v) => {
                at.push(Step::Key(key.clone()));
                let r = find(v, rest, at, out);
                at.pop();
                r
            }
        },
        (Segment::Key(_), _) => Err("not an object"),
        (Segment::Each, Value::Array(items)) => {
            for (i, v) in items.iter().enumerate() {
                at.push(Step::Index(i));
                let r = find(v, rest, at, out);
                at.pop();
                r?;
            }
            Ok(())
        }
        (Segment::Each, _) => Err("* met something that is not an array"),
    }
}

fn locate<'v>(value: &'v mut Value, at: &[Step]) -> Option<&'v mut Value> {
    at.iter().try_fold(value, |v, step| match step {
        Step::Key(k) => v.get_mut(k.as_str()),
        Step::Index(i) => v.get_mut(*i),
    })
}

/// Rule 5: the workspace or inside it, or one of the read roots or inside it.
fn contained(path: &str, workspace: &str, read_roots: &[String]) -> bool {
    paths::contains(workspace, path) || read_roots.iter().any(|root| paths::contains(root, path))
}

/// The network rule: scheme and credentials, then the allow-list, then the address rule.
async fn reachable(url: &Url, network: &Network, resolver: &impl Resolver) -> bool {
    if !matches!(url.scheme(), "http" | "https")
        || !url.username().is_empty()
        || url.password().is_some()
    {
        return false;
    }
    let Some(host) = url.host() else {
        return false;
    };
    let host_text = match &host {
        Host::Ipv6(a) => a.to_string(),
        _ => url.host_str().unwrap_or_default().to_string(),
    };
    if network
        .allow_hosts
        .iter()
        .any(|p| p.matches(&host_text) || p.matches(&format!("[{host_text}]")))
    {
        return true;
    }
    if !network.deny_private {
        return true;
    }
    match host {
        Host::Ipv4(a) => !denied(IpAddr::V4(a)),
        Host::Ipv6(a) => !denied(IpAddr::V6(a)),
        Host::Domain(name) => {
            let name = name.trim_end_matches('.').to_ascii_lowercase();
            if name == "localhost" || name.ends_with(".localhost") {
                return false;
            }
            let port = url.port_or_known_default().unwrap_or(80);
            match tokio::time::timeout(RESOLVE_TIMEOUT, resolver.resolve(&name, port)).await {
                Ok(Ok(addrs)) => !addrs.is_empty() && !addrs.into_iter().any(denied),
                Ok(Err(_)) | Err(_) => false,
            }
        }
    }
}

/// Whether an address is one a tool may not be pointed at: loopback, unspecified, private,
/// link-local (cloud metadata included), shared, unique-local, multicast, reserved or
/// benchmarking. IPv6 forms that carry an IPv4 address are judged by it.
pub fn denied(addr: IpAddr) -> bool {
    match addr {
        IpAddr::V4(a) => denied_v4(a),
        IpAddr::V6(a) => match embedded_v4(a) {
            Some(v4) => denied_v4(v4),
            None => {
                a.is_loopback()
                    || a.is_unspecified()
                    || a.is_unicast_link_local()
                    || a.is_unique_local()
                    || a.is_multicast()
            }
        },
    }
}

/// The std predicates, plus the three ranges std does not name yet (stable Rust has no
/// `is_shared`, `is_benchmarking` or `is_reserved`) and all of 0.0.0.0/8.
fn denied_v4(a: Ipv4Addr) -> bool {
    let within = |net: [u8; 4], bits: u32| {
        let mask = u32::MAX.checked_shl(32 - bits).unwrap_or(0);
        u32::from(a) & mask == u32::from(Ipv4Addr::from(net)) & mask
    };
    a.is_loopback()
        || within([0, 0, 0, 0], 8)
        || a.is_private()
        || a.is_link_local()
        || within([100, 64, 0, 0], 10)
        || a.is_multicast()
        || within([240, 0, 0, 0], 4)
        || within([198, 18, 0, 0], 15)
}

/// The IPv4 address an IPv6 one carries: IPv4-mapped (::ffff:0:0/96), IPv4-compatible (::/96),
/// NAT64 (64:ff9b::/96) and 6to4 (2002::/16).
fn embedded_v4(a: Ipv6Addr) -> Option<Ipv4Addr> {
    let s = a.segments();
    let last32 = || Ipv4Addr::new((s[6] >> 8) as u8, s[6] as u8, (s[7] >> 8) as u8, s[7] as u8);
    if let Some(v4) = a.to_ipv4_mapped() {
        return Some(v4);
    }
    match s {
        [0, 0, 0, 0, 0, 0, _, _] => Some(last32()),
        [0x64, 0xff9b, 0, 0, 0, 0, _, _] => Some(last32()),
        [0x2002, hi, lo, ..] => Some(Ipv4Addr::new(
            (hi >> 8) as u8,
            hi as u8,
            (lo >> 8) as u8,
            lo as u8,
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use serde_json::json;

    use super::*;
    use crate::config::Config;

    /// `/etc/hosts`-style test data: a name not listed does not resolve.
    struct Table(HashMap<&'static str, Vec<IpAddr>>);

    impl Resolver for Table {
        async fn resolve(&self, host: &str, _port: u16) -> io::Result<Vec<IpAddr>> {
            self.0
                .get(host)
                .cloned()
                .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such host"))
        }
    }

    fn table() -> Table {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        Table(HashMap::from([
            ("docs.example.org", vec![ip("93.184.216.34")]),
            (
                "sneaky.example.org",
                vec![ip("93.184.216.34"), ip("127.0.0.1")],
            ),
            ("internal.example.org", vec![ip("10.1.2.3")]),
        ]))
    }

    fn tool(yaml: &str) -> std::sync::Arc<Tool> {
        let config = Config::parse(&format!(
            "tools:\n  - {{name: t, upstream: 'http://x/', read_only: true, {yaml}}}"
        ))
        .expect("valid tool");
        config.policy.tool("t").expect("tool").clone()
    }

    fn run() -> RunPaths {
        RunPaths {
            workspace: "/workspace/run-42".into(),
            home: "/home/agent".into(),
        }
    }

    async fn run_check(tool: &Tool, input: Value) -> Result<Checked, Code> {
        check(tool, &run(), input, &table())
            .await
            .map_err(|e| e.code)
    }

    #[test]
    fn every_range_is_denied_in_both_families() {
        for denied_addr in [
            "127.0.0.1",
            "127.255.255.254",
            "0.0.0.0",
            "0.1.2.3",
            "10.0.0.1",
            "172.16.0.1",
            "172.31.255.255",
            "192.168.1.1",
            "169.254.169.254",
            "100.64.0.1",
            "100.127.255.255",
            "224.0.0.1",
            "239.255.255.255",
            "240.0.0.1",
            "255.255.255.255",
            "198.18.0.1",
            "198.19.255.255",
            "::1",
            "::",
            "fe80::1",
            "fc00::1",
            "fd12:3456::1",
            "ff02::1",
            "::ffff:127.0.0.1",
            "::ffff:169.254.169.254",
            "::127.0.0.1",
            "::10.0.0.1",
            "64:ff9b::10.0.0.1",
            "64:ff9b::7f00:1",
            "2002:7f00:1::",
            "2002:a9fe:a9fe::1",
        ] {
            assert!(
                denied(denied_addr.parse().unwrap()),
                "{denied_addr} should be denied"
            );
        }
        for allowed in [
            "93.184.216.34",
            "8.8.8.8",
            "172.32.0.1",
            "100.128.0.1",
            "198.20.0.1",
            "2606:4700::1111",
            "::ffff:8.8.8.8",
            "64:ff9b::808:808",
            "2002:808:808::",
            "192.0.2.1",
        ] {
            assert!(
                !denied(allowed.parse().unwrap()),
                "{allowed} should be allowed"
            );
        }
    }

    #[tokio::test]
    async fn network_targets() {
        let fetch = tool(
            "params: {/url: network_target}, network: {allow_hosts: ['*.example.com', 'pinned.test', '10.9.9.9']}",
        );
        let cases: &[(&str, Result<&str, Code>)] = &[
            (
                "https://docs.example.org/a?b=1",
                Ok("https://docs.example.org/a?b=1"),
            ),
            ("HTTP://Docs.Example.Org", Ok("http://docs.example.org/")),
            (
                "http://0x7f.1/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://2130706433/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://127.1/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://0177.0.0.1/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://169.254.169.254/latest/meta-data/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://[::ffff:7f00:1]/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://[fd00::1]:8080/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://localhost:6379/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://localhost./",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://redis.localhost/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://user:pw@docs.example.org/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://user@docs.example.org/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "ftp://docs.example.org/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "file:///etc/passwd",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://sneaky.example.org/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://internal.example.org/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            (
                "http://nowhere.invalid/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            // The allow-list exempts from the address rule: a subdomain, an exact name, an IP.
            ("http://a.b.example.com/", Ok("http://a.b.example.com/")),
            (
                "http://example.com/",
                Err(Code::PolicyDenied(Role::NetworkTarget)),
            ),
            ("http://PINNED.test./", Ok("http://pinned.test./")),
            ("http://10.9.9.9/", Ok("http://10.9.9.9/")),
            ("not a url", Err(Code::InvalidInput)),
            ("/relative/only", Err(Code::InvalidInput)),
        ];
        for (url, want) in cases {
            let got = run_check(&fetch, json!({"url": url})).await;
            let got = got.map(|c| c.input["url"].as_str().unwrap_or_default().to_string());
            assert_eq!(got.as_deref().map_err(|c| *c), want.clone(), "{url}");
        }
        let open = tool("params: {/url: network_target}, network: {deny_private: false}");
        let got = run_check(&open, json!({"url": "http://127.0.0.1:6379/"})).await;
        assert!(got.is_ok(), "deny_private: false judges no address");
        assert_eq!(
            run_check(&open, json!({"url": "gopher://127.0.0.1/"}))
                .await
                .err(),
            Some(Code::PolicyDenied(Role::NetworkTarget))
        );
    }

    #[tokio::test]
    async fn paths_are_canonical_and_contained() {
        let read = tool(
            "params: {/path: path, /against: source_path, /files/*/name: path}, read_roots: [/usr/share/doc/]",
        );
        let denied_path = Err(Code::PolicyDenied(Role::Path));
        for (input, want) in [
            (
                json!({"path": "notes.md"}),
                Ok(json!({"path": "/workspace/run-42/notes.md"})),
            ),
            (
                json!({"path": "/workspace/run-42/a/../b"}),
                Ok(json!({"path": "/workspace/run-42/b"})),
            ),
            (
                json!({"path": "/usr/share/doc/x"}),
                Ok(json!({"path": "/usr/share/doc/x"})),
            ),
            (json!({"path": "~/.ssh/id_rsa"}), denied_path.clone()),
            (json!({"path": "~/.cache/x"}), denied_path.clone()),
            (json!({"path": "../../etc/passwd"}), denied_path.clone()),
            (json!({"path": "/workspace/run-420/x"}), denied_path.clone()),
            (json!({"path": "/usr/share/docs"}), denied_path.clone()),
            (
                json!({"path": "~other/x"}),
                Ok(json!({"path": "/workspace/run-42/~other/x"})),
            ),
            (
                json!({"path": "x", "against": "/etc/shadow"}),
                Err(Code::PolicyDenied(Role::SourcePath)),
            ),
            (json!({"path": ""}), Err(Code::InvalidInput)),
            (json!({"path": "a\u{0}b"}), Err(Code::InvalidInput)),
            (json!({"path": null}), Err(Code::InvalidInput)),
            (json!({"path": 7}), Err(Code::InvalidInput)),
            (json!({"files": {"name": "x"}}), Err(Code::InvalidInput)),
            (
                json!({"files": [{"name": "a"}, {"other": 1}, {"name": "b/../c"}]}),
                Ok(
                    json!({"files": [{"name": "/workspace/run-42/a"}, {"other": 1}, {"name": "/workspace/run-42/c"}]}),
                ),
            ),
            (json!({"files": [{"name": "/etc/x"}]}), denied_path.clone()),
            (json!({"other": "~/x"}), Ok(json!({"other": "~/x"}))),
            // Parsed before judged: the malformed one wins over the denied one.
            (
                json!({"path": "/etc/passwd", "against": ""}),
                Err(Code::InvalidInput),
            ),
        ] {
            let got = run_check(&read, input.clone()).await.map(|c| c.input);
            assert_eq!(got, want, "{input}");
        }
        let kept = run_check(&read, json!({"path": "notes.md"})).await.unwrap();
        assert_eq!(kept.agent_input, Some(json!({"path": "notes.md"})));
        let same = run_check(&read, json!({"path": "/workspace/run-42/notes.md"}))
            .await
            .unwrap();
        assert_eq!(same.agent_input, None, "nothing rewritten, no agent_input");
    }
}
