//! A fast fake tool service for `bench/run.sh`: answers every request with the same ~1 KiB JSON
//! document, `{"results": [5 items]}`, so a benchmark measures the proxy in front of it and not
//! the tool.
//!
//!     cargo run --release --example bench_tool -- PORT [WORKER_THREADS]
//!
//! It binds 127.0.0.1:PORT. The request body is read in full and dropped. WORKER_THREADS
//! (default 1) keeps the tool from competing with the proxy under test for a small machine's cores.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::header::{CONTENT_TYPE, HeaderValue};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use serde_json::{Value, json};
use tokio::net::TcpListener;

/// The fixed answer: five search-like items, about 1 KiB of compact JSON.
fn document() -> Bytes {
    let items: Vec<Value> = (1..=5)
        .map(|i| {
            json!({
                "title": format!("Result {i}: toolgate benchmark document"),
                "url": format!("https://docs.example.test/bench/articles/{i:04}"),
                "snippet": format!(
                    "Item {i} of a fixed answer used to measure the proxy in front of the tool."
                ),
                "score": 1.0 / f64::from(i),
            })
        })
        .collect();
    let body = serde_json::to_vec(&json!({ "results": items })).expect("static JSON serializes");
    Bytes::from(body)
}

async fn answer(req: Request<Incoming>, body: Bytes) -> Result<Response<Full<Bytes>>, Infallible> {
    // Drain the request so keep-alive connections stay usable; its content does not matter.
    let _ = req.into_body().collect().await;
    let mut resp = Response::new(Full::new(body));
    resp.headers_mut()
        .insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
    Ok(resp)
}

fn main() {
    let mut args = std::env::args().skip(1);
    let usage = "usage: bench_tool PORT [WORKER_THREADS]";
    let port: u16 = args
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("{usage}"));
    let threads: usize = args
        .next()
        .map(|t| t.parse().unwrap_or_else(|_| panic!("{usage}")))
        .unwrap_or(1);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(threads.max(1))
        .enable_all()
        .build()
        .expect("tokio runtime");
    runtime.block_on(serve(SocketAddr::from(([127, 0, 0, 1], port))));
}

async fn serve(addr: SocketAddr) {
    let body = document();
    let listener = TcpListener::bind(addr)
        .await
        .unwrap_or_else(|e| panic!("cannot bind {addr}: {e}"));
    eprintln!(
        "bench_tool: {} bytes per answer on http://{addr}/",
        body.len()
    );
    loop {
        let (stream, _) = match listener.accept().await {
            Ok(conn) => conn,
            Err(e) => {
                eprintln!("bench_tool: accept failed: {e}");
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let body = body.clone();
        tokio::spawn(async move {
            let svc = service_fn(move |req| answer(req, body.clone()));
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), svc)
                .await;
        });
    }
}
