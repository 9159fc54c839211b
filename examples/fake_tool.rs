//! The integration tests' fake tool (`tests/support/fake_tool.rs`) as a process, for the scripts:
//! the benchmark uses its `/bench` route, the end-to-end scenario, the monitoring check and the
//! kind test its `/scenario/*` routes and `/echo` (for the `read_file` tool).
//!
//!     fake_tool [--listen ADDR] [--threads N] [--result-bytes N]
//!
//! `--listen` defaults to 127.0.0.1:0 (any free port). Once it listens it prints its base URL,
//! `http://ADDR`, as one line on stdout; it serves until SIGTERM or SIGINT, then exits 0.
//! `--threads` (default 1) sets the runtime's worker threads, so that on a small machine the tool
//! does not compete with the proxy under test for its cores. `--result-bytes` makes `/bench`
//! answer a document of that many bytes (more search items) instead of its usual ~1 KiB.

#[allow(dead_code)]
#[path = "../tests/support/fake_tool.rs"]
mod fake_tool;

use std::io::Write;
use std::net::SocketAddr;

use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: fake_tool [--listen ADDR] [--threads N] [--result-bytes N]";

fn main() {
    let mut listen: SocketAddr = "127.0.0.1:0".parse().expect("default address");
    let mut threads = 1usize;
    let mut result_bytes = None;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let value = args.next();
        match (arg.as_str(), value) {
            ("--listen", Some(v)) => {
                listen = v
                    .parse()
                    .unwrap_or_else(|e| fail(&format!("--listen {v}: {e}")))
            }
            ("--threads", Some(v)) => {
                threads = v
                    .parse()
                    .unwrap_or_else(|e| fail(&format!("--threads {v}: {e}")))
            }
            ("--result-bytes", Some(v)) => {
                result_bytes = Some(
                    v.parse()
                        .unwrap_or_else(|e| fail(&format!("--result-bytes {v}: {e}"))),
                )
            }
            _ => fail(&format!("unexpected argument {arg}")),
        }
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(async {
        let mut term = signal(SignalKind::terminate()).expect("SIGTERM handler");
        let mut int = signal(SignalKind::interrupt()).expect("SIGINT handler");
        let tool = fake_tool::FakeTool::start_sized(listen, result_bytes).await;
        println!("http://{}", tool.addr);
        std::io::stdout().flush().expect("flush stdout");
        eprintln!("fake_tool: serving on http://{}/", tool.addr);
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    });
}

fn fail(message: &str) -> ! {
    eprintln!("fake_tool: {message}\n{USAGE}");
    std::process::exit(64)
}
