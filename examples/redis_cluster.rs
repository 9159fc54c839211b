//! The integration tests' Redis Cluster (`tests/support/redis_cluster.rs`) as a process, for the
//! scripts (the end-to-end scenario and the benchmark): six `redis-server` nodes on free loopback
//! ports, three primaries and three replicas, nothing persisted.
//!
//!     redis_cluster
//!
//! Once every node reports the cluster healthy it prints the node URLs on one line of stdout,
//! separated by spaces (`redis://127.0.0.1:PORT ...`). It stops the nodes and removes their
//! directory on SIGTERM or SIGINT, or when its stdin is a pipe and reaches end of file (so a
//! parent that dies takes the cluster with it); then it exits 0. If this process is killed
//! outright, the spawner's watchdog removes the nodes.

#[allow(dead_code)]
#[path = "../tests/support/redis_cluster.rs"]
mod redis_cluster;

use std::io::{Read, Write};
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;

use tokio::signal::unix::{SignalKind, signal};

/// A fresh directory for the nodes (the spawner removes it when the cluster stops).
fn temp_dir(tag: &str) -> PathBuf {
    let at = toolgate::clock::now_ms();
    let dir = std::env::temp_dir().join(format!("toolgate-{tag}-{}-{at}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("create temp dir");
    dir
}

fn main() {
    if std::env::args().len() > 1 {
        eprintln!("usage: redis_cluster (no arguments)");
        std::process::exit(64);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    // Handlers first: a SIGTERM while the cluster forms must not skip the cleanup.
    let (mut term, mut int) = runtime.block_on(async {
        (
            signal(SignalKind::terminate()).expect("SIGTERM handler"),
            signal(SignalKind::interrupt()).expect("SIGINT handler"),
        )
    });
    let cluster = redis_cluster::RedisCluster::start();
    println!("{}", cluster.urls().join(" "));
    std::io::stdout().flush().expect("flush stdout");
    eprintln!(
        "redis_cluster: {} nodes up, primaries on ports {:?}",
        cluster.nodes.len(),
        cluster
            .primaries()
            .iter()
            .map(|n| n.port)
            .collect::<Vec<_>>()
    );

    let (eof_tx, eof_rx) = tokio::sync::oneshot::channel::<()>();
    let stdin_is_pipe = std::fs::metadata("/proc/self/fd/0")
        .map(|m| m.file_type().is_fifo() || m.file_type().is_socket())
        .unwrap_or(false);
    if stdin_is_pipe {
        std::thread::spawn(move || {
            let mut buf = [0u8; 256];
            let mut stdin = std::io::stdin();
            while matches!(stdin.read(&mut buf), Ok(n) if n > 0) {}
            let _ = eof_tx.send(());
        });
    }
    let why = runtime.block_on(async {
        let eof = async {
            if stdin_is_pipe {
                let _ = eof_rx.await;
            } else {
                std::future::pending::<()>().await;
            }
        };
        tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
            _ = eof => "end of stdin",
        }
    });
    eprintln!("redis_cluster: {why}: stopping the nodes");
    drop(cluster);
}
