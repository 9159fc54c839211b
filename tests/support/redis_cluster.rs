//! A real Redis Cluster for tests: 3 primaries and 3 replicas spawned from `redis-server` on free
//! loopback ports in a temporary directory, and stopped by PID.
//!
//! [`shared`] gives one lazily spawned cluster per test binary for non-destructive tests;
//! [`RedisCluster::start`] gives a private one for tests that pause or kill nodes. A watchdog
//! process removes every node when the test process exits, because a `static` is never dropped.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

const MISSING: &str = "redis-server not found: install it with `apt-get install redis-server` (or run scripts/test.sh)";

/// How long spawning and forming a cluster may take before the test fails.
const FORM_TIMEOUT: Duration = Duration::from_secs(60);

pub struct Node {
    pub port: u16,
    pub pid: u32,
}

pub struct RedisCluster {
    dir: PathBuf,
    /// All six nodes, in spawn order.
    pub nodes: Vec<Node>,
    /// Indexes into `nodes` of the primaries as the cluster was formed.
    primaries: Vec<usize>,
    children: Mutex<Vec<Child>>,
    watchdog: Option<Child>,
    killed: Mutex<Vec<u32>>,
}

/// The cluster shared by every test of this binary that does not disturb it.
/// If it cannot be formed, every test that needs it fails with the first failure's message.
pub fn shared() -> &'static RedisCluster {
    static SHARED: OnceLock<Result<RedisCluster, String>> = OnceLock::new();
    let formed = SHARED.get_or_init(|| {
        std::panic::catch_unwind(RedisCluster::start).map_err(|panic| {
            panic
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
                .unwrap_or_else(|| "the shared cluster could not be formed".into())
        })
    });
    match formed {
        Ok(cluster) => cluster,
        Err(message) => panic!("{message}"),
    }
}

impl RedisCluster {
    /// Spawns and forms a 6-node cluster; panics (fails the test) if it cannot.
    pub fn start() -> RedisCluster {
        RedisCluster::start_on(free_ports(6))
    }

    /// [`Self::start`] off the async runtime's threads, for a test of its own.
    pub async fn spawn() -> RedisCluster {
        tokio::task::spawn_blocking(RedisCluster::start)
            .await
            .expect("spawn cluster")
    }

    /// [`Self::start`] on the given ports (from [`free_ports`]), e.g. ones a client already uses.
    pub fn start_on(ports: Vec<u16>) -> RedisCluster {
        match Command::new("redis-server").arg("--version").output() {
            Ok(out) if out.status.success() => {}
            Ok(out) => panic!("{MISSING} (redis-server --version exited {})", out.status),
            Err(e) => panic!("{MISSING} ({e})"),
        }
        if Command::new("redis-cli").arg("--version").output().is_err() {
            panic!(
                "redis-cli not found: install it with `apt-get install redis-server` (or run scripts/test.sh)"
            );
        }
        let dir = super::temp_dir("redis-cluster");
        let mut cluster = RedisCluster {
            dir,
            nodes: Vec::new(),
            primaries: Vec::new(),
            children: Mutex::new(Vec::new()),
            watchdog: None,
            killed: Mutex::new(Vec::new()),
        };
        // From here a panic drops `cluster`, which stops whatever was spawned.
        for port in ports {
            let child = spawn_node(&cluster.dir, port);
            cluster.nodes.push(Node {
                port,
                pid: child.id(),
            });
            lock(&cluster.children).push(child);
        }
        cluster.watchdog = Some(spawn_watchdog(&cluster.dir, &cluster.nodes));
        let deadline = Instant::now() + FORM_TIMEOUT;
        for node in &cluster.nodes {
            poll(
                deadline,
                &format!("node {} answers PING", node.port),
                || query(node.port, &["PING"]).is_some_and(|r| r == "PONG"),
            );
        }
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &cluster.nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let out = create
            .args(["--cluster-replicas", "1", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .expect("run redis-cli --cluster create");
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        cluster.wait_healthy(deadline);
        cluster.primaries = (0..cluster.nodes.len())
            .filter(|&i| info(cluster.nodes[i].port, "replication").contains("role:master"))
            .collect();
        assert_eq!(cluster.primaries.len(), 3, "3 primaries after forming");
        cluster
    }

    /// Every node's URL, for `store.nodes`.
    pub fn urls(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| format!("redis://127.0.0.1:{}", n.port))
            .collect()
    }

    /// The primaries as the cluster was formed.
    pub fn primaries(&self) -> Vec<&Node> {
        self.primaries.iter().map(|&i| &self.nodes[i]).collect()
    }

    pub fn primary_pids(&self) -> Vec<u32> {
        self.primaries().iter().map(|n| n.pid).collect()
    }

    /// Freezes every primary (SIGSTOP): they keep their sockets but answer nothing.
    pub fn pause_primaries(&self) {
        for pid in self.primary_pids() {
            signal("-STOP", pid);
        }
    }

    /// Thaws every node paused by [`Self::pause_primaries`].
    pub fn resume(&self) {
        for pid in self.primary_pids() {
            signal("-CONT", pid);
        }
    }

    /// The replica of `primary`, as the cluster was formed.
    pub fn replica_of(&self, primary: &Node) -> &Node {
        let marker = format!("master_port:{}\r\n", primary.port);
        self.nodes
            .iter()
            .find(|n| info(n.port, "replication").contains(&marker))
            .expect("every primary has a replica")
    }

    /// Closes `primary`'s replication links, as a network partition would: writes after this
    /// reach no replica until one reconnects.
    pub fn disconnect_replicas(&self, primary: &Node) {
        let killed = query(primary.port, &["CLIENT", "KILL", "TYPE", "replica"]);
        assert!(
            killed.as_deref().is_some_and(|n| n != "0"),
            "no replica link to close on {}: {killed:?}",
            primary.port
        );
    }

    /// Freezes one node (SIGSTOP).
    pub fn pause(&self, node: &Node) {
        signal("-STOP", node.pid);
    }

    /// Thaws one node (SIGCONT).
    pub fn resume_node(&self, node: &Node) {
        signal("-CONT", node.pid);
    }

    /// Kills the `i`-th original primary with SIGKILL, as a crash would.
    pub fn kill_primary(&self, i: usize) -> &Node {
        let node = self.primaries()[i];
        self.kill_pid(node.pid);
        node
    }

    /// The original primary that serves `key`'s hash slot, as an index for [`Self::kill_primary`].
    pub fn primary_index_for_key(&self, key: &str) -> usize {
        let port = self.primaries()[0].port;
        let slot: u16 = query(port, &["CLUSTER", "KEYSLOT", key])
            .and_then(|s| s.parse().ok())
            .expect("CLUSTER KEYSLOT");
        let nodes = query(port, &["CLUSTER", "NODES"]).expect("CLUSTER NODES");
        for line in nodes.lines() {
            let fields: Vec<&str> = line.split_whitespace().collect();
            if fields.len() < 9 || !fields[2].contains("master") {
                continue;
            }
            let owns = fields[8..].iter().any(|range| {
                let mut ends = range.split('-').map(|p| p.parse::<u16>());
                match (ends.next(), ends.next()) {
                    (Some(Ok(a)), Some(Ok(b))) => (a..=b).contains(&slot),
                    (Some(Ok(a)), None) => a == slot,
                    _ => false,
                }
            });
            if owns {
                let port: u16 = fields[1]
                    .split(['@', ':'])
                    .nth(1)
                    .and_then(|p| p.parse().ok())
                    .expect("node address");
                return self
                    .primaries()
                    .iter()
                    .position(|n| n.port == port)
                    .expect("the slot's owner is an original primary");
            }
        }
        panic!("no primary owns slot {slot}");
    }

    /// Polls until every live node reports `cluster_state:ok`, sees all slots served, and
    /// every replica's link to its primary is up.
    pub fn wait_healthy(&self, deadline: Instant) {
        let killed = lock(&self.killed).clone();
        for node in self.nodes.iter().filter(|n| !killed.contains(&n.pid)) {
            poll(deadline, &format!("node {} healthy", node.port), || {
                let cluster = cluster_info(node.port);
                let repl = info(node.port, "replication");
                cluster.contains("cluster_state:ok")
                    && cluster.contains("cluster_slots_ok:16384")
                    && (repl.contains("role:master") || repl.contains("master_link_status:up"))
            });
        }
    }

    /// Polls until a failover after [`Self::kill_primary`] completed: every live node flags the
    /// killed node `fail` and reports `cluster_state:ok`, so every slot has a live primary.
    pub fn wait_failover(&self, killed: &Node, deadline: Instant) {
        let dead = lock(&self.killed).clone();
        let marker = format!("127.0.0.1:{}@", killed.port);
        for node in self.nodes.iter().filter(|n| !dead.contains(&n.pid)) {
            poll(
                deadline,
                &format!("failover seen by node {}", node.port),
                || {
                    let nodes = query(node.port, &["CLUSTER", "NODES"]).unwrap_or_default();
                    let flagged = nodes.lines().any(|line| {
                        line.contains(&marker)
                            && line
                                .split_whitespace()
                                .nth(2)
                                .is_some_and(|flags| flags.split(',').any(|f| f == "fail"))
                    });
                    flagged && cluster_info(node.port).contains("cluster_state:ok")
                },
            );
        }
    }

    fn kill_pid(&self, pid: u32) {
        let mut children = lock(&self.children);
        if let Some(child) = children.iter_mut().find(|c| c.id() == pid) {
            let _ = child.kill();
            let _ = child.wait();
        }
        lock(&self.killed).push(pid);
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        if std::thread::panicking() {
            // The nodes' own view of what happened, before the directory goes.
            for node in &self.nodes {
                let log =
                    std::fs::read_to_string(self.dir.join(node.port.to_string()).join("redis.log"))
                        .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(25).collect();
                eprintln!("--- redis {} (pid {}) log tail ---", node.port, node.pid);
                for line in tail.iter().rev() {
                    eprintln!("{line}");
                }
            }
        }
        if let Some(mut watchdog) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
        let killed = lock(&self.killed).clone();
        for child in lock(&self.children).iter_mut() {
            if killed.contains(&child.id()) {
                continue; // already reaped: its pid may belong to someone else now
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// `n` ports free on 127.0.0.1 whose cluster bus port (+10000) is free too.
pub fn free_ports(n: usize) -> Vec<u16> {
    let mut held = Vec::new();
    let mut ports = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while ports.len() < n {
        assert!(Instant::now() < deadline, "no free port pairs found");
        let l = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
        let port = l.local_addr().expect("local addr").port();
        if port > 55_000 {
            continue;
        }
        if let Ok(bus) = TcpListener::bind(("127.0.0.1", port + 10_000)) {
            held.push(l);
            held.push(bus);
            ports.push(port);
        }
    }
    // Released just before the nodes bind them.
    drop(held);
    ports
}

fn spawn_node(dir: &Path, port: u16) -> Child {
    let node_dir = dir.join(port.to_string());
    std::fs::create_dir_all(&node_dir).expect("node dir");
    Command::new("redis-server")
        .args(["--port", &port.to_string()])
        .args(["--bind", "127.0.0.1"])
        .args(["--cluster-enabled", "yes"])
        .args(["--cluster-config-file", "nodes.conf"])
        .args(["--cluster-node-timeout", "2000"])
        .args(["--repl-diskless-sync-delay", "0"])
        .args(["--save", ""])
        .args(["--appendonly", "no"])
        .args(["--daemonize", "no"])
        .arg("--dir")
        .arg(&node_dir)
        .arg("--logfile")
        .arg(node_dir.join("redis.log"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("{MISSING} ({e})"))
}

/// A shell that waits for this test process to exit, then kills the nodes and removes `dir`.
fn spawn_watchdog(dir: &Path, nodes: &[Node]) -> Child {
    let pids: Vec<String> = nodes.iter().map(|n| n.pid.to_string()).collect();
    let script = format!(
        "while kill -0 {parent} 2>/dev/null; do sleep 0.5; done; \
         for p in {pids}; do \
           if grep -q redis-server /proc/$p/cmdline 2>/dev/null; then kill -CONT $p; kill -KILL $p; fi; \
         done; rm -rf '{dir}'",
        parent = std::process::id(),
        pids = pids.join(" "),
        dir = dir.display(),
    );
    Command::new("sh")
        .arg("-c")
        .arg(script)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn the cluster watchdog")
}

fn signal(sig: &str, pid: u32) {
    let _ = Command::new("kill")
        .arg(sig)
        .arg(pid.to_string())
        .stderr(Stdio::null())
        .status();
}

/// One command over a plain connection, with short timeouts; `None` if the node does not answer.
pub fn query(port: u16, args: &[&str]) -> Option<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}")).ok()?;
    let mut conn = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .ok()?;
    conn.set_read_timeout(Some(Duration::from_millis(1000)))
        .ok()?;
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    let value: redis::Value = cmd.query(&mut conn).ok()?;
    match value {
        redis::Value::Okay => Some("OK".into()),
        redis::Value::Int(i) => Some(i.to_string()),
        v => redis::from_redis_value::<String>(v).ok(),
    }
}

fn info(port: u16, section: &str) -> String {
    query(port, &["INFO", section]).unwrap_or_default()
}

fn cluster_info(port: u16) -> String {
    query(port, &["CLUSTER", "INFO"]).unwrap_or_default()
}

/// Polls `ok` every 50 ms until it holds; fails the test at `deadline`.
pub fn poll(deadline: Instant, what: &str, mut ok: impl FnMut() -> bool) {
    while !ok() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        // Blocking code on its own thread (the cluster is spawned outside any runtime).
        #[allow(clippy::disallowed_methods)]
        std::thread::sleep(Duration::from_millis(50));
    }
}
